"""engine/lens/compare.py on the shipped example traces (no model): the first difference
against a plain loop, the numbers against `summarize` of each trace, the settings that differ,
the attention both traces recorded, and the settings of a re-run with one change."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import numpy as np
import pytest

from engine.files import load_trace
from engine.lens.attention_stats import full_attention
from engine.lens.compare import (
    attention_pair,
    first_difference,
    largest_difference,
    metric_rows,
    one_change,
    rerun_settings,
    same_input_rows,
    setting_rows,
    token_diff,
)
from engine.records.examples import examples
from engine.settings import GenerationSettings
from engine.timing.metrics import summarize


@pytest.fixture(scope="module")
def traces():
    return {e.name: load_trace(e.path) for e in examples()}


def plain_first_difference(a, b):
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i] != b[i]:
            return i
    return None


def test_first_difference_equals_a_plain_loop():
    rng = random.Random(0)
    cases = [((), ()), ((1,), ()), ((), (1,)), ((1, 2, 3), (1, 2, 3)), ((1, 2), (1, 2, 3)),
             ((1, 2, 3), (1, 2)), ((5, 2, 3), (1, 2, 3)), ((1, 2, 3), (1, 2, 4))]
    for _ in range(300):
        a = [rng.randrange(4) for _ in range(rng.randrange(8))]
        b = list(a) if rng.random() < 0.3 else [rng.randrange(4) for _ in range(rng.randrange(8))]
        cases.append((tuple(a), tuple(b)))
    for a, b in cases:
        assert first_difference(a, b) == plain_first_difference(a, b), (a, b)


def test_token_diff_of_every_pair_of_examples(traces):
    for a, b in itertools.permutations(traces.values(), 2):
        diff = token_diff(a, b)
        assert diff.prompt == plain_first_difference(a.prompt_token_ids, b.prompt_token_ids)
        assert diff.answer == plain_first_difference(a.output_token_ids, b.output_token_ids)
        assert diff.answer_lengths == (len(a.steps), len(b.steps))
        assert not diff.identical
    # the examples share the chat template's system prompt: they differ where the user text starts
    qa, story = traces["qa"], traces["story"]
    first = token_diff(qa, story).prompt
    assert 0 < first < len(qa.prompt_token_ids)
    assert qa.prompt_token_ids[:first] == story.prompt_token_ids[:first]
    same = token_diff(qa, qa)
    assert same.identical and same.prompt is None and same.answer is None


def test_a_run_that_is_a_prefix_of_the_other_differs_where_it_ends(traces):
    story = traces["story"]
    short = replace(story, steps=story.steps[:10])
    assert token_diff(story, short).answer == 10
    assert token_diff(short, story).answer == 10


def test_metrics_are_summarize_of_each_trace(traces):
    for a, b in itertools.permutations(traces.values(), 2):
        rows = {r.name: r for r in metric_rows(a, b)}
        for trace, side in ((a, "a"), (b, "b")):
            s = summarize(trace)
            assert getattr(rows["TTFT"], side) == s.ttft_ms
            assert getattr(rows["median ITL"], side) == s.itl_p50_ms
            assert getattr(rows["decode rate"], side) == s.decode_tokens_per_s
            assert getattr(rows["end to end"], side) == s.e2e_ms
            assert getattr(rows["KV cache at the end"], side) == trace.steps[-1].kv_bytes
            assert getattr(rows["prompt tokens"], side) == len(trace.prompt_token_ids)
            assert getattr(rows["answer tokens"], side) == len(trace.steps)
        ttft = rows["TTFT"]
        assert ttft.difference == pytest.approx(summarize(b).ttft_ms - summarize(a).ttft_ms)
        assert ttft.ratio == pytest.approx(summarize(b).ttft_ms / summarize(a).ttft_ms)
    # two different traces give different numbers: the rows are read from each trace
    rows = {r.name: r for r in metric_rows(traces["qa"], traces["story"])}
    assert rows["KV cache at the end"].a != rows["KV cache at the end"].b
    assert rows["answer tokens"].difference == 200 - len(traces["qa"].steps)


def test_settings_that_differ_between_a_greedy_and_a_sampled_example(traces):
    rows = setting_rows(traces["qa"], traces["sampled"])
    assert {r.name for r in rows if r.differs} == {
        "prompt", "temperature", "top-p", "seed", "max new tokens", "attention layers recorded"}
    by_name = {r.name: r for r in rows}
    assert by_name["temperature"].a == "0 (greedy)" and by_name["temperature"].b == "0.9"
    assert by_name["seed"].a.startswith("–") and by_name["seed"].b == "7"
    assert by_name["attention layers recorded"].a == "all 30"
    assert not any(r.differs for r in setting_rows(traces["qa"], traces["qa"]))


def test_attention_both_recorded(traces):
    qa, story, multi = traces["qa"], traces["story"], traces["multilingual"]
    pair = attention_pair(qa, story)
    assert pair.layers == (0, 15, 29) and pair.heads == qa.model.heads and pair.available
    assert "43 vs 46" in pair.note  # different prompts: each map has its own rows
    assert attention_pair(story, multi).layers == (0, 15, 29)
    assert attention_pair(qa, qa).note is None
    bare = replace(story, steps=tuple(replace(s, attention=None) for s in story.steps),
                   attention_layers=())
    pair = attention_pair(qa, bare)
    assert not pair.available and "run B" in pair.note and "run A" not in pair.note
    none_shared = replace(story, attention_layers=(1,), steps=tuple(
        replace(s, attention=s.attention[:1]) for s in story.steps))
    pair = attention_pair(multi, none_shared)
    assert not pair.available and "No layer" in pair.note


def test_largest_difference(traces):
    qa, story = traces["qa"], traces["story"]
    wa = full_attention(qa, 15)[3]
    assert largest_difference(wa, wa) == 0.0
    assert largest_difference(wa, full_attention(story, 15)[3]) is None  # different sizes
    changed = wa.copy()
    changed[5, 2] += 0.25
    assert largest_difference(wa, changed) == pytest.approx(0.25)
    assert np.isnan(wa).any()  # the causal mask is there, and ignored


def test_one_change_flips_only_that_setting(traces):
    settings = traces["sampled"].settings
    off = one_change(settings, "kv_cache")
    assert off.kv_cache is (not settings.kv_cache)
    assert replace(off, kv_cache=settings.kv_cache) == settings
    plain = one_change(settings, "chat_template")
    assert replace(plain, chat_template=settings.chat_template) == settings
    assert one_change(settings, "dtype") == settings == one_change(settings, "prompt")
    with pytest.raises(ValueError):
        one_change(settings, "temperature")


def test_rerun_settings_keep_the_seed_and_layers_within_the_limits(traces):
    story = traces["story"]
    rerun = rerun_settings(story, "kv_cache", max_new_tokens=64, max_prompt_tokens=256)
    assert rerun.max_new_tokens == 64 and rerun.max_prompt_tokens == 256
    assert rerun.seed == story.settings.seed and not rerun.kv_cache
    assert rerun.attention_layers == (0, 15, 29) and rerun.record_attention
    assert rerun_settings(story, "kv_cache", 256, 1024).max_new_tokens == 200
    assert rerun_settings(story, "prompt", 256, 1024).attention_layers is None  # budget decides


def test_rerun_settings_take_only_what_a_sidebar_could_set_from_a_file(traces):
    story = traces["story"]
    crafted = replace(story, settings=replace(
        story.settings, temperature=4.5, top_k=50_000, record_hidden=False, record_top_k=3,
        attention_budget_mb=1 << 20, seed=7))
    rerun = rerun_settings(crafted, "kv_cache", max_new_tokens=64, max_prompt_tokens=256)
    assert rerun.temperature == 2.0 and rerun.top_k == 1000 and rerun.seed == 7
    assert rerun.record_hidden and rerun.record_top_k == 10  # the app's own defaults
    assert rerun.attention_budget_mb == GenerationSettings().attention_budget_mb
    long = replace(story, prompt_token_ids=story.prompt_token_ids * 40)  # 1,840 tokens: too big
    assert rerun_settings(long, "kv_cache", 64, 4096).attention_layers is None  # budget decides


def test_same_input_rows_stop_where_the_runs_part(traces):
    qa, story = traces["qa"], traces["story"]
    assert same_input_rows(qa, qa) == len(qa.prompt_token_ids) + len(qa.steps) - 1
    parted = replace(qa, steps=qa.steps[:3] + tuple(replace(s, token_id=s.token_id + 1)
                                                    for s in qa.steps[3:]))
    assert same_input_rows(qa, parted) == len(qa.prompt_token_ids) + 3  # step 3's token differs
    first = next(i for i, (x, y) in enumerate(zip(qa.prompt_token_ids, story.prompt_token_ids))
                 if x != y)
    assert same_input_rows(qa, story) == first


def test_the_weights_and_decoder_rows_come_from_the_runs_own_record():
    from engine.lens.compare import setting_rows
    from engine.records.trace import DecoderUsed

    old = replace(load_trace(examples()[0].path), decoder=None)  # as before traces said it
    native = replace(old, decoder=DecoderUsed("native", None, "q4_0", 89_941_248))
    rows = {r.name: r for r in setting_rows(old, native)}
    assert (rows["weights"].a, rows["weights"].b) == (old.model.dtype, "q4_0")
    assert (rows["decode steps by"].a, rows["decode steps by"].b) == ("not recorded", "native C step")
    assert rows["decode steps by"].differs


def test_a_rerun_keeps_run_as_decoder_and_the_page_warns_when_they_differ():
    from engine.lens.compare import decoder_note
    from engine.records.trace import DecoderUsed

    old = replace(load_trace(examples()[0].path), decoder=None)  # as before traces said it
    native = replace(old, decoder=DecoderUsed("native", None, "fp32", 538_060_032))
    assert rerun_settings(old, "chat_template", 64, 512).decoder == "torch"
    assert rerun_settings(native, "chat_template", 64, 512).decoder == "native"
    torch_b = replace(old, decoder=DecoderUsed("torch", KV_OFF, "fp32", 538_060_032))
    note = decoder_note(native, torch_b)
    assert note and "native C step" in note and "torch eager" in note
    assert decoder_note(native, native) is None and decoder_note(old, native) is None


KV_OFF = "the KV cache is off: the native step decodes against its cache"
