"""KV cache on vs off, measured so a class can trust it: interleaved rounds, the median with the
min–max of the rounds, delayed rounds flagged by the delay rule, a note whenever a longer output
shows less time than a shorter one, and a versioned record that older files still open."""

from __future__ import annotations

import statistics
from dataclasses import replace

import numpy as np
import pytest

from engine import GenerationSettings, generate_trace
from engine.errors import TraceFormatError
from engine.experiments import (
    ON_OFF_VERSION,
    Experiments,
    experiments_from_dict,
    on_off_from_dict,
    on_off_to_dict,
)
from engine.kv import cachelab
from engine.kv.cachelab import (
    OnOff,
    TimedRun,
    cache_on_off,
    delay_flag,
    on_off_notes,
    on_off_results,
)
from engine.records.trace import MachineLoad
from engine.timing.disturbance import assess


def timed(n: int, r: int, kv: bool, total: float, delayed: bool | None = False,
          tokens: tuple[int, ...] = (1, 2)) -> TimedRun:
    """A run of `n` tokens whose steps add up to `total` ms."""
    return TimedRun(n, r, kv, np.full(n, total / n), tokens, delayed)


def result(n: int, on: tuple[float, ...], off: tuple[float, ...],
           on_delayed: tuple[bool, ...] = (), off_delayed: tuple[bool, ...] = ()) -> OnOff:
    if on_delayed and not off_delayed:
        off_delayed = (False,) * len(on)
    if off_delayed and not on_delayed:
        on_delayed = (False,) * len(on)
    return OnOff(n, np.full(n, on[0] / n), np.full(n, off[0] / n), True, on, off,
                 on_delayed, off_delayed)


def test_rounds_are_interleaved_over_lengths_and_runs(tiny_lm):
    runs = list(cache_on_off(tiny_lm, "Hello there", [3, 6], rounds=3))
    assert [(t.round, t.new_tokens, t.kv_cache) for t in runs] == [
        (r, n, kv) for r in range(3) for n in (3, 6) for kv in (True, False)]
    assert all(len(t.step_ms) == t.new_tokens and t.total_ms > 0 for t in runs)
    found = on_off_results(runs)
    assert [r.new_tokens for r in found] == [3, 6]
    for r in found:
        on = [t.total_ms for t in runs if t.new_tokens == r.new_tokens and t.kv_cache]
        off = [t.total_ms for t in runs if t.new_tokens == r.new_tokens and not t.kv_cache]
        assert r.rounds == 3 and r.on_rounds_ms == tuple(on) and r.off_rounds_ms == tuple(off)
        assert r.median_ms(True) == pytest.approx(float(np.median(on)))
        assert r.spread_ms(False) == (min(off), max(off))
        assert r.on_ms.sum() == pytest.approx(float(np.median(on)))  # the median round's steps
        assert r.speedup == pytest.approx(np.median(off) / np.median(on))
        assert r.same_tokens


def test_each_run_is_checked_by_the_delay_rule(tiny_lm):
    trace = generate_trace(tiny_lm, "Name a colour.", GenerationSettings(max_new_tokens=3))
    machine = MachineLoad(2, 2, 3.5, 4.0, 0.6)

    def steps(cpu_share: float | None, others: float | None):
        return replace(trace, device="cpu", machine=machine, steps=tuple(replace(
            s, cpu_ms=None if cpu_share is None else cpu_share * 2 * s.latency_ms,
            others_share=others) for s in trace.steps))

    assert delay_flag(steps(0.3, 0.6)) is True  # both signals of the rule
    assert delay_flag(steps(0.95, 0.6)) is False  # others ran on spare cores
    assert delay_flag(steps(None, None)) is None  # not measured: never guessed
    assert delay_flag(steps(0.3, 0.6)) == assess(steps(0.3, 0.6)).disturbed


def test_a_delayed_run_is_flagged_in_its_round(tiny_lm, monkeypatch):
    monkeypatch.setattr(cachelab, "delay_flag", lambda trace: not trace.settings.kv_cache)
    (r,) = on_off_results(cache_on_off(tiny_lm, "Hello there", [3], rounds=3))
    assert r.on_delayed == (False,) * 3 and r.off_delayed == (True,) * 3
    assert r.delayed_rounds == 3 and r.delayed(True) == 0 and r.delayed(False) == 3


def test_results_count_only_complete_rounds():
    runs = [timed(16, 0, True, 100), timed(16, 0, False, 300), timed(32, 0, True, 200),
            timed(32, 0, False, 700), timed(16, 1, True, 120), timed(16, 1, False, 320),
            timed(32, 1, True, 210)]  # the budget cut round 1 of 32 tokens before its off run
    a, b = on_off_results(runs)
    assert (a.new_tokens, a.rounds, a.on_rounds_ms) == (16, 2, (100.0, 120.0))
    assert a.median_ms(True) == statistics.median([100, 120])
    assert (b.new_tokens, b.rounds, b.off_rounds_ms) == (32, 1, (700.0,))
    assert on_off_results([timed(16, 0, True, 100)]) == ()
    unmeasured = on_off_results([timed(8, 0, True, 10, None), timed(8, 0, False, 20, None)])
    assert not unmeasured[0].measured and unmeasured[0].delayed_rounds == 0


