"""The story's "what to notice" lines (engine/lens/notice.py) and its own figures (charts/story.py):
every number equals an independent computation from the trace's arrays and model spec, and the
text changes with the trace (two shipped example traces, no model needed)."""

from __future__ import annotations

import statistics
from dataclasses import replace

import numpy as np
import pytest

from charts.live import PREFILL_COLOR
from charts.story import layer_split_chart, next_token_chart, residual_norm_chart
from engine.files import load_trace
from engine.lens import cost_notice, notice, weights_notice, wording
from engine.lens.tokens import piece_bytes
from engine.records.examples import examples

TRACES = {e.name: load_trace(e.path) for e in examples()}
QA, STORY, MULTI, SAMPLED = (TRACES[n] for n in ("qa", "story", "multilingual", "sampled"))
NOTICES = [notice.tokens_notice, notice.embeddings_notice, notice.attention_notice,
           notice.sampling_notice, cost_notice.phase_notice, cost_notice.kv_notice,
           weights_notice.weights_notice]


@pytest.mark.parametrize("compute", NOTICES, ids=lambda f: f.__name__)
def test_the_text_changes_with_the_trace(compute):
    texts = {name: compute(trace).text for name, trace in TRACES.items()}
    assert texts["qa"] != texts["sampled"]


def test_sizes_and_probabilities_never_use_an_exponent():
    assert wording.size(1048000) == "1023 KiB" and wording.size(538_060_032) == "513 MiB"
    assert wording.size(1023.9 * 2**20) == "1024 MiB" and wording.size(2**30) == "1 GiB"
    assert wording.size(1536) == "1.5 KiB" and wording.size(12) == "12 B"
    assert wording.probability(0.62) == "0.62" and wording.probability(0.00043) == "0.00043"
    assert wording.probability(1.2e-5) == "0.000012" and wording.probability(0.0) == "0.00"


def without_attention(trace):
    return replace(trace, attention_layers=(),
                   steps=tuple(replace(s, attention=None) for s in trace.steps))


def with_hidden(trace, seed: int):
    """The trace with made-up hidden states (layers + 1, hidden) on its prefill step."""
    spec = trace.model
    hidden = np.random.default_rng(seed).normal(size=(spec.layers + 1, spec.hidden_size))
    hidden *= np.linspace(0.5, 3.0, spec.layers + 1)[:, None]
    return replace(trace, steps=(replace(trace.steps[0], hidden=hidden.astype(np.float32)),
                                 *trace.steps[1:]))


# ---------------------------------------------------------------- text → tokens

def test_tokens_counts_and_the_most_split_word():
    multi = notice.tokens_notice(MULTI)
    assert (multi.characters, multi.tokens, multi.special) == (
        len(MULTI.prompt), len(MULTI.prompt_token_ids), sum(MULTI.prompt_special))
    assert multi.word.text == "おはよう" and multi.typed
    assert len(multi.word.pieces) == 8  # 4 characters, 3 bytes each, cut into byte pieces
    assert f"became {len(MULTI.prompt_token_ids)} tokens" in multi.text
    assert "“\u2068おはよう\u2069”, became 8" in multi.text and "raw UTF-8 bytes" in multi.text


@pytest.mark.parametrize("name", ["qa", "multilingual", "sampled"])
def test_the_words_pieces_are_exactly_the_tokens_holding_its_bytes(name):
    """Independent of the word finder: the pieces' bytes, joined, contain the word's UTF-8 bytes,
    and dropping the first or the last piece loses part of it."""
    trace = TRACES[name]
    word = notice.tokens_notice(trace).word
    raws = [piece_bytes(p) for p, s in zip(trace.prompt_pieces, trace.prompt_special) if not s]
    target = word.text.encode()
    k = len(word.pieces)
    runs = [i for i in range(len(raws) - k + 1) if target in b"".join(raws[i:i + k])]
    assert runs, word
    i = runs[0]
    assert target not in b"".join(raws[i + 1:i + k]) and target not in b"".join(raws[i:i + k - 1])


def test_a_prompt_of_single_token_words_names_the_templates_split_word():
    qa = notice.tokens_notice(QA)
    assert not qa.typed and qa.word.text == "SmolLM" and qa.word.pieces == ("Sm", "ol", "LM")
    assert "Every word you typed is a single token" in qa.text
    sampled = notice.tokens_notice(SAMPLED)
    assert sampled.typed and sampled.word.pieces == ("In", "vent")


