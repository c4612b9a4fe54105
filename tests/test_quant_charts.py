"""The Quantization page's figures: asserted on their data and layout (no Streamlit, no model)."""

from __future__ import annotations

from charts.live import DELAYED_NAME, DELAYED_PATTERN, KV_COLOR, PREFILL_COLOR
from charts.quant import (
    ITL_COLORS,
    KL_COLOR,
    READ_COLOR,
    ROW_TITLES,
    STORED_COLOR,
    calculator_chart,
    overhead_chart,
    study_chart,
)
from charts.timing import COMPILED_COLOR, DECODE_COLOR, NATIVE_COLOR
from engine.quant.calculator import explainer_table, group_overhead, model_weights

from .test_quant_study import fake_study


def test_study_chart_three_panels_with_units_and_variant_names():
    study = fake_study()
    fig = study_chart(study)
    names = [v.name for v in study.variants]
    titles = [fig.layout[f"yaxis{'' if i == 1 else i}"].title.text for i in (1, 2, 3)]
    assert titles == list(ROW_TITLES) and all("(" in t for t in titles)  # a unit on every axis
    assert fig.layout.xaxis3.title.text == "weights variant"
    assert list(fig.layout.xaxis3.categoryarray) == names
    stored, read = fig.data[0], fig.data[1]
    assert list(stored.x) == names and stored.marker.color == STORED_COLOR
    assert list(stored.y) == [v.report.nbytes / 1e6 for v in study.variants]
    assert list(read.y) == [v.speed.bytes_per_step / 1e6 for v in study.variants]
    assert read.marker.color == READ_COLOR


def test_itl_bars_are_coloured_by_the_decoder_that_ran_them():
    study = fake_study()
    fig = study_chart(study)
    itl = {t.name: t for t in fig.data if t.name.startswith("ITL")}
    assert set(itl) == {"ITL, native", "ITL, torch eager"}
    # the kernel comparison's colours: native C plum, eager torch blue — one meaning each, and
    # neither is the prefill's red, the compiled step's purple or the KV cache's green
    assert ITL_COLORS == {"native": NATIVE_COLOR, "torch eager": DECODE_COLOR}
    assert len({NATIVE_COLOR, DECODE_COLOR, PREFILL_COLOR, COMPILED_COLOR, KV_COLOR}) == 5
    for decoder, color in ITL_COLORS.items():
        bars = itl[f"ITL, {decoder}"]
        assert bars.marker.color == color and bars.yaxis == "y2"
        assert list(bars.x) == [v.name for v in study.variants if v.speed.decoder == decoder]
    kl = fig.data[-1]
    assert kl.marker.color == KL_COLOR and kl.yaxis == "y3"
    # every panel leaves room above its tallest bar for the label: none is clipped
    assert fig.layout.yaxis2.range[1] > max(v.speed.itl_ms for v in study.variants)
    assert fig.layout.yaxis3.range[1] > max(v.kl_mean for v in study.variants)


def test_itl_measured_while_others_used_the_cpus_is_hatched():
    fig = study_chart(fake_study())  # q4_0 was timed while others used 60 % of the CPUs
    native = next(t for t in fig.data if t.name == "ITL, native")
    assert list(native.x) == ["fp32", "q4_0"]
    assert list(native.marker.pattern.shape) == ["", DELAYED_PATTERN]
    assert "60% of the CPUs" in native.customdata[1]
    assert native.marker.pattern.fillmode == "overlay"  # the bar keeps its colour under the hatch
    assert DELAYED_NAME in [t.name for t in fig.data]  # the legend says what hatching means


def test_an_all_zero_kl_panel_still_has_an_axis():
    study = fake_study(kl=0.0)
    assert study_chart(study).layout.yaxis3.range[1] > 0


def test_calculator_chart_shows_the_explainers_7b_table():
    models = [model_weights("7B", 7_000_000_000, formats=("fp32", "fp16", "int8"))]
    fig = calculator_chart(models)
    # every bar label readable: 12 px, never shrunk to the bar's thickness
    assert all(t.textfont.size >= 12 and t.constraintext == "none" for t in fig.data)
    assert [t.name for t in fig.data] == ["fp32", "fp16", "int8"]
    assert [t.x[0] for t in fig.data] == [28.0, 14.0, 7.0]
    assert [t.text[0] for t in fig.data] == ["28.0", "14.0", "7.00"]
    assert fig.layout.xaxis.title.text == "weights (GB = 10⁹ bytes)"
    assert fig.layout.xaxis.range[1] > 28.0
    assert [gb for _, gb in explainer_table(7e9)] == [28.0, 14.0, 7.0, 3.5]


def test_overhead_chart_bits_per_weight_per_group_size():
    fig = overhead_chart(group_overhead())
    scale, zero = fig.data
    assert list(scale.x) == [16, 32, 64, 128]
    assert list(scale.y) == [5.0, 4.5, 4.25, 4.125]
    assert list(zero.y) == [6.0, 5.0, 4.5, 4.25]
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.ticktext) == ["16", "32", "64", "128"]
    assert "bits per weight" in fig.layout.yaxis.title.text


def test_the_drift_chart_gives_each_variant_one_colour_in_both_panels():
    import numpy as np

    from charts.quant import drift_chart
    from engine.quant.drift import DriftStudy, LayerDrift

    kl = np.array([0.0, 0.1, 0.15, 0.6, 0.7])
    study = DriftStudy("m", "your prompt", 7, (
        LayerDrift("q4_0", np.linspace(1, 0.9, 5), kl), LayerDrift("q8_0", np.ones(5), kl / 50),
        LayerDrift("awq_q3", np.linspace(1, 0.8, 5), kl * 2)), 1.0)
    fig = drift_chart(study)
    assert fig.layout.yaxis.title.text == "lens KL vs fp32 (nats)"
    assert fig.layout.yaxis2.title.text == "residual cosine to fp32"
    assert fig.layout.xaxis2.title.text == "layer (0 = embeddings)"
    colours: dict[str, set] = {}
    for trace in fig.data:
        colours.setdefault(trace.legendgroup, set()).add(
            trace.line.color if trace.mode != "markers" else trace.marker.line.color)
    assert all(len(c) == 1 for c in colours.values()) and len(set.union(*colours.values())) == 3
    lines = [t for t in fig.data if t.yaxis == "y" and t.mode == "lines+markers"]
    assert [list(t.x) for t in lines] == [[0, 1, 2, 3, 4]] * 3
    rings = [t for t in fig.data if t.mode == "markers"]
    assert [(t.x[0], t.y[0]) for t in rings][0] == (3, 0.6)  # q4_0 grows most into layer 3
    assert sum(1 for t in fig.data if t.showlegend is not False) == 3  # one legend entry each
    lossless = DriftStudy("m", "p", 7, (LayerDrift("q4_1", np.ones(5), np.zeros(5)),), 1.0)
    assert not [t for t in drift_chart(lossless).data if t.mode == "markers"]  # no ring
