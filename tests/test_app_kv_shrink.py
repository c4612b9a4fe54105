"""The KV cache page's "Shrink the cache itself" tab in the real app (AppTest): the methods
measured on the visitor's run, a point per method and budget, the table, the heatmap of kept
keys, the command line that gives the same numbers, and a bad budget as one message."""

from __future__ import annotations

import pytest

from ui.state import state_of

from .test_app import fresh, generate

pytestmark = pytest.mark.real_model


def test_each_method_is_measured_on_the_visitors_run():
    at = generate(fresh().run(), "Write a long story about a dragon.", tokens=8)
    at.switch_page("pages/kvcache.py").run()
    assert not at.exception
    at.multiselect(key="kv_shrink_methods").set_value(["latent", "topk", "h2o"])
    at.text_input(key="kv_shrink_budgets").set_value("25%, 50%")
    next(b for b in at.button if b.label == "Measure each method").click().run()
    assert not at.exception
    runs = state_of(at.session_state).experiments.cache_shrink
    assert [(r.method, r.budget) for r in runs] == [
        ("latent", "25%"), ("latent", "50%"), ("topk", "25%"), ("topk", "50%"), ("h2o", "25%"),
        ("h2o", "50%")]
    trace = state_of(at.session_state).run.trace
    assert all(len(r.kl) == len(trace.steps) + 1 for r in runs)  # the prefill and each token read
    assert runs[0].kv_bytes[-1] < runs[1].kv_bytes[-1] < runs[0].dense_kv_bytes[-1]
    table = next(d.value for d in at.dataframe if "read per step (B)" in d.value.columns)
    assert list(table["budget"]) == ["25%", "50%"] * 3
    assert any("kv-shrink" in c.value and "--method latent topk h2o" in c.value for c in at.code)
    assert len(at.get("plotly_chart")) >= 2  # the chart and the heatmap of kept keys


def test_a_bad_budget_is_one_message():
    at = generate(fresh().run(), "Hi there, tell me a joke.", tokens=4)
    at.switch_page("pages/kvcache.py").run()
    at.text_input(key="kv_shrink_budgets").set_value("25%, lots")
    next(b for b in at.button if b.label == "Measure each method").click().run()
    assert not at.exception
    assert any("budget must be" in e.value for e in at.error)
    assert not state_of(at.session_state).experiments.cache_shrink
