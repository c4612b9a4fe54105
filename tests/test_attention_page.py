"""The Attention page through AppTest, on a tiny random model's trace (no real model needed): a
click on a model-view tile selects that layer and head, the decode steps play in the browser from
a drawn first frame, and per-trace work runs once however often the page reruns."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from engine import GenerationSettings, generate_trace
from ui.state import state_of

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "attention.py")


@pytest.fixture(scope="module")
def trace(tiny_lm):
    trace = generate_trace(tiny_lm, "The cat sat on the mat.", GenerationSettings(max_new_tokens=8))
    assert len(trace.steps) >= 4  # Play needs a few decode steps
    return trace


def open_page(trace) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    state_of(at.session_state).run.trace = trace
    return at.run()


def chart(at: AppTest, key: str):
    return next(c for c in at.get("plotly_chart") if c.key == key)


def figure(element) -> dict:
    return json.loads(element.proto.spec)


def array(value) -> np.ndarray:
    """A figure array as plotly serialises it: a list, or a typed array {dtype, bdata, shape}."""
    if isinstance(value, dict) and "bdata" in value:
        data = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        return data.reshape([int(n) for n in shape.split(",")]) if isinstance(shape, str) else data
    return np.asarray(value)


def click_point(at: AppTest, element, points: list[dict]) -> AppTest:
    """Rerun as the browser does after a click on a chart with on_select: the selection JSON as
    the chart's widget value. AppTest has no API for chart selections, so it goes in by hand."""
    states = at._tree.get_widget_states()
    state = states.widgets.add()
    state.id = element.proto.id
    state.string_value = json.dumps({"selection": {
        "points": points, "point_indices": [p["point_index"] for p in points], "box": [], "lasso": []}})
    return at._run(widget_state=states)


def browser_point(fig: dict, layer: int, head: int) -> dict:
    """The point Chromium reports for a click on tile (layer, head): one of a selectable trace's
    points over that tile, its typed customdata as an object keyed "0", "1", … (seen in Chromium)."""
    selectable = [(i, tr) for i, tr in enumerate(fig["data"])
                  if tr["type"] in ("scatter", "scattergl", "bar")]
    assert selectable, "plotly selects points of scatter or bar traces; a click on a heatmap selects nothing"
    for curve, tr in selectable:
        x, y, data = array(tr["x"]), array(tr["y"]), array(tr["customdata"])
        hits = np.flatnonzero((data[:, 0] == layer) & (data[:, 1] == head))
        if len(hits):
            i = int(hits[0])
            return {"curve_number": curve, "point_number": i, "point_index": i, "x": int(x[i]),
                    "y": int(y[i]), "customdata": {str(j): float(v) for j, v in enumerate(data[i])}}
    raise AssertionError(f"no point over layer {layer}, head {head}")


def test_a_click_on_a_model_view_tile_selects_that_layer_and_head(trace):
    at = open_page(trace)
    assert not at.exception
    assert (at.selectbox(key="attn_layer").value, at.selectbox(key="attn_head").value) == (0, 0)
    view = chart(at, "model_view")
    assert list(view.proto.selection_mode) == [0]  # points
    layer = trace.attention_layers[-1]
    click_point(at, view, [browser_point(figure(view), layer, 2)])
    assert not at.exception
    assert (at.selectbox(key="attn_layer").value, at.selectbox(key="attn_head").value) == (layer, 2)
    assert any(f"now: layer {layer}, head 2" in c.value for c in at.caption)
    heat = figure(at.get("plotly_chart")[0])
    assert heat["layout"]["title"]["text"] == f"layer {layer}, head 2"  # the Heatmap tab follows


def head_view_heads(at: AppTest) -> list[str]:
    """The heads the head view draws, as its legend names them."""
    view = next(c for c in at.get("plotly_chart") if figure(c)["layout"].get("legend"))
    return [tr["name"] for tr in figure(view)["data"] if tr.get("name")]


def outlined_tiles(fig: dict) -> set[tuple[int, int]]:
    """The (layer, head) of every model-view point inside the figure's one outline."""
    [box] = fig["layout"]["shapes"]
    found = set()
    for tr in fig["data"]:
        if tr["type"] != "scattergl":
            continue
        x, y, data = array(tr["x"]), array(tr["y"]), array(tr["customdata"])
        inside = (box["x0"] <= x) & (x <= box["x1"]) & (box["y0"] <= y) & (y <= box["y1"])
        found |= {(int(d[0]), int(d[1])) for d in data[inside]}
    return found


def test_a_clicked_tile_opens_in_the_head_view_and_is_outlined(trace):
    """The click's layer and head are the head view's (not heads 0–2 whatever was chosen), and
    the model view outlines that tile, every point of it and no other."""
    at = open_page(trace)
    assert head_view_heads(at) == ["head 0"]
    assert outlined_tiles(figure(chart(at, "model_view"))) == {(trace.attention_layers[0], 0)}
    layer = trace.attention_layers[-1]
    view = chart(at, "model_view")
    click_point(at, view, [browser_point(figure(view), layer, 2)])
    assert not at.exception
    assert at.multiselect[0].value == [2]
    assert head_view_heads(at) == ["head 2"]
    marked = figure(chart(at, "model_view"))
    assert outlined_tiles(marked) == {(layer, 2)}
    whole = sum(int(((array(tr["customdata"])[:, 0] == layer) & (array(tr["customdata"])[:, 1] == 2)).sum())
                for tr in marked["data"] if tr["type"] == "scattergl")
    [box] = marked["layout"]["shapes"]
    inside = sum(int(((box["x0"] <= array(tr["x"])) & (array(tr["x"]) <= box["x1"])
                      & (box["y0"] <= array(tr["y"])) & (array(tr["y"]) <= box["y1"])).sum())
                 for tr in marked["data"] if tr["type"] == "scattergl")
    assert inside == whole > 0  # the outline holds the whole tile


