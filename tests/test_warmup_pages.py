"""Where ITL is shown (Steps, Prefill vs decode), a first decode step the warm-up rule marks is
left out of the figures and the page says so."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from charts.formatting import duration
from engine.files import read_trace_file
from engine.records.examples import examples
from tests.test_app import fresh
from ui.state import state_of


@pytest.fixture(scope="module")
def spiked():
    """A shipped example with its first decode step 5× its other decode steps."""
    trace = read_trace_file(next(e for e in examples() if e.path.is_file()).path).trace
    steps = [replace(s, latency_ms=300.0 if s.index == 1 else 60.0 + s.index % 3, cpu_ms=None,
                     others_share=None) for s in trace.steps]  # no delay marks: only the rule
    return replace(trace, steps=tuple(steps))


@pytest.mark.parametrize("page", ["pages/steps.py", "pages/timing.py"])
def test_the_itl_figures_leave_the_warm_up_step_out_and_say_so(spiked, page):
    at = fresh().run()
    state_of(at.session_state).run.trace = spiked
    at.switch_page(page).run()
    assert not at.exception
    (p50,) = [m for m in at.metric if m.label == "ITL p50"]
    kept = [s.latency_ms for s in spiked.steps[2:]]
    assert p50.value == duration(float(np.percentile(kept, 50)))
    assert p50.proto.help.startswith("Step 1 (300 ms) is left out as warm-up.")
    if page == "pages/steps.py":
        table = at.dataframe[0].value
        assert list(table["timing"]).count("warm-up: left out of ITL") == 1
        assert table["timing"].iloc[1] == "warm-up: left out of ITL"
    else:
        assert any("marked warm-up" in c.value for c in at.caption)
