"""Where quantization error enters (engine/quant/drift.py), on the real default model: float32
against itself drifts nowhere, the last layer's lens KL is the quality table's KL on the same
text, and the residual streams the hooks read are transformers' own hidden states."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from engine.__main__ import main
from engine.quant.drift import (
    DriftStudy,
    LayerDrift,
    drift_from_dict,
    drift_to_dict,
    measure_drift,
    residual_streams,
)
from engine.quant.quality import measure_quality
from engine.quant.texts import text_ids

TEXT = ("The quick brown fox jumps over the lazy dog while the farmer counts his sheep "
        "and the sun sets slowly behind the hills.")


@pytest.fixture
def one_copy_per_variant(monkeypatch) -> Iterator[None]:
    """measure_quality and measure_drift of the same variant, in one test, get the one copy
    `apply_variant` made for the first of them (the same call on the same model: each copy of
    the real model costs seconds); both read it only."""
    import engine.quant.drift
    import engine.quant.quality

    real = engine.quant.quality.apply_variant
    made: dict[tuple[int, str], tuple] = {}

    def apply_variant(lm, name):
        key = (id(lm), name)
        if key not in made:
            made[key] = (lm, real(lm, name))  # lm kept: its id stays its own
        return made[key][1]

    monkeypatch.setattr(engine.quant.quality, "apply_variant", apply_variant)
    monkeypatch.setattr(engine.quant.drift, "apply_variant", apply_variant)
    yield
    made.clear()


def test_float32_against_itself_drifts_nowhere(lm):
    ids = text_ids(lm, TEXT)
    study = measure_drift(lm, ["fp32"], ids, "a test text")
    d = study.variants[0]
    assert len(d.kl) == lm.spec.layers + 1 and study.tokens == len(ids)
    np.testing.assert_allclose(d.cosine, 1.0, atol=1e-12)
    assert (d.kl == 0.0).all()


def test_the_last_layer_is_the_quality_tables_kl(lm, one_copy_per_variant):
    ids = text_ids(lm, TEXT)
    quality = measure_quality(lm, "q4_0", TEXT)
    study = measure_drift(lm, ["q4_0"], ids, "a test text", scored=slice(0, -1))
    d = study.variants[0]
    assert d.kl[-1] == pytest.approx(quality.kl_mean, rel=1e-4)
    assert d.kl[0] == pytest.approx(0.0, abs=1e-12)  # the embedding is Q8_0: lossless here
    assert d.kl[1:].min() > 0 and d.cosine[-1] < 1
    layer, growth = d.fastest
    assert growth == pytest.approx(np.diff(d.kl).max()) and d.kl[layer] - d.kl[layer - 1] == growth
    assert f"layer {layer}" in study.notice()


def test_the_hooks_read_transformers_own_hidden_states(lm):
    ids = text_ids(lm, TEXT)
    streams = residual_streams(lm.model, ids)  # (L + 1, S, H)
    with torch.inference_mode():
        out = lm.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    hidden = out.hidden_states  # its last entry has the final norm applied
    for layer in range(lm.spec.layers):
        torch.testing.assert_close(streams[layer], hidden[layer][0].float(), rtol=0, atol=0)
    torch.testing.assert_close(lm.model.model.norm(streams[-1]), hidden[-1][0].float())


def test_the_cli_adds_the_per_layer_drift(cli_uses_lm, one_copy_per_variant, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    assert main(["quality", "--weights", "fp16", "--text", str(text), "--per-layer"]) == 0
    found = json.loads(capsys.readouterr().out)  # fp16: a copy without quantizing (fast)
    per = found["per_layer"]
    assert per["layers"][-1] == 30 and per["variants"][0]["variant"] == "fp16"
    assert per["variants"][0]["kl"][-1] == pytest.approx(found["kl_mean"], rel=1e-4)
    assert drift_from_dict(per).variants[0].kl.tolist() == per["variants"][0]["kl"]


def test_a_file_entry_is_checked():
    good = drift_to_dict(DriftStudy("m", "s", 5, (LayerDrift("q4_0", np.ones(3),
                                                             np.array([0, .1, .3])),), 1.0))
    assert drift_from_dict(good).variants[0].fastest == (2, pytest.approx(0.2))
    bad = json.loads(json.dumps(good))
    bad["variants"][0]["kl"] = [0, "x", 1]
    for broken in (bad, {**good, "variants": []}, {**good, "tokens": -1}, [],
                   {**good, "variants": [{**good["variants"][0], "kl": [0.0] * 2}]}):
        with pytest.raises(ValueError):
            drift_from_dict(broken)


def test_a_trace_file_carries_it_and_a_damaged_one_is_refused():
    from engine.errors import TraceFormatError
    from engine.experiments import Experiments, experiments_from_dict

    study = DriftStudy("m", "s", 5, (LayerDrift("q4_0", np.ones(3), np.array([0, .1, .3])),), 1.0)
    data = json.loads(json.dumps(Experiments(quant_drift=study).to_dict()))
    back = experiments_from_dict(data).quant_drift
    assert back.variants[0].kl.tolist() == [0, .1, .3] and back.source == "s"
    data["quant_drift"]["variants"][0]["cosine"] = [1.0, float("nan")]
    with pytest.raises(TraceFormatError):
        experiments_from_dict(json.loads(json.dumps(data).replace("NaN", '"x"')))
