"""charts/present.py: the projector theme, on the app's real figures built from example traces."""

from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
import pytest

from charts import step_chart, topk_chart
from charts.attention import HEAD_COLORS, decode_steps_chart, head_view, heatmap, model_view, sequence_labels
from charts.embeddings import GROUP_STYLE, embedding_map, language_bars, rope_angle_chart
from charts.kvcache import ATTENTION_COLORS, VARIANT_COLORS, live_memory_chart, on_off_chart, per_token_bars
from charts.live import DECODE_COLOR, KV_COLOR, PREFILL_COLOR, empty_step_chart
from charts.present import MIN_FONT, PROJECTOR, presentation, projector_color
from charts.timing import COMPILED_COLOR, NATIVE_COLOR, timeline_chart
from engine.files import read_trace_file
from engine.lens.attention_stats import full_attention
from engine.records.examples import examples

TRACES = {e.name: read_trace_file(e.path).trace for e in examples() if e.name in ("qa", "sampled")}


def figures(trace) -> dict[str, go.Figure]:
    layer = trace.attention_layers[0]
    weights = full_attention(trace, layer)
    labels = sequence_labels(trace)
    t = len(trace.prompt_token_ids)
    rng = np.random.default_rng(0)
    return {
        "steps": step_chart(trace), "empty steps": empty_step_chart(), "top-k": topk_chart(trace.steps[1]),
        "timeline": timeline_chart(trace), "kv growth": live_memory_chart(trace),
        "on/off": on_off_chart(np.array([30.0, 31, 29]), np.array([30.0, 60, 90])),
        "per token": per_token_bars(["a/b", "c/d"], ["GQA", "MHA"], [1000.0, 4000.0]),
        "heatmap": heatmap(weights[0, :t, :t], labels[:t], f"layer {layer}, head 0"),
        "head view": head_view(weights, labels, [0, 1, 2], len(labels) - 1),
        "model view": model_view(trace.steps[0].attention, trace.attention_layers, 8),
        "decode steps": decode_steps_chart(weights, labels, t, [s.piece for s in trace.steps[1:]]),
        "languages": language_bars(["English", "Hindi"], [10, 30], [1.0, 3.0]),
        "rope": rope_angle_chart(rng.random((16, 8)), np.arange(16)),
        "embedding map": embedding_map({"prompt token": (rng.random((5, 2)), list("abcde")),
                                        "vocabulary sample": (rng.random((20, 2)), [""] * 20)}),
    }


CASES = [(name, kind) for name in TRACES for kind in figures(TRACES[name])]


@pytest.fixture(scope="module")
def built():
    return {name: figures(trace) for name, trace in TRACES.items()}


