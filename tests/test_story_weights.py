"""The story's "Weights in fewer bits" stage: the bytes one decode step reads in each format
(engine/lens/weights_notice.py) equal an independent count from the model's shapes, the line
follows the trace (its model spec, its decoder record, its ITL), the figure highlights the run's
own format, and the page and `python -m engine story` show the stage (shipped examples, no model)."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace

import pytest

from charts.story import OTHER_FORMAT_COLOR, RUN_COLOR, weights_step_chart
from engine.__main__ import main
from engine.files import load_trace
from engine.lens import weights_notice as wn
from engine.quant.calculator import llama_param_count
from engine.records.examples import EXAMPLES_DIR, examples
from engine.records.trace import DecoderUsed

from .test_story_page import TITLES, button, shows_stage, story

TRACES = {e.name: load_trace(e.path) for e in examples()}
QA, SAMPLED = TRACES["qa"], TRACES["sampled"]
STAGE = TITLES.index("Weights in fewer bits")


def shapes_count(spec, layer_bits: float, embedding_bits: float = 8.5) -> float:
    """Independent of weights_notice: the decoder layers' matrices from the Llama shapes (q, o:
    hidden × heads·head_dim; k, v: hidden × kv_heads·head_dim; gate, up, down: hidden ×
    intermediate), the embedding / LM head table, the norms in float32."""
    h, d = spec.hidden_size, spec.head_dim
    matrices = spec.layers * (2 * h * spec.heads * d + 2 * h * spec.kv_heads * d
                              + 3 * h * spec.intermediate_size)
    norms = h * (2 * spec.layers + 1)
    return matrices * layer_bits / 8 + spec.vocab_size * h * embedding_bits / 8 + norms * 4


def with_decoder(trace, name: str, weights: str, weight_bytes: int):
    reason = None if name == "native" else "asked for torch"
    return replace(trace, decoder=DecoderUsed(name, reason, weights, weight_bytes))


# ---------------------------------------------------------------- the bytes

def test_the_default_models_step_bytes_match_the_shapes():
    spec = QA.model
    assert spec.param_count == llama_param_count(
        spec.hidden_size, spec.intermediate_size, spec.layers, spec.heads, spec.kv_heads,
        spec.head_dim, spec.vocab_size, spec.tie_word_embeddings)
    fact = wn.weights_notice(QA)
    assert fact.formats == ("fp32", "fp16", "int8", "q4_0") and fact.weights == "fp32"
    fp32, fp16, int8, q4_0 = fact.formula_bytes
    assert fp32 == spec.param_count * 4 == 538_060_032  # what the prefill-vs-decode stage says
    assert fp16 == spec.param_count * 2
    assert int8 == pytest.approx(shapes_count(spec, 8 + 16 / spec.hidden_size))
    assert q4_0 == pytest.approx(shapes_count(spec, 4 + 16 / 32)) and round(q4_0) == 89_941_248
    assert "(fp32); stored as Q4_0 the same step would read 85.8 MiB, 6.0× less" in fact.text
    assert "Each decode step of this run read 513 MiB of weights" in fact.text


def test_another_model_spec_changes_the_numbers_and_an_untied_embedding_is_looked_up():
    spec = QA.model
    bigger = replace(spec, hidden_size=1024, intermediate_size=4096, heads=16, kv_heads=4,
                     head_dim=64, layers=16, vocab_size=32_000, tie_word_embeddings=False)
    bigger = replace(bigger, param_count=llama_param_count(1024, 4096, 16, 16, 4, 64, 32_000, False))
    fact = wn.weights_notice(replace(QA, model=bigger))
    unread = (32_000 - 1) * 1024  # the input table's rows a step does not look up
    assert fact.formula_bytes[0] == (bigger.param_count - unread) * 4
    assert fact.formula_bytes[3] == pytest.approx(shapes_count(bigger, 4.5) + 1024 * 8.5 / 8)
    assert fact.text != wn.weights_notice(QA).text
    assert f"{bigger.param_count - unread:,} weights a step reads" in wn.formula(bigger)


def test_an_older_float16_trace_is_counted_in_its_dtype():
    half = replace(QA, model=replace(QA.model, dtype="float16"), decoder=None)  # no record
    fact = wn.weights_notice(half)
    assert fact.weights == "fp16" and fact.read_bytes == QA.model.param_count * 2
    assert "257 MiB of weights (fp16)" in fact.text and "3.0× less" in fact.text


# ---------------------------------------------------------------- the decoder record and ITL

def test_a_native_record_uses_its_measured_bytes_and_its_itl():
    itl = statistics.median(s.latency_ms for s in SAMPLED.steps if s.phase == "decode")
    run = with_decoder(SAMPLED, "native", "q4_0", 91_000_000)
    fact = wn.weights_notice(run)
    assert fact.read_bytes == 91_000_000 and fact.other == "fp32"
    assert "The native C step ran this run's decode on Q4_0 weights" in fact.text
    assert "each step read 86.8 MiB of them (measured" in fact.text
    assert "the formula gives 85.8 MiB" in fact.text
    assert f"stored as fp32 the same step would read 513 MiB, {538_060_032 / 91e6:.1f}× more" in fact.text
    assert f"median ITL of {itl:.1f} ms" in fact.text
    assert f"{91e6 / itl / 1e6:.1f} GB/s" in fact.text
    other = wn.weights_notice(with_decoder(SAMPLED, "native", "q4_0", 95_000_000))
    assert other.text != fact.text and "90.6 MiB" in other.text


def test_a_native_fp32_record_compares_with_q4_0():
    fact = wn.weights_notice(with_decoder(QA, "native", "fp32", 540_000_000))
    assert "on fp32 weights: each step read 515 MiB" in fact.text
    assert f"85.8 MiB, {540e6 / 89_941_248:.1f}× less" in fact.text


def test_torch_on_an_integer_variant_read_the_float32_copy():
    fact = wn.weights_notice(with_decoder(QA, "torch", "q4_1", 96_000_000))
    assert fact.formats[-1] == "q4_1" and fact.read_bytes == fact.formula_bytes[0]
    assert "float32 copy" in fact.text and "Q4_1 codes themselves" in fact.text


def test_an_unknown_variant_says_so_and_a_prefill_only_run_has_no_itl():
    odd = wn.weights_notice(with_decoder(QA, "torch", "int5", 1))
    assert odd.formula_bytes[-1] == 0 and "cannot count" in odd.text
    short = wn.weights_notice(replace(QA.prefix(1), stop_reason="stopped"))
    assert "no decode step" in short.text and "ITL" not in short.text
    assert wn.label("awq_q4_0") == "AWQ Q4_0" and wn.label("int8") == "int8"


# ---------------------------------------------------------------- the figure

def test_the_chart_highlights_the_run_and_writes_the_measured_bytes_on_it():
    fig = weights_step_chart(["fp32", "fp16", "int8", "Q4_0"], [4 * 2**20, 2 * 2**20, 2**20, 0.5 * 2**20],
                             run=3, measured=0.6 * 2**20)
    (bar,) = fig.data
    assert list(bar.x) == ["fp32", "fp16", "int8", "Q4_0 — this run"]
    assert list(bar.y) == pytest.approx([4, 2, 1, 0.5])
    assert list(bar.marker.color) == [OTHER_FORMAT_COLOR] * 3 + [RUN_COLOR]
    assert list(bar.text) == ["4 MiB", "2 MiB", "1 MiB", "512 KiB<br>measured: 614 KiB"]
    assert fig.layout.yaxis.title.text == "weights read per step (MiB)"
    assert tuple(fig.layout.yaxis.range) == pytest.approx((0, 4.8))
    plain = weights_step_chart(["fp32", "Q4_0"], [4 * 2**20, 2**20], run=0)
    assert list(plain.data[0].text) == ["4 MiB", "1 MiB"]


def test_the_chart_leaves_out_an_uncounted_format_and_uses_gib_for_big_models():
    fig = weights_step_chart(["fp32", "fp16", "int5"], [28e9, 14e9, 0.0], run=0)
    assert list(fig.data[0].x) == ["fp32 — this run", "fp16"]
    assert fig.data[0].y[0] == pytest.approx(28e9 / 2**30)
    assert "(GiB)" in fig.layout.yaxis.title.text


# ---------------------------------------------------------------- the page and the CLI

def test_the_page_draws_the_stage_from_the_traces_decoder_record():
    trace = with_decoder(QA, "native", "q4_0", 91_000_000)
    at = story(trace)
    at.selectbox(key="story_stage").set_value(STAGE).run()
    shows_stage(at, trace, STAGE)
    assert button(at, "story_next").disabled  # the last stage
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert chart["data"][0]["x"] == ["fp32 · 32 bits", "fp16 · 16 bits", "int8 · 8.03 bits",
                                     "Q4_0 · 4.5 bits — this run"]
    assert chart["data"][0]["text"][-1] == "85.8 MiB<br>measured: 86.8 MiB"
    caption = " ".join(c.value for c in at.caption)
    assert "params × bits / 8" in caption and "106,168,320" in caption
    links = [link.proto.page for link in at.get("page_link")]
    assert "quantization" in links


def test_the_cli_story_prints_the_weights_line(capsys):
    assert main(["story", str(EXAMPLES_DIR / "qa.npz")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(TITLES)
    assert lines[-1] == f"{len(TITLES)}. Weights in fewer bits: {wn.weights_notice(QA).text}"
