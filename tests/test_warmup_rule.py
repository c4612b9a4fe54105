"""The warm-up rule: a first decode step far slower than the later ones is marked, left out of the
pages' ITL figures (and said so), and labelled in the step chart; `summarize` without it keeps
every gap, as vLLM and GenAI-Perf define ITL. Checked against numpy on made-up step times."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from charts.live import WARMUP_LABEL, step_chart
from engine import GenerationSettings, generate_trace
from engine.timing.metrics import (
    WARMUP_FACTOR,
    WARMUP_RULE,
    summarize,
    warmup_note,
    warmup_step,
)


@pytest.fixture(scope="module")
def base(tiny_lm):
    return generate_trace(tiny_lm, "Name a colour.", GenerationSettings(max_new_tokens=6,
                                                                       record_attention=False))


def timed(trace, times: list[float]):
    """The trace with its steps' wall times set (prefill first)."""
    assert len(times) == len(trace.steps)
    return replace(trace, steps=tuple(replace(s, latency_ms=t) for s, t in zip(trace.steps, times)))


def test_a_slow_first_decode_step_is_left_out_of_the_itl_figures(base):
    trace = timed(base, [120.0, 291.0, 65.0, 64.0, 66.0, 70.0])
    assert warmup_step(trace) == 1
    kept = [65.0, 64.0, 66.0, 70.0]
    s = summarize(trace, skip_warmup=True)
    assert (s.warmup_step, s.warmup_ms) == (1, 291.0)
    assert s.itl_p50_ms == pytest.approx(np.percentile(kept, 50))
    assert s.itl_p90_ms == pytest.approx(np.percentile(kept, 90))
    assert s.itl_mean_ms == pytest.approx(np.mean(kept))
    assert s.decode_tokens_per_s == pytest.approx(len(kept) / sum(kept) * 1000)
    every = [291.0] + kept  # the benchmarks' definition: every gap
    assert s.ttft_ms == pytest.approx(base.tokenize_ms + 120.0)
    assert s.tpot_ms == pytest.approx(sum(every) / len(every))  # end to end: keeps it
    plain = summarize(trace)
    assert plain.warmup_step is None
    assert plain.itl_p50_ms == pytest.approx(np.percentile(every, 50))
    assert plain.itl_mean_ms == pytest.approx(np.mean(every))


@pytest.mark.parametrize("times, marked", [
    ([100.0, 65.0 * WARMUP_FACTOR, 65.0, 64.0, 66.0, 65.0], None),  # exactly the factor: not more
    ([100.0, 65.0 * WARMUP_FACTOR + 0.1, 65.0, 64.0, 66.0, 65.0], 1),
    ([100.0, 70.0, 65.0, 64.0, 66.0, 300.0], None),  # a slow later step is not a warm-up
])
def test_the_rule_compares_with_the_median_of_the_later_steps(base, times, marked):
    assert warmup_step(timed(base, times)) == marked


def test_too_few_decode_steps_mark_nothing(base):
    short = replace(base, steps=base.steps[:3])  # prefill + 2 decode steps: 1 after the first
    assert warmup_step(timed(short, [100.0, 900.0, 60.0])) is None


def test_where_itl_is_shown_the_rule_is_named(base):
    s = summarize(timed(base, [120.0, 291.0, 65.0, 64.0, 66.0, 70.0]), skip_warmup=True)
    assert warmup_note(s).startswith("Step 1 (291 ms) is left out as warm-up.")
    assert WARMUP_RULE in warmup_note(s)
    quiet = summarize(timed(base, [120.0, 66.0, 65.0, 64.0, 66.0, 70.0]), skip_warmup=True)
    assert quiet.warmup_step is None and "no step marked" in warmup_note(quiet)


def test_the_step_chart_labels_the_warm_up_step(base):
    fig = step_chart(timed(base, [120.0, 291.0, 65.0, 64.0, 66.0, 70.0]))
    (label,) = [a for a in fig.layout.annotations if a.text == WARMUP_LABEL]
    assert (label.x, label.y) == (1, 291.0)
    quiet = step_chart(timed(base, [120.0, 66.0, 65.0, 64.0, 66.0, 70.0]))
    assert not [a for a in quiet.layout.annotations if a.text == WARMUP_LABEL]