def font_sizes(node, path="") -> list[tuple[str, float]]:
    """Every explicit font size anywhere in a figure's JSON (layout, traces, frames)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}.{key}"
            if "font" in key and isinstance(value, dict) and value.get("size") is not None:
                found.append((here, float(value["size"])))
            found += font_sizes(value, here)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            found += font_sizes(value, f"{path}[{i}]")
    return found


@pytest.mark.parametrize("trace_name,kind", CASES)
def test_every_font_is_at_least_16px(built, trace_name, kind):
    fig = presentation(built[trace_name][kind])
    layout = fig.layout
    must = {"layout.font": layout.font.size, "title": layout.title.font.size,
            "legend": layout.legend.font.size, "hover": layout.hoverlabel.font.size}
    fig.for_each_xaxis(lambda a, must=must: must.update({
        f"{a.plotly_name} ticks": a.tickfont.size, f"{a.plotly_name} title": a.title.font.size}))
    fig.for_each_yaxis(lambda a, must=must: must.update({
        f"{a.plotly_name} ticks": a.tickfont.size, f"{a.plotly_name} title": a.title.font.size}))
    for i, note in enumerate(layout.annotations):
        must[f"annotation {i}"] = note.font.size
    for i, trace in enumerate(fig.data):
        if trace.type == "heatmap":
            must[f"trace {i} colorbar ticks"] = trace.colorbar.tickfont.size
            must[f"trace {i} colorbar title"] = trace.colorbar.title.font.size
        if trace.text is not None and "textfont" in trace:
            must[f"trace {i} text"] = trace.textfont.size
    for slider in layout.sliders:
        must["slider"], must["slider value"] = slider.font.size, slider.currentvalue.font.size
    for menu in layout.updatemenus:
        must["buttons"] = menu.font.size
    small = {k: v for k, v in must.items() if v is None or v < MIN_FONT}
    assert not small, small
    small = [(p, s) for p, s in font_sizes(fig.to_plotly_json()) if s < MIN_FONT]
    assert not small, small
    assert layout.uniformtext.minsize >= MIN_FONT  # text inside bars is never shrunk below it


@pytest.mark.parametrize("trace_name,kind", CASES)
def test_lines_are_thicker_markers_larger_and_the_original_unchanged(built, trace_name, kind):
    original = built[trace_name][kind]
    before = json.loads(original.to_json())  # the content: plotly's key order in the text
    fig = presentation(original)             # changes when a trace's axes are first read
    assert json.loads(original.to_json()) == before, "presentation() must not modify the figure it is given"
    for old, new in zip(original.data, fig.data):
        if old.type == "scatter" and "lines" in (old.mode or "lines"):
            assert new.line.width > (old.line.width or 2) and new.line.width >= 3
        if old.type == "scatter" and "markers" in (old.mode or "") and old.marker.size is not None:
            assert np.all(np.asarray(new.marker.size) > np.asarray(old.marker.size))
    for axis in [*fig.select_xaxes(), *fig.select_yaxes()]:
        assert axis.automargin and axis.title.standoff >= 10  # titles clear the larger tick labels
    if original.layout.height:
        assert fig.layout.height > original.layout.height


def test_semantic_colours_map_one_to_one_to_high_contrast_ones():
    def contrast(hex_colour: str) -> float:  # WCAG contrast ratio against white
        rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 1.05 / (0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2] + 0.05)

    assert len(set(PROJECTOR.values())) == len(PROJECTOR), "two meanings would share a colour"
    semantic = {PREFILL_COLOR, DECODE_COLOR, KV_COLOR, COMPILED_COLOR, NATIVE_COLOR, *HEAD_COLORS,
                *ATTENTION_COLORS.values(), *VARIANT_COLORS.values(),
                *(c for c, _, _ in GROUP_STYLE.values() if c != "#c7c7c7")}  # the grey sample: background
    weak = {c: round(contrast(projector_color(c)), 2) for c in semantic if contrast(projector_color(c)) < 4.5}
    assert not weak, weak
    assert contrast(projector_color("#999")) >= 4.5 and projector_color("grey") == PROJECTOR["#808080"]


def test_a_colour_means_the_same_thing_in_every_chart(built):
    figs = {k: presentation(f) for k, f in built["qa"].items()}
    steps = {t.name: t.marker.color for t in figs["steps"].data if t.type == "bar"}
    timeline = {t.name: t.marker.color for t in figs["timeline"].data if t.name in ("prefill", "decode")}
    assert steps["prefill step"] == timeline["prefill"] == PROJECTOR[PREFILL_COLOR]
    assert steps["decode step"] == timeline["decode"] == PROJECTOR[DECODE_COLOR]
    kv = [t for t in figs["kv growth"].data if t.mode == "markers"][0]
    assert kv.marker.color == PROJECTOR[KV_COLOR]
    topk = figs["top-k"].data[0]
    assert topk.marker.color[0] == PROJECTOR[PREFILL_COLOR] and topk.textposition == "outside"
    heads = [t.line.color for t in figs["head view"].data if t.name and t.name.startswith("head ")]
    assert heads == [PROJECTOR[c] for c in HEAD_COLORS[:3]]
    assert figs["heatmap"].layout.plot_bgcolor == PROJECTOR["#d9d9d9"]  # masked cells stay grey
    assert figs["heatmap"].data[0].colorscale == built["qa"]["heatmap"].data[0].colorscale


def test_frames_keep_their_data_and_titles(built):
    original = built["qa"]["decode steps"]
    fig = presentation(original)
    assert len(fig.frames) == len(original.frames)
    assert np.array_equal(np.asarray(fig.frames[-1].data[0].z), np.asarray(original.frames[-1].data[0].z))
    assert fig.layout.margin.t > original.layout.margin.t  # slider and buttons: larger fonts above
    slider, before = fig.layout.sliders[0], original.layout.sliders[0]
    assert slider.x > before.x and slider.x + slider.len <= 1  # clear of the larger Play/Pause


def test_a_stacked_bars_text_stays_inside_and_a_long_y_title_wraps():
    from charts.present import CHAR_WIDTH, TITLE_FONT
    from charts.story import layer_split_chart

    split = presentation(layer_split_chart(884_736, 2_655_360))
    assert [t.textposition for t in split.data] == ["inside", "inside"]  # outside: past the edge
    title = "a y title much longer than the height of its plot at twenty-two px"
    tall = go.Figure(go.Scatter(y=[1, 2])).update_layout(height=300).update_yaxes(title_text=title)
    lines = presentation(tall).layout.yaxis.title.text.split("<br>")
    assert len(lines) > 1 and " ".join(lines) == title
    assert max(len(line) for line in lines) * CHAR_WIDTH * TITLE_FONT <= 300
    short = go.Figure(go.Scatter(y=[1, 2])).update_layout(height=300).update_yaxes(title_text="ms")
    assert presentation(short).layout.yaxis.title.text == "ms"


def test_a_top_legend_grows_upwards_and_the_original_is_unchanged():
    from charts.layout import legend_above

    fig = step_chart(TRACES["qa"])
    assert fig.layout.legend.orientation == "h" and fig.layout.legend.y > 1
    shown = legend_above(fig)
    assert shown.layout.legend.yanchor == "bottom" and 1 < shown.layout.legend.y < fig.layout.legend.y
    assert fig.layout.legend.yanchor is None  # the memo's figure is left as it was
    plain = go.Figure(go.Scatter(y=[1, 2]))
    assert legend_above(plain) is plain
