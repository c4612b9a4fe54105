"""The generation loop on a tiny random model: streaming, stop, sampling, recording options."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine import GenerationSettings, InputError, Run, generate_trace

PROMPT = "Tell me about the sea."


def test_steps_stream_one_by_one(tiny_lm):
    run = Run(tiny_lm, PROMPT, GenerationSettings(max_new_tokens=5))
    seen = []
    for step in run:
        seen.append(step.index)
        assert len(run.trace().steps) == len(seen), "the trace grows as each step is yielded"
    assert seen == list(range(len(seen)))
    trace = run.trace()
    assert trace.steps[0].phase == "prefill"
    assert all(s.phase == "decode" for s in trace.steps[1:])
    assert trace.stop_reason in ("eos", "length")


def test_model_is_left_clean_between_and_after_steps(tiny_lm):
    run = Run(tiny_lm, PROMPT, GenerationSettings(max_new_tokens=10))
    for step in run:
        assert tiny_lm.model.config._attn_implementation == "sdpa"
        if step.index == 2:
            break  # abandoned mid-run, as when a browser session goes away
    assert tiny_lm.model.config._attn_implementation == "sdpa"
    assert not tiny_lm.model._forward_hooks and not tiny_lm.model._forward_pre_hooks


def test_stop_flag_keeps_partial_trace(tiny_lm):
    stop = threading.Event()
    run = Run(tiny_lm, PROMPT, GenerationSettings(max_new_tokens=50), stop_event=stop)
    for step in run:
        if step.index == 2:
            stop.set()
    trace = run.trace()
    assert len(trace.steps) == 3 and trace.stop_reason == "stopped"
    assert trace.output_token_ids == tuple(s.token_id for s in trace.steps)


def test_seeded_sampling_reproduces(tiny_lm):
    settings = GenerationSettings(max_new_tokens=12, temperature=1.0, top_k=50, top_p=0.95, seed=7)
    a = generate_trace(tiny_lm, PROMPT, settings)
    b = generate_trace(tiny_lm, PROMPT, settings)
    c = generate_trace(tiny_lm, PROMPT, GenerationSettings(max_new_tokens=12, temperature=1.0, seed=8))
    assert a.output_token_ids == b.output_token_ids
    assert a.output_token_ids != c.output_token_ids
    unseeded = generate_trace(tiny_lm, PROMPT, GenerationSettings(max_new_tokens=3, temperature=1.0))
    assert unseeded.settings.seed is not None, "a drawn seed is recorded for replay"


def test_sampled_token_rank_is_recorded(tiny_lm):
    trace = generate_trace(tiny_lm, PROMPT, GenerationSettings(max_new_tokens=20, temperature=2.0,
                                                               seed=1))
    for step in trace.steps:
        assert step.chosen_rank >= 0
        if step.chosen_rank < len(step.top_ids):
            assert step.top_ids[step.chosen_rank] == step.token_id
            assert step.top_probs[step.chosen_rank] == pytest.approx(step.chosen_prob, rel=1e-5)
    assert any(s.chosen_rank > 0 for s in trace.steps), "temperature 2 draws lower-ranked tokens"


def test_recording_options(tiny_lm):
    off = generate_trace(tiny_lm, PROMPT, GenerationSettings(max_new_tokens=3, record_attention=False,
                                                             record_hidden=False, record_top_k=3))
    assert all(s.attention is None and s.hidden is None for s in off.steps)
    assert off.attention_layers == () and off.steps[0].top_ids.shape == (3,)
    one = generate_trace(tiny_lm, PROMPT, GenerationSettings(max_new_tokens=3, attention_layers=(1,)))
    t = len(one.prompt_token_ids)
    assert one.attention_layers == (1,)
    assert one.steps[0].attention.shape == (1, 4, t, t)
    assert one.steps[1].attention.shape == (1, 4, 1, t + 1)
    assert one.steps[0].attention.dtype == np.float16
    assert one.steps[0].hidden.shape == (3, 64)


def test_cache_off_same_tokens_same_attention_rows(tiny_lm):
    on = generate_trace(tiny_lm, PROMPT, GenerationSettings(max_new_tokens=6))
    off = generate_trace(tiny_lm, PROMPT, GenerationSettings(max_new_tokens=6, kv_cache=False))
    assert on.output_token_ids == off.output_token_ids
    assert all(s.kv_bytes == 0 for s in off.steps)
    for a, b in zip(on.steps, off.steps):
        assert a.attention.shape == b.attention.shape
        np.testing.assert_allclose(a.attention.astype(np.float32), b.attention.astype(np.float32),
                                   atol=1e-3)


def test_timings_are_consistent(tiny_lm):
    trace = generate_trace(tiny_lm, PROMPT, GenerationSettings(max_new_tokens=4))
    assert trace.ttft_ms == pytest.approx(trace.tokenize_ms + trace.steps[0].latency_ms)
    assert trace.itl_ms == tuple(s.latency_ms for s in trace.steps[1:])
    assert all(s.latency_ms > 0 for s in trace.steps)
    times = trace.token_times_ms
    assert all(b > a for a, b in zip(times, times[1:]))


def test_chat_template_marks_special_tokens(tiny_lm):
    chat = generate_trace(tiny_lm, "Hi", GenerationSettings(max_new_tokens=1))
    raw = generate_trace(tiny_lm, "Hi", GenerationSettings(max_new_tokens=1, chat_template=False))
    assert any(chat.prompt_special) and len(chat.prompt_token_ids) > len(raw.prompt_token_ids)
    assert raw.prompt_token_ids == tuple(tiny_lm.tokenizer("Hi")["input_ids"])


@pytest.mark.parametrize("prompt, settings, message", [
    ("", {}, "empty"),
    ("   \n", {}, "empty"),
    ("word " * 300, {"max_prompt_tokens": 100}, "limit is 100"),
    ("Hi", {"max_new_tokens": 600}, "context"),
    ("Hi", {"attention_layers": (5,)}, "layers"),
])
def test_bad_prompts(tiny_lm, prompt, settings, message):
    with pytest.raises(InputError, match=message):
        Run(tiny_lm, prompt, GenerationSettings(**settings))


@pytest.mark.parametrize("kwargs", [
    {"max_new_tokens": 0}, {"max_new_tokens": 100_000}, {"temperature": -1}, {"top_p": 0},
    {"top_k": -2}, {"seed": -1}, {"record_top_k": 0},
])
def test_bad_settings(kwargs):
    with pytest.raises(InputError):
        GenerationSettings(**kwargs)


def test_long_prompt_attention_stays_within_budget(tiny_lm):
    from engine.attention import recorded_layers

    spec = tiny_lm.spec.__class__(**{**tiny_lm.spec.to_dict(), "layers": 30, "heads": 9,
                                     "kv_heads": 3})
    one = GenerationSettings(max_new_tokens=1)  # the prefill alone
    full = recorded_layers(spec, one, 256)
    assert full == tuple(range(30))  # 30 · 9 · 256² · 2 B = 35 MB fits 64 MB
    some = recorded_layers(spec, one, 512)  # 4.7 MB a layer: 14 fit
    assert len(some) == 14 and some[0] == 0 and some[-1] == 29
    assert len(some) * 9 * 512 * 512 * 2 <= 64 * 2**20
    assert recorded_layers(spec, GenerationSettings(attention_layers=(3,)), 512) == (3,)
    assert recorded_layers(spec, GenerationSettings(record_attention=False), 8) == ()


def test_the_budget_counts_every_decode_steps_rows_on_an_8b_shape(tiny_lm):
    """32 layers × 32 heads, a 300-token prompt and 256 new tokens: the prefill alone would fit
    all 32 layers in 256 MB, the decode rows would not: fewer layers are kept, and what they
    hold — summed step by step as the run records it — stays within the budget."""
    from engine.attention import attention_bytes, recorded_layers

    spec = tiny_lm.spec.__class__(**{**tiny_lm.spec.to_dict(), "layers": 32, "heads": 32,
                                     "kv_heads": 8})
    settings = GenerationSettings(max_new_tokens=256, attention_budget_mb=256)
    layers = recorded_layers(spec, settings, 300)
    assert 32 * 32 * 300 * 300 * 2 <= 256 * 2**20 and len(layers) < 32
    per_layer = 32 * 2 * (300 * 300 + sum(300 + i for i in range(1, 256)))
    assert attention_bytes(32, 300, 256) == per_layer
    assert len(layers) * per_layer <= 256 * 2**20 < (len(layers) + 1) * per_layer
    assert layers[0] == 0 and layers[-1] == 31


def test_a_long_prompt_records_one_layer_on_a_small_budget(tiny_lm):
    trace = generate_trace(tiny_lm, "word " * 400, GenerationSettings(max_new_tokens=2,
                                                                      attention_budget_mb=1))
    t = len(trace.prompt_token_ids)
    assert trace.attention_layers == (0,) and trace.steps[0].attention.shape == (1, 4, t, t)
