"""The KV-cache page through AppTest: the calculator's table gives its per-layer rule the room."""

from __future__ import annotations

import json

from .test_app import fresh


def test_calculator_table_keeps_the_rule_column_whole():
    at = fresh().run()
    at.switch_page("pages/kvcache.py").run()  # no trace: the calculator's table comes first
    assert not at.exception
    table = at.dataframe[0]
    assert "per-layer rule" in table.value.columns
    columns = json.loads(table.proto.columns)
    assert columns["per-layer rule"]["width"] == "large"  # was cut at 1440 px
    # the long source URLs no longer take the row's width: a short link text instead
    assert columns["source"]["type_config"]["display_text"] == "config ↗"
    assert columns["source"]["width"] == "small"
    names = table.value["model"].tolist()
    chart = at.get("plotly_chart")[0]
    figure = json.loads(chart.proto.spec)
    assert figure["layout"]["yaxis"]["categoryarray"] == names  # bars in the table's order
