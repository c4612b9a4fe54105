"""Quality of the weight variants against float32 on the Gettysburg Address (real model), and
the AWQ-style scales against plain rounding at the same bits (the scales were searched on another
text). One module, one measurement of each variant: the AWQ tests compare with the plain ones."""

from __future__ import annotations

import json

import pytest
import torch

import engine.loader
import engine.quant.quality
from engine.__main__ import main
from engine.quant import VARIANT_NAMES
from engine.quant.awq import CALIBRATION_TEXT, cached_search
from engine.quant.formats import quantize
from engine.quant.quality import measure_quality, reference_log_probs
from engine.quant.scheme import FORMATS
from engine.quant.texts import DEFAULT_TEXT, read_text, text_ids
from engine.quant.variants import decoder_linears


@pytest.fixture(scope="module")
def measured(lm) -> tuple[dict, dict]:
    """The results, and the awq_q4_0 copy measure_quality measured (apply_variant's, kept for
    the re-quantization check rather than folded again: seconds on the real model)."""
    text = read_text()
    reference = reference_log_probs(lm, text_ids(lm, text))  # one float32 forward for all
    real, kept = engine.quant.quality.apply_variant, {}

    def apply_variant(model, name):
        made = real(model, name)
        if model is lm and name == "awq_q4_0":
            kept[name] = made[0]
        return made

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine.quant.quality, "apply_variant", apply_variant)
        # q4_k_m stands for the K-quant mixes (q4_k and q6_k: docs/quantization.md's numbers)
        results = {name: measure_quality(lm, name, text, reference) for name in VARIANT_NAMES
                   if name not in ("q4_k", "q6_k")}
    return results, kept


@pytest.fixture(scope="module")
def results(measured) -> dict:
    return measured[0]


def test_the_text_is_short_and_shipped(lm):
    ids = text_ids(lm, read_text())
    assert 250 <= len(ids) <= 400
    assert read_text().startswith("Four score and seven years ago")


def test_perplexity_two_ways_agree(results):
    for name, r in results.items():
        assert r.perplexity == pytest.approx(r.perplexity_transformers, rel=1e-4), name
        assert r.perplexity_fp32 == results["fp32"].perplexity


def test_the_fp32_variant_is_the_reference(results):
    r = results["fp32"]
    assert r.kl_mean == 0.0 and r.top1_agreement == 1.0


def test_fp16_is_nearly_free_and_2_bits_is_not(results):
    assert results["fp16"].kl_mean < 1e-3 and results["fp16"].top1_agreement >= 0.97
    assert results["q2"].kl_mean > 3 * results["q4_0"].kl_mean
    assert results["q2"].perplexity > 1.5 * results["fp32"].perplexity


def test_q4_1_on_the_files_own_grid_costs_nothing(results):
    """The loaded weights came from a Q4_1 file: re-quantizing them to Q4_1 (groups of 32) gives
    the same weights back (engine/quant/gguf_grid.py), so the same logits, bit for bit."""
    r = results["q4_1"]
    assert r.kl_mean == 0.0 and r.top1_agreement == 1.0
    assert r.perplexity == results["fp32"].perplexity


def test_kl_grows_as_bits_fall(results):
    """On any other grid the already-rounded weights are rounded again: KL grows as bits fall."""
    kl = {name: r.kl_mean for name, r in results.items()}
    assert 0 < kl["fp16"] < kl["bf16"] < kl["int8"] < kl["q4_0"] < kl["q3"] < kl["q2"]
    top1 = {name: r.top1_agreement for name, r in results.items()}
    assert top1["fp16"] >= top1["int8"] >= top1["q4_0"] >= top1["q3"] >= top1["q2"]


def test_llama_cpps_q4_k_m_sits_between_q8_0_and_q4_0(results):
    """On this model q4_k_m is mostly Q5_0 (576-column rows cannot hold Q4_K's 256-blocks),
    with Q6_K / Q8_0 on a third of v_proj and down_proj: between Q8_0 and Q4_0 in KL and bytes."""
    kl = {name: r.kl_mean for name, r in results.items()}
    assert kl["q8_0"] < kl["q4_k_m"] < kl["q4_0"]
    size = {name: r.report.nbytes for name, r in results.items()}
    assert size["q8_0"] > size["q4_k_m"] > size["q4_0"]


def test_bytes_fall_with_bits(results):
    b = [results[n].report.nbytes for n in ("fp32", "fp16", "int8", "q4_1", "q4_0", "q3", "q2")]
    assert b == sorted(b, reverse=True) and len(set(b)) == len(b)
    assert all(r.report.nbytes == r.report.formula_bytes for r in results.values())


def test_cli_prints_the_json(lm, results, monkeypatch, capsys):
    monkeypatch.setattr(engine.loader, "load_model", lambda *a, **k: lm)
    measure = engine.quant.quality.measure_quality  # the module's results: the same measurement

    def measured(model, name, text=None):
        known = model is lm and text == read_text() and name in results
        return results[name] if known else measure(model, name, text)

    monkeypatch.setattr(engine.quant.quality, "measure_quality", measured)
    assert main(["quality", "--weights", "q3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"weights", "bytes", "formula_bytes", "perplexity", "perplexity_fp32", "kl_mean",
            "top1_agreement", "tokens"} <= set(doc)
    assert doc["weights"] == "q3" and doc["bytes"] == doc["formula_bytes"]
    assert doc["tokens"] == len(text_ids(lm, read_text()))
    assert 0 < doc["kl_mean"] and 0 < doc["top1_agreement"] <= 1


def test_calibration_and_evaluation_texts_differ(lm):
    assert CALIBRATION_TEXT != DEFAULT_TEXT
    calibration = read_text(CALIBRATION_TEXT)
    assert calibration.startswith("When in the Course of human events")
    assert 300 <= len(lm.tokenizer(calibration)["input_ids"]) <= 600


def test_awq_beats_plain_rounding_at_3_bits(results):
    plain, aware = results["q3"], results["awq_q3"]
    assert aware.kl_mean < plain.kl_mean
    assert aware.perplexity < plain.perplexity
    assert aware.report.nbytes == plain.report.nbytes  # same bits, same bytes


def test_awq_is_no_worse_than_plain_rounding_at_4_bits(results):
    plain, aware = results["q4_0"], results["awq_q4_0"]
    assert aware.kl_mean <= plain.kl_mean
    assert aware.report.nbytes == plain.report.nbytes


def test_the_search_chose_scales_and_every_group_gained(lm, results):
    for name in ("awq_q4_0", "awq_q3"):
        search = cached_search(lm, name)  # kept by the fixture's run: no second search
        assert search is not None and len(search.layers) == lm.spec.layers
        groups = [g for layer in search.layers for g in layer.values()]
        assert len(groups) == 4 * lm.spec.layers  # o_proj included: the tied GQA fold
        assert all(g.mse_awq <= g.mse_plain for g in groups)
        assert sum(g.alpha > 0 for g in groups) > len(groups) / 2


def test_requantizing_the_copy_is_lossless(lm, measured):
    """The native step re-quantizes the copy with q4_0 itself: it must get the copy's values."""
    model = measured[1].pop("awq_q4_0")  # apply_awq's copy, as apply_variant returned it
    last = lm.spec.layers - 1
    for n, m in decoder_linears(model):
        if n.startswith(("model.layers.0.", f"model.layers.{last}.")):
            assert torch.equal(quantize(m.weight, FORMATS["q4_0"]).dequantize(), m.weight), n
