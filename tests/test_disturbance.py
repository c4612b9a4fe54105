"""Timing that stays honest on a busy machine: each step records its forward time, its CPU time and
the other processes' share of the CPUs, and a named rule marks steps other work delayed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from engine import GenerationSettings, generate_trace
from engine.records.trace import MachineLoad
from engine.timing.disturbance import CPU_SHARE_LIMIT, OTHERS_LIMIT, RULE, assess, step_delayed
from ui.state import state_of


@pytest.fixture(scope="module")
def quiet_trace(tiny_lm):
    return generate_trace(tiny_lm, "Name a colour.", GenerationSettings(max_new_tokens=4))


def _with(trace, cpu_share: float | None, others: float | None, threads: int = 2):
    """The trace with every step's CPU time and others' share set (a file could say so)."""
    steps = tuple(replace(s, cpu_ms=None if cpu_share is None else cpu_share * threads * s.latency_ms,
                          others_share=others) for s in trace.steps)
    return replace(trace, steps=steps, device="cpu",
                   machine=MachineLoad(threads, threads, 3.5, 4.0, others))


def test_every_step_records_forward_cpu_and_the_machine(lm):
    trace = generate_trace(lm, "Name a colour.", GenerationSettings(max_new_tokens=4))
    assert trace.machine is not None and trace.machine.threads >= 1
    for step in trace.steps:  # the real model's steps span several /proc/stat ticks
        assert 0 < step.forward_ms <= step.latency_ms
        assert step.cpu_ms > 0 and 0 <= step.others_share <= 1


@pytest.mark.parametrize("cpu_share, others, delayed", [
    (0.2, 0.8, True),  # both signals: marked
    (CPU_SHARE_LIMIT - 0.01, OTHERS_LIMIT, True),
    (0.2, 0.1, False),  # little else ran: a step that waited on memory, not on neighbours
    (0.95, 0.8, False),  # others ran on spare cores; this process got all it asked for
    (CPU_SHARE_LIMIT, 0.9, False),
    (None, 0.9, False),  # not measured (older file): never guessed
])
def test_the_rule_needs_both_signals(quiet_trace, cpu_share, others, delayed):
    trace = _with(quiet_trace, cpu_share, others)
    assert all(step_delayed(s, 2) == delayed for s in trace.steps)
    result = assess(trace)
    assert result.disturbed == delayed
    assert (result.warning() is not None) == delayed


def test_the_warning_counts_steps_and_says_what_to_do(quiet_trace):
    trace = _with(quiet_trace, 0.3, 0.6)
    warning = assess(trace).warning()
    assert f"{len(trace.steps)} of {len(trace.steps)} steps" in warning
    assert "60%" in warning and "load average 3.5 before, 4.0 after" in warning
    assert "Run it again" in warning and "close other programs" in warning
    assert "25%" in RULE and "75%" in RULE


def test_on_a_shared_server_the_advice_is_one_a_visitor_can_follow(quiet_trace):
    """A hosted demo's other programs are not the visitor's: no "close other programs" there
    (nor a claim that they are the other visitors' runs, which are this process's own work)."""
    warning = assess(_with(quiet_trace, 0.3, 0.6)).warning(shared=True)
    assert "not yours to close" in warning and "run it again in a minute" in warning
    assert "visitors" not in warning
    assert "close other programs" not in warning


def test_older_traces_are_not_measured_and_not_flagged(quiet_trace):
    trace = _with(quiet_trace, None, None)
    assert not assess(trace).measured and not assess(trace).disturbed


def test_a_busy_machine_is_caught(lm):
    """Two programs spinning on every core while the model runs: the rule marks the run."""
    cores = len(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(2 * cores)]
    try:
        time.sleep(0.3)
        trace = generate_trace(lm, "Name a colour.", GenerationSettings(max_new_tokens=6))
    finally:
        for spinner in spinners:
            spinner.kill()
    result = assess(trace)
    assert result.measured and result.disturbed, [(s.cpu_ms, s.latency_ms, s.others_share)
                                                  for s in trace.steps]
    assert trace.machine.others_share >= OTHERS_LIMIT


@pytest.mark.real_model
@pytest.mark.parametrize("cpu_share, others, shown", [(0.3, 0.7, True), (0.95, 0.7, False)])
def test_steps_page_marks_delayed_steps_and_warns(quiet_trace, cpu_share, others, shown):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).parents[1] / "app.py"), default_timeout=180).run()
    state_of(at.session_state).run.trace = _with(quiet_trace, cpu_share, others)
    at.switch_page("pages/steps.py").run()
    assert not at.exception
    table = at.dataframe[0].value
    assert {"wall (ms)", "forward (ms)", "CPU (ms)", "CPU share", "others' CPU"} <= set(table)
    flagged = table["timing"].str.contains("delayed by other work")
    assert flagged.all() if shown else not flagged.any()
    warnings = [w.value for w in at.warning]
    assert any("timing was disturbed" in w and "Run it again" in w for w in warnings) == shown


def test_cli_show_reports_delayed_steps(quiet_trace, capsys):
    from engine.__main__ import _print_summary, show_json

    busy = _with(quiet_trace, 0.2, 0.9)
    document = show_json(busy)
    assert document["delayed_steps"] == list(range(len(busy.steps)))
    assert document["machine"]["others_share"] == 0.9
    assert document["steps"][0]["cpu_ms"] == busy.steps[0].cpu_ms
    _print_summary(busy)
    assert "timing       This run's timing was disturbed" in capsys.readouterr().out
    assert show_json(_with(quiet_trace, 0.95, 0.9))["delayed_steps"] == []


def test_the_live_chart_hatches_delayed_steps(quiet_trace):
    from charts.live import DELAYED_NAME, DELAYED_PATTERN, step_chart

    busy = step_chart(_with(quiet_trace, 0.2, 0.9))
    hatched = [t for t in busy.data if t.type == "bar" and t.marker.pattern.shape == DELAYED_PATTERN
               and t.name != DELAYED_NAME]
    assert sorted(x for t in hatched for x in t.x) == list(range(len(quiet_trace.steps)))
    assert [t.marker.color for t in hatched] == ["#d62728", "#1f77b4"]  # the phase's colour,
    assert all(not t.showlegend for t in hatched)  # the legend's swatches stay plain,
    legend = [t for t in busy.data if t.showlegend is not False and t.name.endswith("step")]
    assert [t.name for t in legend] == ["prefill step", "decode step"]
    assert all(len(t.x) >= 1 for t in legend)  # plotly drops an empty trace from the legend
    # overlaid on the phase's colour ("replace", plotly's default, draws white on nothing)
    assert all(t.marker.pattern.fillmode == "overlay" for t in busy.data if t.type == "bar")
    assert DELAYED_NAME in [t.name for t in busy.data]
    assert "delayed by other work" in hatched[0].customdata[0][2]
    quiet = step_chart(_with(quiet_trace, 0.95, 0.9))
    assert all(t.marker.pattern.shape == "" for t in quiet.data if t.type == "bar")
    assert DELAYED_NAME not in [t.name for t in quiet.data]


@pytest.mark.real_model
@pytest.mark.parametrize("page", ["pages/generate.py", "pages/timing.py"])
def test_generate_and_timing_pages_warn_about_a_disturbed_run(quiet_trace, page):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).parents[1] / "app.py"), default_timeout=180).run()
    state_of(at.session_state).run.trace = _with(quiet_trace, 0.3, 0.7)
    at.switch_page(page).run()
    assert not at.exception
    assert any("timing was disturbed" in w.value for w in at.warning)
    state_of(at.session_state).run.trace = _with(quiet_trace, 0.95, 0.7)
    at.run()
    assert not any("timing was disturbed" in w.value for w in at.warning)


def test_the_step_chart_counts_whole_steps_even_for_a_one_step_run(quiet_trace):
    """A run the budget stopped after its prefill showed ticks at −0.4 … 0.4 (a walk at 390 px)."""
    from charts.live import step_chart

    for n in (1, 2, len(quiet_trace.steps)):
        axis = step_chart(replace(quiet_trace, steps=quiet_trace.steps[:n])).layout.xaxis
        assert axis.dtick == 1 and axis.tick0 == 0 and list(axis.range) == [-0.5, 4.5]
    many = replace(quiet_trace, steps=quiet_trace.steps * 16)  # 80 steps: a tick every 10
    assert step_chart(many).layout.xaxis.dtick == 10


def test_the_tick_counters_are_read_at_most_once_a_tick(monkeypatch):
    """Readings of /proc's tick counters less than one tick apart are one reading, shared by
    every thread (a batch of runs samples them at every step); a tick later, a fresh one."""
    import time

    import torch

    import engine.clock as clock

    reads = []
    monkeypatch.setattr(clock, "_machine_ticks", lambda: (reads.append(1), (len(reads), 99))[1])
    monkeypatch.setattr(clock, "_own_ticks", lambda: len(reads))
    monkeypatch.setattr(clock, "_last_ticks", (float("-inf"), None, None))
    device = torch.device("cpu")
    first = clock.MachineSample.now(device)
    again = clock.MachineSample.now(device)
    assert len(reads) == 1 and again.ticks == first.ticks and again.own_ticks == first.own_ticks
    time.sleep(clock.SHARE_S * 1.5)
    later = clock.MachineSample.now(device)
    assert len(reads) == 2 and later.ticks == (2, 99)
