"""Quality of the weight variants against float32 on the Gettysburg Address (real model)."""

from __future__ import annotations

import json

import pytest

import engine.loader
import engine.quant.quality
from engine.__main__ import main
from engine.quant import VARIANT_NAMES
from engine.quant.quality import measure_quality
from engine.quant.texts import read_text, text_ids


@pytest.fixture(scope="module")
def results(lm):
    text = read_text()
    # the AWQ variants have their own tests (tests/test_quant_awq_model.py)
    return {name: measure_quality(lm, name, text) for name in VARIANT_NAMES
            if not name.startswith("awq_")}


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
