"""Presentation mode and chart downloads through AppTest, on an example trace with no model."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from charts.present import MIN_FONT
from engine.files import read_trace_file
from engine.records.examples import examples
from ui.state import state_of

APP = str(Path(__file__).resolve().parents[1] / "app.py")


@pytest.fixture
def app(monkeypatch, tmp_path) -> AppTest:
    """The app with a model that cannot load (an empty folder): nothing here needs one."""
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "0")
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["model_source"] = str(tmp_path)
    at.session_state["replay_speed"] = "instant"  # an example opens without its recorded pace
    return at


def open_example(at: AppTest) -> AppTest:
    next(b for b in at.button if b.key == "example_qa").click()
    return at.run()


def charts(at: AppTest) -> list[tuple[dict, dict]]:
    """(config, figure) of every plotly chart on the page."""
    return [(json.loads(c.proto.config), json.loads(c.proto.spec)) for c in at.get("plotly_chart")]


def test_present_in_the_url_turns_the_mode_on_and_keeps_the_session_token(app):
    app.query_params["present"] = "1"
    at = app.run()
    assert not at.exception
    assert at.session_state["present"] is True
    assert at.query_params["present"] == "1" and at.query_params["s"]
    assert [b for b in at.button if b.key == "present_exit"]
    css = [h.proto.body for h in at.get("html")]
    assert any('[data-testid="stSidebar"]' in c and "display: none" in c for c in css)  # sent to it
    next(b for b in at.button if b.key == "present_exit").click()
    at.run()
    assert at.session_state["present"] is False
    # AppTest reruns only the page after its first run, not app.py: the URL's update on the way
    # out is checked in Chromium (tests/e2e/test_present_browser.py)


def test_without_the_param_the_page_is_normal(app):
    at = app.run()
    assert at.session_state["present"] is False and "present" not in at.query_params
    assert not [b for b in at.button if b.key == "present_exit"]
    assert not any('[data-testid="stSidebar"]' in h.proto.body for h in at.get("html"))


def test_the_mode_on_puts_present_in_the_url_beside_the_token(app):
    app.session_state["present"] = True  # as the sidebar toggle sets it
    at = app.run()
    assert at.query_params["present"] == "1" and at.query_params["s"]
    assert [b for b in at.button if b.key == "present_exit"]


def test_every_chart_downloads_the_chosen_format_and_presents_large(app):
    at = open_example(app.run())
    shown = charts(at)
    assert len(shown) >= 2  # the step chart and the top-k chart
    for config, figure in shown:
        assert config["displaylogo"] is False
        assert config["toImageButtonOptions"]["format"] == "png"
        assert config["toImageButtonOptions"]["scale"] == 2
        assert config["toImageButtonOptions"]["filename"].startswith("generate-")
        assert "size" not in figure["layout"].get("font", {})  # normal mode: the figure as built
    at.session_state["chart_format"] = "svg"  # as the sidebar's radio sets it
    at.run()
    assert all(c["toImageButtonOptions"]["format"] == "svg" for c, _ in charts(at))
    at.session_state["present"] = True
    at.run()
    for _, figure in charts(at):
        assert figure["layout"]["font"]["size"] >= MIN_FONT
        assert figure["layout"]["xaxis"]["tickfont"]["size"] >= MIN_FONT


def test_attention_charts_follow_the_global_format_and_its_own_switch_is_gone(app):
    qa = next(e for e in examples() if e.name == "qa")
    state_of(app.session_state).run.trace = read_trace_file(qa.path).trace
    app.session_state["chart_format"] = "svg"
    at = app.switch_page("pages/attention.py").run()
    assert not at.exception
    shown = charts(at)
    assert shown and all(c["toImageButtonOptions"]["format"] == "svg" for c, _ in shown)
    # the heatmap's title; the page's name before it comes from app.py after st.navigation, which
    # AppTest skips on a switched page (Chromium checks it: tests/e2e/test_present_browser.py)
    assert shown[0][0]["toImageButtonOptions"]["filename"].endswith("layer-0-head-0")
    assert "attn_format" not in at.session_state


def _tables_page() -> None:
    import pandas as pd
    import streamlit as st

    from ui.tables import show_table

    show_table(pd.DataFrame({"step": [0, 1], "share": [0.4513, 0.5]}), hide_index=True,
               column_config={"share": st.column_config.NumberColumn("CPU share", format="percent")})


def test_presenting_a_table_is_html_in_the_grids_formats():
    """Presenting, a table is an HTML table (its text sized by the style sheet, ≥ 22 px) with the
    values the grid would show, formatted as its column configuration says."""
    from ui.tables import cell_text

    at = AppTest.from_function(_tables_page)
    at.session_state["present"] = True
    at.run()
    assert not at.exception and not at.dataframe
    table = at.table[0].value
    assert table.columns.tolist() == ["step", "CPU share"]  # the column's label
    assert table["step"].tolist() == [0, 1] and table["CPU share"].tolist() == [0.4513, 0.5]
    shown = pa.ipc.open_stream(at.table[0].proto.arrow_data.styler.display_values).read_all()
    assert shown.column(1).to_pylist() == ["45\\.13%", "50%"]  # the cells' text: cell_text's
    assert cell_text(0.4513, "percent") == "45\\.13%" and cell_text(2.5, "%.2f×") == "2\\.50×"
    assert cell_text(1234567, "localized") == "1,234,567" and cell_text(0.1234567) == "0\\.1235"
    assert cell_text(None) == cell_text(float("nan")) == "" and cell_text(True) == "yes"
    assert cell_text("*a*_b_") == "\\*a\\*\\_b\\_"  # markdown shown as itself
    assert cell_text("https://x.org/c", kind="link", link_text="config ↗") == \
        "[config ↗](https://x.org/c)"
    at.session_state["present"] = False
    at.run()
    assert at.dataframe and not at.table  # the grid again
