"""A click's budget inside What if's experiments (issue 42, point 2): the head sweep checks it
before every forward (the baseline's too), an ablation before each forward and between its runs'
steps, a branch's timing re-run runs inside it; and the page sizes the work from the real tokens
before starting — a trace whose prompt text disagrees with its recorded ids (1,205 tokens of
text held a hosted model 89 s) or a prompt past the limit is refused in one line, nothing run."""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np
import pytest

from engine.errors import EngineError, TraceFormatError
from engine.records.tracecheck import check_trace
from engine.runner import Run
from engine.whatif.ablate import Ablation, ablate, head_sweep
from engine.whatif.branch import branch, greedy_settings, run_snapshot
from ui.state import state_of

from .test_app import fresh

PAGE = "pages/whatif.py"


def forwards(lm) -> list[int]:
    """Counts the model's forwards (a hook on the embedding)."""
    count: list[int] = []
    lm.model.model.embed_tokens.register_forward_hook(lambda *a: count.append(1))
    return count


def test_a_spent_budget_runs_no_forward_of_a_sweep_and_ends_an_ablation(lm):
    ids = lm.tokenizer("The Eiffel Tower is in the city of")["input_ids"]
    hooks = dict(lm.model.model.embed_tokens._forward_hooks)
    count = forwards(lm)
    try:
        found = head_sweep(lm, ids, [0, 1], stop=lambda: True)
        assert np.isnan(found).all() and count == []  # not even the unablated pass
        spent = threading.Event()
        spent.set()
        with pytest.raises(EngineError, match="budget ran out"):
            ablate(lm, "Hi", Ablation(1, (5,)), greedy_settings(4, False), 4, stop=spent)
        assert len(count) <= 1  # at most the first run's prefill
    finally:
        lm.model.model.embed_tokens._forward_hooks.clear()
        lm.model.model.embed_tokens._forward_hooks.update(hooks)


def test_a_branchs_timing_rerun_stays_inside_the_budget(lm):
    settings = greedy_settings(12, True)
    parent = Run(lm, "Name three fruits.", settings).run_all()
    snapshot, _ms = run_snapshot(lm, parent)
    budget = threading.Event()
    real = Run._step
    steps = []

    def step(self, loop, i):  # the budget runs out during the re-run (the second run)
        steps.append(i)
        if len(steps) > len(parent.steps):
            budget.set()
        return real(self, loop, i)

    Run._step = step
    try:
        token = int(parent.steps[2].top_ids[1])
        found = branch(lm, parent, 2, token, snapshot, stop_event=budget)
    finally:
        Run._step = real
    record = found.trace.branch
    assert record.rerun_ms is None and record.saved_ms is None and not record.same_as_rerun
    check_trace(found.trace)  # a stopped re-run is a valid record
    with pytest.raises(TraceFormatError):
        check_trace(replace(found.trace, branch=replace(record, same_as_rerun=True)))


def test_the_page_refuses_a_trace_whose_text_disagrees_with_its_tokens(monkeypatch):
    """The finding: a trace's prompt text much longer than its prompt tokens; the sweep
    re-tokenized the text. Now one line, and the model runs nothing."""
    at = fresh(monkeypatch, hosted=True)
    at.run()
    from engine.files import read_trace_file
    from engine.records.examples import examples

    trace = read_trace_file(next(e for e in examples() if e.name == "qa").path).trace
    state_of(at.session_state).run.trace = replace(trace, prompt="many words " * 600)
    at.switch_page(PAGE).run()
    next(b for b in at.button if b.label == "Which heads matter?").click().run()
    assert not at.exception
    assert any("trace file was changed" in e.value for e in at.error), [e.value for e in at.error]
    assert state_of(at.session_state).whatif.sweep is None
    state_of(at.session_state).run.trace = None
    at.run()
    at.text_area(key="ablate_prompt").set_value("many words " * 150)
    next(b for b in at.button if b.label == "Switch off and re-run").click().run()
    assert any("the limit here is 256" in e.value for e in at.error), [e.value for e in at.error]


def test_opening_a_trace_whose_text_was_changed_is_one_line(lm, monkeypatch):
    """The app's trace reader, with the trace's own model loaded, checks that the prompt text
    tokenizes to the recorded prompt tokens (and leaves a trace of another model alone)."""
    import ui.traces
    from engine.files import read_trace_file
    from engine.records.examples import examples
    from engine.records.tracefile import trace_to_bytes

    path = next(e for e in examples() if e.name == "qa").path
    trace = read_trace_file(path).trace
    monkeypatch.setattr(ui.traces, "loaded_model", lambda: lm)
    assert ui.traces.read_viewable(lambda: path).trace.prompt == trace.prompt  # as shipped
    changed = trace_to_bytes(replace(trace, prompt="many words " * 600))
    with pytest.raises(TraceFormatError, match="file was changed") as refused:
        ui.traces.read_viewable(lambda: changed)
    assert "\n" not in str(refused.value) and "records" in str(refused.value)
    monkeypatch.setattr(ui.traces, "loaded_model", lambda: None)  # no model: nothing to check
    ui.traces.read_viewable(lambda: changed)
