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


def test_cache_on_vs_off_shows_rounds_spread_delays_and_why_more_tokens_took_less():
    """Results as a busy machine left them: 32 tokens' median below 16 tokens' (a delayed round
    in 16's): the table gives median and min–max, the page warns about the delayed rounds and
    says in one line why more tokens took less time; the chart has min–max bars and marks the
    delayed round."""
    import numpy as np

    from engine.experiments import Experiments
    from engine.kv.cachelab import OnOff
    from ui.state import state_of

    def result(n, on, off, on_delayed):
        return OnOff(n, np.full(n, on[1] / n), np.full(n, off[1] / n), True, on, off,
                     on_delayed, (False,) * len(on))

    found = (result(16, (2216.0, 2500.0, 700.0), (3000.0, 3100.0, 2900.0), (True, True, False)),
             result(32, (1536.0, 1500.0, 1600.0), (9000.0, 9100.0, 8900.0), (False,) * 3))
    at = fresh().run()
    state_of(at.session_state).experiments = Experiments(cache_on_off=found)
    at.switch_page("pages/kvcache.py").run()
    assert not at.exception
    table = next(d.value for d in at.dataframe if "cache on, min–max (ms)" in d.value.columns)
    assert list(table["cache on, median (ms)"]) == [2216, 1536]
    assert list(table["cache on, min–max (ms)"]) == ["700–2,500", "1,500–1,600"]
    assert list(table["rounds"]) == [3, 3] and list(table["delayed rounds"]) == ["2 of 3", "0 of 3"]
    warnings = [w.value for w in at.warning]
    assert any("delayed 2 of 6 rounds" in w for w in warnings)
    assert any(w.startswith("32 tokens took less time than 16 with the cache (1,536 ms vs 2,216 ms")
               for w in warnings)
    figures = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    rounds = next(f for f in figures if f["layout"]["yaxis"]["title"]["text"] == "total time (ms)")
    on = rounds["data"][0]
    assert on["y"] == [2216.0, 1536.0] and on["error_y"]["arrayminus"] == [1516.0, 36.0]
    assert on["error_y"]["array"] == [284.0, 64.0]
    points = rounds["data"][1]
    assert points["marker"]["symbol"].count("x-thin-open") == 2  # the two delayed rounds


def test_live_memory_table_groups_digits_as_the_formula_line_does(tiny_lm):
    """The per-layer bytes read 311,296 like the formula above them, not 311296 (an 8B model's
    layers hold six-digit byte counts after a few tokens)."""
    from engine import GenerationSettings, generate_trace
    from ui.state import state_of

    trace = generate_trace(tiny_lm, "The cat sat on the mat.", GenerationSettings(max_new_tokens=3))
    at = fresh().run()
    state_of(at.session_state).run.trace = trace
    at.switch_page("pages/kvcache.py").run()
    assert not at.exception
    table = next(d for d in at.dataframe if "measured (B)" in d.value.columns)
    columns = json.loads(table.proto.columns)
    assert columns["measured (B)"]["type_config"]["format"] == "localized"
    assert columns["formula (B)"]["type_config"]["format"] == "localized"
