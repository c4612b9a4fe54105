"""The Quantization page through AppTest: calculator, the comparison run and its results."""

from __future__ import annotations

import json

import pytest

from engine.quant.study import QuantStudy
from ui.state import state_of

from .test_app import fresh

pytestmark = pytest.mark.real_model  # the app loads the default model


def _figures(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def test_calculator_reproduces_the_explainers_7b_table():
    at = fresh().run()
    at.switch_page("pages/quantization.py").run()
    assert not at.exception
    text = " ".join(m.value for m in at.markdown)
    assert "fp32 **28 GB**" in text and "fp16 **14 GB**" in text
    assert "int8 **7 GB**" in text and "int4 **3.5 GB**" in text
    assert "Q4_1 GGUF" in text  # the default model's origin is said
    calc = at.dataframe[1].value  # after the variants' storage table
    assert calc["model"].tolist()[0] == "7B parameters"
    assert calc["fp32 (GB)"].tolist()[0] == 28.0
    assert "Llama-2-7B" in calc["model"].tolist()
    at.number_input[0].set_value(70.0).run()
    assert "fp32 **280 GB**" in " ".join(m.value for m in at.markdown)
    names = [f["layout"].get("xaxis", {}).get("title", {}).get("text") for f in _figures(at)]
    assert "weights (GB = 10⁹ bytes)" in names


def test_the_comparison_runs_and_is_kept():
    at = fresh().run()
    at.switch_page("pages/quantization.py").run()
    at.multiselect[0].set_value(["fp32", "q4_0", "q3"])
    next(b for b in at.button if b.label == "Run the comparison").click()
    at.run(timeout=900)  # three variants × three prompts, on two shared cores
    assert not at.exception
    study = state_of(at.session_state).experiments.quant_study
    assert isinstance(study, QuantStudy)
    assert [v.name for v in study.variants] == ["fp32", "q4_0", "q3"]
    table = next(t.value for t in at.table if "ITL (ms)" in t.value.columns)  # an HTML table
    assert table["variant"].tolist() == ["fp32", "q4_0", "q3"]
    assert table["decoder"].tolist()[2].startswith("torch eager")  # q3: no native step
    grid = next(d.value for d in at.dataframe if "re-quantized to" in d.value.columns)
    assert grid["lossless"].tolist()[0] == "yes"  # Q4_1 on the file's own grid
    chart = next(f for f in _figures(at) if "Bytes, speed" in f["layout"].get("title", {}).get("text", ""))
    assert chart["data"][0]["x"] == ["fp32", "q4_0", "q3"]
    chips = " ".join(m.value for m in at.markdown if "ie-chips" in m.value)
    assert chips.count("<b>fp32</b>") == 3  # three prompts, fp32's answer to each


def test_hosted_offers_the_capped_variant_set(monkeypatch):
    from engine.quant.study import HOSTED_VARIANTS, default_plan

    at = fresh(monkeypatch, hosted=True).run()
    at.switch_page("pages/quantization.py").run()
    assert not at.exception
    assert at.multiselect[0].options == list(HOSTED_VARIANTS)
    assert at.multiselect[0].value == list(HOSTED_VARIANTS)
    plan = default_plan(True, 30)
    assert len(plan.prompts) == 1 and plan.new_tokens == 16 and plan.grid_layers == (0, 15, 29)


def test_the_drift_per_layer_is_measured_on_the_prompt_and_kept():
    from engine.quant.drift import DriftStudy

    at = fresh().run()
    at.switch_page("pages/quantization.py").run()
    drift = next(m for m in at.multiselect if m.label == "Weights variants to follow")
    drift.set_value(["q4_0"])
    next(b for b in at.button if b.label == "Measure the drift per layer").click()
    at.run(timeout=300)
    assert not at.exception
    study = state_of(at.session_state).experiments.quant_drift
    assert isinstance(study, DriftStudy) and [d.variant for d in study.variants] == ["q4_0"]
    assert study.source.startswith("the sample prompt")  # no run yet in this session
    text = " ".join(m.value for m in at.markdown)
    assert "What to notice:" in text and f"layer {study.variants[0].fastest[0]}" in text
    chart = next(f for f in _figures(at) if f["layout"].get("yaxis", {}).get("title", {}).get(
        "text") == "lens KL vs fp32 (nats)")
    assert chart["data"][0]["x"] == list(range(31)) and chart["data"][0]["name"] == "q4_0"
