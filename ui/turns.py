"""FairLock: one run of the shared model at a time, granted first come, first served.

`threading.Lock` wakes waiters in no set order (eight waiting sessions can finish 7, 6, 5, 4…).
Here each `acquire` takes a ticket; the lock goes to the oldest ticket. A waiter learns its place
in the queue (for "you are 2nd in line") and how long the current holder has held the lock, and
may give up (its ticket leaves the queue, so nobody waits behind a visitor who left).

Each turn may name its kind of job (a page's action); the lock keeps the recent measured hold
times per kind, and `wait_estimate_s` adds up what the jobs ahead of a waiter typically take
(`estimate_wait_s`) — a generation of a few tokens and a minute-long sweep are not averaged into
one "typical run". The clock is injectable, so the estimate is tested without waiting.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import threading
import time
from collections import deque
from typing import Callable, Iterator, Sequence

Waiting = Callable[[int, float], None]  # (place in the queue, 1 = next; seconds the holder has held)
HISTORY = 20  # recent hold times kept per kind of job


def remaining_s(holds: Sequence[float], held_s: float) -> float | None:
    """How much longer a job that has run `held_s` seconds will likely run: the median of the
    recent jobs (of its kind) that ran longer than that, minus `held_s` — a job past the usual
    time is compared with the long ones only. None when no recent job ran that long."""
    longer = [h for h in holds if h > held_s]
    return statistics.median(longer) - held_s if longer else None


def estimate_wait_s(history: Callable[[str], Sequence[float]], holder: str, held_s: float,
                    ahead: Sequence[str]) -> float | None:
    """Seconds until a waiter's turn: what the holder (a job of kind `holder`, running for
    `held_s` s) likely has left, plus the median recent time of each kind in `ahead` (the
    waiters before this one). `history(kind)`: recent hold times of that kind (of any kind when
    none of it yet). None when there is nothing to estimate from."""
    left = remaining_s(history(holder), held_s)
    if left is None:
        return None
    rest = [history(kind) for kind in ahead]
    if any(not times for times in rest):
        return None
    return left + sum(statistics.median(times) for times in rest)


class FairLock:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._cond = threading.Condition()
        self._clock = clock
        self._queue: deque[int] = deque()  # tickets; the first one holds the lock
        self._kinds: dict[int, str] = {}  # ticket → its kind of job
        self._tickets = itertools.count()
        self._held_since = 0.0
        self._holds: deque[float] = deque(maxlen=HISTORY)  # recent hold times, any kind
        self._by_kind: dict[str, deque[float]] = {}  # kind → its recent hold times

    def acquire(self, on_wait: Waiting | None = None, poll_s: float = 0.5, kind: str = "") -> None:
        """Block until this caller's turn. `on_wait` is called about every `poll_s` seconds while
        waiting; if it raises (the visitor left, or pressed Stop), the ticket is given back.
        `kind` names the job, for the wait estimates of those behind it."""
        with self._cond:
            ticket = next(self._tickets)
            self._queue.append(ticket)
            self._kinds[ticket] = kind
            try:
                while self._queue[0] != ticket:
                    if on_wait is not None:
                        place, held = self._queue.index(ticket), self._clock() - self._held_since
                        self._cond.release()
                        try:
                            on_wait(place, held)
                        finally:
                            self._cond.acquire()
                        if self._queue[0] == ticket:
                            break
                    self._cond.wait(poll_s)
            except BaseException:
                self._queue.remove(ticket)
                self._kinds.pop(ticket, None)
                self._cond.notify_all()
                raise
            self._held_since = self._clock()

    def release(self) -> None:
        with self._cond:
            if not self._queue:
                raise RuntimeError("release of an unheld FairLock")
            kind = self._kinds.pop(self._queue.popleft(), "")
            held = self._clock() - self._held_since
            self._holds.append(held)
            self._by_kind.setdefault(kind, deque(maxlen=HISTORY)).append(held)
            self._cond.notify_all()

    @property
    def typical_hold_s(self) -> float | None:
        """Median of the recent hold times of any kind (None before any)."""
        with self._cond:
            return statistics.median(self._holds) if self._holds else None

    def _history(self, kind: str) -> tuple[float, ...]:
        """Recent hold times of this kind of job; of any kind when none of it is measured yet."""
        return tuple(self._by_kind.get(kind) or self._holds)

    def wait_estimate_s(self, place: int, held_s: float) -> float | None:
        """Seconds until the waiter at `place` (1 = next) gets the turn, from the measured hold
        times of the holder's kind and of each kind ahead of it (`estimate_wait_s`)."""
        with self._cond:
            queue = list(self._queue)
            if not queue or place < 1:
                return None
            kinds = [self._kinds.get(t, "") for t in queue[:place]]
            return estimate_wait_s(self._history, kinds[0], held_s, kinds[1:])

    @contextlib.contextmanager
    def turn(self, on_wait: Waiting | None = None, kind: str = "") -> Iterator[None]:
        self.acquire(on_wait, kind=kind)
        try:
            yield
        finally:
            self.release()

    @property
    def waiting(self) -> int:
        """How many callers wait (not counting the holder)."""
        with self._cond:
            return max(len(self._queue) - 1, 0)

    def locked(self) -> bool:
        with self._cond:
            return bool(self._queue)