def test_tokens_differ_when_any_round_differs():
    runs = [timed(4, 0, True, 10), timed(4, 0, False, 20), timed(4, 1, True, 10),
            timed(4, 1, False, 20, tokens=(1, 3))]
    assert not on_off_results(runs)[0].same_tokens


def test_more_tokens_in_less_time_always_says_why():
    rising = [result(16, (500, 520, 510), (900, 950, 920)),
              result(32, (1000, 1040, 990), (2900, 3000, 2950))]
    assert on_off_notes(rising) == []
    # the numbers: 16 tokens 2,216 ms, 32 tokens 1,536 ms (cache on), round 1 delayed
    delayed = [result(16, (2216, 600, 2400), (900, 950, 920), on_delayed=(True, False, True)),
               result(32, (1536, 1500, 1600), (2900, 3000, 2950))]
    (note,) = on_off_notes(delayed)
    assert note.startswith("32 tokens took less time than 16 with the cache (1,536 ms vs 2,216 ms")
    assert "delayed 2 of these 6 rounds" in note and "Run it again" in note
    overlapping = [result(16, (1000, 1100, 1500), (900, 950, 920)),
                   result(32, (980, 1200, 990), (2900, 3000, 2950))]
    (note,) = on_off_notes(overlapping)
    assert "within the spread" in note and "990 ms vs 1,100 ms" in note
    apart = [result(16, (1000, 1100, 1050), (900, 950, 920)),
             result(32, (700, 720, 710), (2900, 3000, 2950))]
    (note,) = on_off_notes(apart)
    assert "not to be trusted" in note
    single = [result(32, (700,), (3000,)), result(16, (1000,), (900,))]  # order given: any
    (note,) = on_off_notes(single)
    assert "single round" in note
    off_too = [result(16, (500,) * 3, (3000, 3100, 3050)), result(32, (900,) * 3, (2000,) * 3)]
    (note,) = on_off_notes(off_too)
    assert "without the cache" in note


def test_the_record_is_versioned_and_round_trips():
    r = result(16, (100.0, 90.0, 120.0), (300.0, 310.0, 290.0), on_delayed=(False, True, False))
    data = on_off_to_dict(r)
    assert data["version"] == ON_OFF_VERSION == 2
    back = on_off_from_dict(data)
    assert back.on_rounds_ms == r.on_rounds_ms and back.off_rounds_ms == r.off_rounds_ms
    assert back.on_delayed == r.on_delayed and back.off_delayed == r.off_delayed
    assert np.array_equal(back.on_ms, r.on_ms) and back.speedup == pytest.approx(r.speedup)
    one = on_off_from_dict(on_off_to_dict(OnOff(4, np.array([5.0, 6.0]), np.array([9.0, 30.0]),
                                                True)))
    assert one.on_rounds_ms == (11.0,) and not one.measured


def test_a_file_of_one_round_without_a_version_still_opens():
    found = experiments_from_dict({"cache_on_off": [
        {"new_tokens": 16, "on_ms": [5.0, 6.0], "off_ms": [9.0, 30.0], "same_tokens": True}]})
    (r,) = found.cache_on_off
    assert r.rounds == 1 and r.median_ms(True) == 11.0 and r.speedup == pytest.approx(39 / 11)
    assert not r.measured and r.delayed_rounds == 0
    assert "single round" in on_off_notes(
        [r, OnOff(32, np.array([5.0]), np.array([9.0]), True)])[0]


@pytest.mark.parametrize("change, message", [
    ({"version": 3}, "version 3"),
    ({"version": True}, "version True"),
    ({"off_rounds_ms": [1.0]}, "one per round"),
    ({"on_rounds_ms": [0.0, 1.0, 2.0]}, "> 0"),
    ({"on_delayed": [True, False, "x"]}, "true/false"),
    ({"off_delayed": []}, "for both runs"),
    ({"on_rounds_ms": [1.0] * 40, "off_rounds_ms": [1.0] * 40}, "one per round"),
])
def test_a_damaged_record_is_one_clear_error(change, message):
    data = {**on_off_to_dict(result(4, (1.0, 2.0, 3.0), (4.0, 5.0, 6.0),
                                    on_delayed=(False, False, True))), **change}
    with pytest.raises(TraceFormatError, match=message):
        experiments_from_dict({"cache_on_off": [data]})


def test_experiments_carry_the_rounds():
    found = Experiments(cache_on_off=(result(8, (1.0, 2.0, 3.0), (4.0, 5.0, 6.0)),))
    back = experiments_from_dict(found.to_dict())
    assert back.cache_on_off[0].on_rounds_ms == (1.0, 2.0, 3.0)
