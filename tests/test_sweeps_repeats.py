"""Sweeps: every point measured several times, round-robin over the sizes, all repeats kept; the
point is their median and the chart shows their spread."""

from __future__ import annotations

import pytest

from charts.timing import sweep_chart
from engine.timing.sweeps import (
    SweepPoint,
    batch_rate,
    interleaved,
    prefill_rate,
    prompt_length_sweep,
    sweep_points,
)


def scripted(times: dict[int, list[float]], calls: list[int]):
    """A timed callable that returns each size's scripted times in turn and logs every call."""
    left = {size: iter(values) for size, values in times.items()}

    def timed(size: int) -> float:
        calls.append(size)
        return next(left[size])
    return timed


def test_interleaved_is_round_robin_after_one_warmup():
    calls: list[int] = []
    timed = scripted({4: [99.0, 10.0, 12.0, 11.0], 8: [20.0, 26.0, 21.0]}, calls)
    found = list(interleaved([4, 8], timed, repeats=3))
    assert calls == [4, 4, 8, 4, 8, 4, 8]  # warm-up (smallest size), then rounds, not 4, 4, 4
    assert [(m.size, m.repeat) for m in found] == [(4, 0), (8, 0), (4, 1), (8, 1), (4, 2), (8, 2)]
    assert 99.0 not in [m.ms for m in found]  # the warm-up is not a measurement


def test_points_are_medians_with_every_repeat_kept():
    calls: list[int] = []
    timed = scripted({16: [10.0, 14.0, 12.0], 64: [40.0, 30.0, 50.0]}, calls)
    points = sweep_points(interleaved([16, 64], timed, repeats=3, warmup=False), prefill_rate)
    assert [p.size for p in points] == [16, 64]
    assert points[0].repeats_ms == (10.0, 14.0, 12.0) and points[0].ms == 12.0
    assert points[1].ms == 40.0 and (points[1].ms_min, points[1].ms_max) == (30.0, 50.0)
    assert points[1].tokens_per_s == pytest.approx(64 * 1000 / 40.0)  # at the median


def test_a_point_without_repeats_still_works():
    """Points read from older files carry no repeats: the spread is the point itself."""
    old = SweepPoint(1, 20.0, 50.0)
    assert old.repeats_ms == () and old.ms_min == old.ms_max == 20.0


def test_sweep_chart_shows_median_and_min_max_spread():
    points = (SweepPoint(1, 20.0, 50.0, (18.0, 20.0, 25.0)), SweepPoint(4, 24.0, batch_rate(4, 24.0),
                                                                           (24.0, 22.0, 30.0)))
    fig = sweep_chart(points, "batch", "decode step (ms)")
    median = fig.data[0]
    assert list(median.y) == [20.0, 24.0]
    assert list(median.error_y.array) == [5.0, 6.0]  # max − median
    assert list(median.error_y.arrayminus) == [2.0, 2.0]  # median − min
    assert median.error_y.symmetric is False
    rate = sweep_chart(points, "batch", "tokens/s", rate=True).data[0]
    assert list(rate.y) == pytest.approx([50.0, 4000 / 24])
    # a rate is highest at the fastest repeat: 4 tokens in 22 ms
    assert rate.error_y.array[1] == pytest.approx(4000 / 22 - 4000 / 24)
    assert rate.error_y.arrayminus[1] == pytest.approx(4000 / 24 - 4000 / 30)
    assert "median" in median.name and "min" in fig.layout.title.text


def test_prompt_length_sweep_on_the_real_model_is_monotonic(lm):
    # sizes far apart and 5 repeats: the medians hold on a shared, busy machine
    points = prompt_length_sweep(lm, [8, 96, 384], repeats=5)
    assert [p.size for p in points] == [8, 96, 384]
    assert all(len(p.repeats_ms) == 5 for p in points)
    medians = [p.ms for p in points]
    assert medians[0] < medians[1] < medians[2], medians