def test_the_head_view_shows_the_head_chosen_above(trace):
    at = open_page(trace)
    at.selectbox(key="attn_head").set_value(3).run()
    assert not at.exception
    assert head_view_heads(at) == ["head 3"]
    at.multiselect[0].set_value([3, 1]).run()  # another head added to compare
    assert head_view_heads(at) == ["head 3", "head 1"]


def test_a_selection_naming_no_recorded_tile_changes_nothing(trace):
    at = open_page(trace)
    view = chart(at, "model_view")
    for customdata in ({"0": 99, "1": 0}, {"0": 0, "1": 99}, "layer 1", None):
        click_point(at, view, [{"curve_number": 1, "point_index": 0, "x": 0, "y": 0,
                                "customdata": customdata}])
        assert not at.exception
        assert (at.selectbox(key="attn_layer").value, at.selectbox(key="attn_head").value) == (0, 0)


def test_decode_steps_play_in_the_browser_from_a_drawn_first_frame(trace):
    """Play is the figure's own animation: no rerun per step (which would redraw, and blank, the
    chart and leave the page's widgets behind); the slider is the figure's, bound to its frames."""
    at = open_page(trace)
    steps = len(trace.steps) - 1
    [fig] = [f for f in map(figure, at.get("plotly_chart")) if f.get("frames")]
    assert [f["name"] for f in fig["frames"]] == [str(k) for k in range(1, steps + 1)]
    assert re.match(r"step 1:", fig["layout"]["title"]["text"])  # drawn at once, on step 1
    assert fig["data"][0]["z"] == fig["frames"][0]["data"][0]["z"]
    assert len({(f["data"][0]["zmin"], f["data"][0]["zmax"]) for f in fig["frames"]}) == 1
    assert (fig["data"][0]["zmin"], fig["data"][0]["zmax"]) == (fig["frames"][0]["data"][0]["zmin"],
                                                                fig["frames"][0]["data"][0]["zmax"])
    slider = fig["layout"]["sliders"][0]
    assert [step["args"][0] for step in slider["steps"]] == [[f["name"]] for f in fig["frames"]]
    assert [b["label"] for b in fig["layout"]["updatemenus"][0]["buttons"]] == ["▶ Play", "❚❚ Pause"]
    assert not any(b.label.startswith("Play") for b in at.button), "no server-side Play loop"


def test_head_view_fits_and_asks_for_a_head(trace):
    at = open_page(trace)
    view = next(c for c in at.get("plotly_chart") if figure(c)["layout"].get("legend"))
    assert figure(view)["layout"]["height"] <= 700
    at.multiselect[0].set_value([]).run()
    assert not at.exception
    assert any("at least one head" in i.value for i in at.info)


def test_reruns_do_not_redo_per_trace_work(trace, monkeypatch):
    """The model view and the head summary run once per trace, the decode animation once per trace
    and layer, not on every rerun."""
    import charts.attention
    import engine.lens.attention_stats

    calls = {"summary": 0, "view": 0, "decode": 0}

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(engine.lens.attention_stats, "head_summary",
                        counting("summary", engine.lens.attention_stats.head_summary))
    monkeypatch.setattr(charts.attention, "model_view", counting("view", charts.attention.model_view))
    monkeypatch.setattr(charts.attention, "decode_steps_chart",
                        counting("decode", charts.attention.decode_steps_chart))
    at = open_page(trace)
    for head in (1, 2):
        at.selectbox(key="attn_head").set_value(head).run()
        assert not at.exception
    assert calls == {"summary": 1, "view": 1, "decode": 1}
    at.selectbox(key="attn_layer").set_value(trace.attention_layers[1]).run()
    assert calls == {"summary": 1, "view": 1, "decode": 2}


def test_one_head_table_shows_the_key_tokens_as_text(trace, tiny_lm):
    """The step-by-step table's key tokens read `<|im_start|>` and `.`, not the character
    references the figures' labels carry (`&lt;&#124;im&#95;start&#124;&gt;`): a table cell shows
    text as it is."""
    from engine.models import ModelEntry
    from ui.session_model import SessionModel

    at = AppTest.from_file(PAGE, default_timeout=60)
    state = state_of(at.session_state)
    state.run.trace = trace
    state.model = SessionModel("tiny", "fp32", ModelEntry(tiny_lm))
    at.run()
    assert not at.exception
    table = next(d.value for d in at.dataframe if "key token" in d.value.columns)
    keys = list(table["key token"])
    assert keys and not any(re.search(r"&(#\d+|lt|gt|amp);", k) for k in keys), keys
    pieces = list(trace.prompt_pieces) + [s.piece for s in trace.steps[:-1]]
    assert keys[0].startswith("0:") and len(keys) == len(pieces)
    assert any(k.endswith(".") for k in keys), keys  # "mat." ends in a full stop of its own
