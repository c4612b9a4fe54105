"""The queue's wait estimate comes from measured run times, per kind of job, on a fake clock."""

from __future__ import annotations

import statistics
import threading
import time

from ui.experiment import job_kind, wait_text
from ui.turns import FairLock, estimate_wait_s, remaining_s


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def hold(lock: FairLock, clock: FakeClock, kind: str, seconds: float) -> None:
    lock.acquire(kind=kind)
    clock.now += seconds
    lock.release()


def test_the_estimate_is_the_holders_kind_not_every_run():
    """Generations take about 4 s; one long sweep ran too. A waiter behind a generation that has
    run 1 s waits about 3 s — not the 12 s that one median over every kind of run gave."""
    clock = FakeClock()
    lock = FairLock(clock=clock)
    for seconds in (4.2, 3.8, 4.0):
        hold(lock, clock, "generate", seconds)
    for seconds in (12.0, 40.0, 13.0, 12.5):
        hold(lock, clock, "sweep", seconds)
    assert lock.typical_hold_s == 12.0  # the old estimate's base, any kind
    lock.acquire(kind="generate")
    clock.now += 1.0
    assert lock.wait_estimate_s(1, 1.0) == statistics.median([4.2, 3.8, 4.0]) - 1.0
    lock.release()


def test_a_waiter_adds_the_jobs_ahead_of_it():
    clock = FakeClock()
    lock = FairLock(clock=clock)
    for kind, seconds in (("generate", 4.0), ("generate", 6.0), ("sweep", 30.0)):
        hold(lock, clock, kind, seconds)
    lock.acquire(kind="generate")  # the holder
    seen: list[float | None] = []
    ahead = threading.Thread(target=lambda: lock.acquire(kind="sweep"))
    ahead.start()
    while lock.waiting < 1:
        time.sleep(0.001)

    def on_wait(place: int, held_s: float) -> None:
        seen.append(lock.wait_estimate_s(place, held_s))
        raise TimeoutError  # one look is enough: leave the queue

    clock.now += 2.0
    try:
        lock.acquire(on_wait=on_wait, kind="generate")
    except TimeoutError:
        pass
    assert seen == [(5.0 - 2.0) + 30.0]  # the holder's remaining median, then the sweep's time
    lock.release()
    ahead.join(5)
    lock.release()


def test_a_job_past_its_usual_time_is_compared_with_the_long_ones():
    assert remaining_s([4.0, 4.0, 20.0, 30.0], 1.0) == statistics.median([4, 4, 20, 30]) - 1.0
    assert remaining_s([4.0, 4.0, 20.0, 30.0], 10.0) == 25.0 - 10.0
    assert remaining_s([4.0, 5.0], 9.0) is None  # longer than any recent run: no guess


def test_no_estimate_without_measurements():
    lock = FairLock(clock=FakeClock())
    assert lock.typical_hold_s is None and lock.wait_estimate_s(1, 0.0) is None
    history = {"a": (2.0,), "b": ()}.get
    assert estimate_wait_s(lambda k: history(k, ()), "a", 0.5, ["b"]) is None
    assert estimate_wait_s(lambda k: history(k, ()), "a", 0.5, []) == 1.5


def test_an_unmeasured_kind_borrows_every_kinds_times():
    clock = FakeClock()
    lock = FairLock(clock=clock)
    for seconds in (2.0, 4.0, 9.0):
        hold(lock, clock, "generate", seconds)
    lock.acquire(kind="new page action")
    assert lock.wait_estimate_s(1, 0.0) == 4.0
    lock.release()


def test_the_waiting_notice_says_where_its_estimate_comes_from():
    text = wait_text(1, 1.0, 3.2)
    assert "yours is next" in text and "about 3 s" in text and "measured times" in text
    assert "any moment" in wait_text(2, 4.0, 0.4) and "2 runs are ahead" in wait_text(2, 4.0, 0.4)
    assert "no estimate yet" in wait_text(1, 30.0, None)
    assert "about" not in wait_text(1, 0.2, None)  # nothing measured yet: no claim


def test_a_job_kind_is_the_function_that_does_it():
    def sweep(job):
        return job

    assert job_kind(sweep).endswith("test_a_job_kind_is_the_function_that_does_it.<locals>.sweep")
    assert job_kind(sweep) != job_kind(lambda job: job)