# ---------------------------------------------------------------- embeddings and RoPE

@pytest.mark.parametrize("name", ["qa", "story"])
def test_embeddings_numbers(name):
    trace = TRACES[name]
    spec, fact = trace.model, notice.embeddings_notice(trace)
    # the KV cache's last position: the last step's attention row covers keys 0 … last
    last = trace.steps[-1].attention.shape[-1] - 1
    assert last == len(trace.prompt_token_ids) + len(trace.steps) - 2  # the last token is not read
    assert fact.last_position == last
    assert fact.fastest_rad == pytest.approx(last)  # pair 0 turns 1 rad per position
    assert fact.slowest_rad == pytest.approx(last * spec.rope_theta ** (-(spec.head_dim - 2) / spec.head_dim))
    assert fact.share == pytest.approx(spec.vocab_size * spec.hidden_size / spec.param_count)
    assert f"at the last position, {last}, pair 0 has turned {last:,} rad" in fact.text


# ---------------------------------------------------------------- attention

def first_and_previous(trace):
    """Per (recorded layer, head): mean prefill weight on the first and on the previous token."""
    a = trace.steps[0].attention.astype(np.float64)  # (L_rec, H, T, T)
    t = a.shape[-1]
    first = a[..., 0].mean(-1)
    previous = a[..., np.arange(1, t), np.arange(t - 1)].mean(-1)
    return first, previous


@pytest.mark.parametrize("name", ["qa", "story", "sampled"])
def test_the_sink_and_previous_token_heads_match_numpy(name):
    trace = TRACES[name]
    fact = notice.attention_notice(trace)
    first, previous = first_and_previous(trace)
    li, h = np.unravel_index(np.argmax(first), first.shape)
    assert (fact.layer, fact.head) == (trace.attention_layers[li], h)
    assert fact.first_share == pytest.approx(first[li, h], abs=1e-6)
    pi, ph = np.unravel_index(np.argmax(previous), previous.shape)
    assert (fact.previous_layer, fact.previous_head) == (trace.attention_layers[pi], ph)
    assert fact.previous_share == pytest.approx(previous[pi, ph], abs=1e-6)
    assert (f"Head {h} of layer {trace.attention_layers[li]} puts {first[li, h]:.0%} of its "
            "weight on the first token") in fact.text


def test_a_trace_without_attention_says_so():
    fact = notice.attention_notice(without_attention(QA))
    assert not fact.recorded and "recorded without attention" in fact.text


# ---------------------------------------------------------------- FFN and the residual stream

def test_the_layer_split_equals_the_llama_layer_formula():
    spec = QA.model
    fact = notice.ffn_notice(QA)
    q_o = 2 * spec.hidden_size * spec.heads * spec.head_dim
    k_v = 2 * spec.hidden_size * spec.kv_heads * spec.head_dim
    gated_ffn = 3 * spec.hidden_size * spec.intermediate_size  # gate, up, down
    assert fact.attention_params == q_o + k_v
    assert fact.ffn_params == pytest.approx(gated_ffn + 2 * spec.hidden_size)  # + two RMSNorms
    assert f"holds {fact.ffn_params / fact.layer_params:.0%}" in fact.text
    assert fact.norms is None and "no hidden states" in fact.text


def test_residual_norms_come_from_the_hidden_states():
    a, b = with_hidden(QA, 0), with_hidden(QA, 1)
    norms = np.linalg.norm(a.steps[0].hidden.astype(np.float64), axis=-1)
    fact = notice.ffn_notice(a)
    assert fact.norms == pytest.approx(norms)
    assert len(fact.norms) == a.model.layers + 1  # the embedding, then every layer: 30 of 30
    last = a.model.layers - 1
    assert f"from {norms[0]:.2f} after the embedding to {norms[-1]:.2f} after layer {last}" in fact.text
    fig = residual_norm_chart(fact.norms)
    assert list(fig.data[0].x)[-1] == f"layer {last}" and len(fig.data[0].x) == a.model.layers + 1
    assert fact.text != notice.ffn_notice(b).text


# ---------------------------------------------------------------- next token and sampling

