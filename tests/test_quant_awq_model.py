"""AWQ-style scales on the real default model: against plain rounding at the same bits, on the
evaluation text (the Gettysburg Address; the scales were searched on another text)."""

from __future__ import annotations

import pytest
import torch

from engine.quant.awq import CALIBRATION_TEXT, apply_awq, cached_search
from engine.quant.formats import quantize
from engine.quant.quality import measure_quality
from engine.quant.scheme import FORMATS
from engine.quant.texts import DEFAULT_TEXT, read_text
from engine.quant.variants import decoder_linears

NAMES = ("q4_0", "awq_q4_0", "q3", "awq_q3")


@pytest.fixture(scope="module")
def results(lm):
    text = read_text()
    return {name: measure_quality(lm, name, text) for name in NAMES}


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
    for r in results.values():
        assert r.perplexity == pytest.approx(r.perplexity_transformers, rel=1e-4)


def test_the_search_chose_scales_and_every_group_gained(lm, results):
    for name in ("awq_q4_0", "awq_q3"):
        search = cached_search(lm, name)  # kept by the fixture's run: no second search
        assert search is not None and len(search.layers) == lm.spec.layers
        groups = [g for layer in search.layers for g in layer.values()]
        assert len(groups) == 4 * lm.spec.layers  # o_proj included: the tied GQA fold
        assert all(g.mse_awq <= g.mse_plain for g in groups)
        assert sum(g.alpha > 0 for g in groups) > len(groups) / 2


def test_requantizing_the_copy_is_lossless(lm, results):
    """The native step re-quantizes the copy with q4_0 itself: it must get the copy's values."""
    model, _ = apply_awq(lm, "awq_q4_0")
    last = lm.spec.layers - 1
    for n, m in decoder_linears(model):
        if n.startswith(("model.layers.0.", f"model.layers.{last}.")):
            assert torch.equal(quantize(m.weight, FORMATS["q4_0"]).dequantize(), m.weight), n
