"""The KV cache page's "Shrink the cache itself" tab in the real app (AppTest): the methods
measured on the visitor's run, a point per method and budget, the table, the heatmap of kept
keys, the command line that gives the same numbers (and does), and a bad budget as one message.
The choice kept through a change of language is a browser test (tests/e2e/test_kv_shrink_browser.py):
AppTest keeps a multiselect's value as ids, where the browser keeps the labels shown."""

from __future__ import annotations

import json
import shlex

import pytest

from ui.state import state_of

from .test_app import fresh, generate

pytestmark = pytest.mark.real_model


def test_each_method_is_measured_on_the_visitors_run():
    at = generate(fresh().run(), "Write a long story about a dragon.", tokens=8)
    at.switch_page("pages/kvcache.py").run()
    assert not at.exception
    at.multiselect(key="kv_shrink_methods_en").set_value(["latent", "topk", "h2o"])
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
    table = next(t.value for t in at.table if "KV read per step (MiB)" in t.value.columns)
    assert list(table["budget came to"])[:2] == [f"rank {runs[0].count}", f"rank {runs[1].count}"]
    assert list(table["KV held (MiB)"]) == [r.kv_bytes[-1] / 2**20 for r in runs]
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


def test_the_pages_snapkv_point_is_the_command_lines(engine_cli):
    """The command the page prints under its results gives the numbers of the page's point."""
    at = generate(fresh().run(), "Name three colours.", tokens=6)
    at.switch_page("pages/kvcache.py").run()
    at.multiselect(key="kv_shrink_methods_en").set_value(["snapkv"])
    at.text_input(key="kv_shrink_budgets").set_value("50%")
    next(b for b in at.button if b.label == "Measure each method").click().run()
    (run,) = state_of(at.session_state).experiments.cache_shrink
    command = next(c.value for c in at.code if "kv-shrink" in c.value)
    done = engine_cli(*shlex.split(command)[3:])  # after "python -m engine"
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    mine = run.summary()
    for key in ("method", "budget", "resolved", "kv_bytes", "dense_kv_bytes", "kl",
                "top1_agreement", "ppl", "dense_ppl", "positions", "prompt_tokens"):
        assert printed[key] == mine[key], key