def test_greedy_names_the_least_sure_step():
    fact = notice.sampling_notice(QA)
    probs = [s.chosen_prob for s in QA.steps]
    k = int(np.argmin(probs))
    assert fact.greedy and fact.off_top == 0 and fact.step == k
    assert f"least sure at step {k}" in fact.text and f"p = {probs[k]:.2f}" in fact.text


def test_sampling_counts_tokens_off_the_top_and_names_the_lowest_ranked():
    fact = notice.sampling_notice(SAMPLED)
    ranks = [s.chosen_rank for s in SAMPLED.steps]
    off = sum(r > 0 for r in ranks)
    worst = int(np.argmax(ranks))
    assert (fact.off_top, fact.step, fact.rank) == (off, worst, ranks[worst] + 1)
    assert f"{off} of {len(ranks)} tokens were not the model's first choice" in fact.text
    assert f"rank-{ranks[worst] + 1} candidate" in fact.text


def test_next_token_chart_adds_a_chosen_token_outside_the_top_k():
    step = notice.sampling_step(SAMPLED)
    assert step.token_id not in step.top_ids
    bar = next_token_chart(step).data[0]
    assert len(bar.y) == len(step.top_ids) + 1
    assert bar.y[-1].startswith(f"{step.chosen_rank + 1}. ")
    assert bar.x[-1] == pytest.approx(step.chosen_prob) and bar.marker.color[-1] == PREFILL_COLOR
    inside = notice.sampling_step(QA)  # greedy: the chosen token is the top one, already there
    assert len(next_token_chart(inside).data[0].y) == len(inside.top_ids)


# ---------------------------------------------------------------- prefill vs decode

@pytest.mark.parametrize("name", ["qa", "story"])
def test_phase_numbers(name):
    trace = TRACES[name]
    spec, fact = trace.model, cost_notice.phase_notice(trace)
    decode = [s for s in trace.steps if s.phase == "decode"]
    middle = decode[len(decode) // 2]
    assert fact.ttft_ms == pytest.approx(trace.tokenize_ms + trace.steps[0].latency_ms)
    assert fact.itl_median_ms == pytest.approx(statistics.median(s.latency_ms for s in decode))
    assert fact.weight_bytes == spec.param_count * 4 == 538_060_032  # tied, float32
    assert fact.kv_read == 2 * 30 * 3 * 64 * 4 * middle.context_len
    assert (f"Decode step {middle.index} read 513 MiB of weights ({spec.param_count:,} "
            "parameters × 4 B)") in fact.text
    assert f"TTFT {fact.ttft_ms:.1f} ms" in fact.text


# ---------------------------------------------------------------- the KV cache

@pytest.mark.parametrize("name", ["qa", "story"])
def test_kv_bytes_formula_equals_the_measured_bytes(name):
    trace = TRACES[name]
    fact = cost_notice.kv_notice(trace)
    tokens = len(trace.prompt_token_ids) + len(trace.steps) - 1
    assert fact.tokens == tokens
    assert fact.formula_bytes == 2 * 30 * 3 * 64 * 4 * tokens == trace.steps[-1].kv_bytes
    assert f"4 B · {tokens} tokens = {fact.formula_bytes:,} B" in fact.text
    assert "the same as the tensors' measured nbytes" in fact.text


def test_a_run_without_the_cache_says_so():
    off = replace(QA, settings=replace(QA.settings, kv_cache=False))
    assert "KV cache off" in cost_notice.kv_notice(off).text


# ---------------------------------------------------------------- the story's own figures

def test_layer_split_chart_stacks_the_two_parts_to_the_layer():
    fig = layer_split_chart(884_736, 2_655_360)
    assert [b.x[0] for b in fig.data] == pytest.approx([0.884736, 2.65536])
    assert fig.layout.barmode == "stack"
    assert tuple(fig.layout.xaxis.range) == pytest.approx((0, 3.540096))
    assert "millions" in fig.layout.xaxis.title.text
    assert "25%" in fig.data[0].text[0] and "75%" in fig.data[1].text[0]


def test_residual_norm_chart_labels_the_embedding_then_each_layer():
    fig = residual_norm_chart([1.0, 2.0, 4.0])
    assert list(fig.data[0].x) == ["embedding", "layer 0", "layer 1"]
    assert list(fig.data[0].y) == [1.0, 2.0, 4.0]
    assert "‖x‖" in fig.layout.yaxis.title.text and fig.layout.yaxis.rangemode == "tozero"
