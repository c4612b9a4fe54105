"""FairLock: one run of the shared model at a time, granted first come, first served.

`threading.Lock` wakes waiters in no set order (eight waiting sessions can finish 7, 6, 5, 4…).
Here each `acquire` takes a ticket; the lock goes to the oldest ticket. A waiter learns its place
in the queue (for "you are 2nd in line") and how long the current holder has held the lock, and
may give up (its ticket leaves the queue, so nobody waits behind a visitor who left).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import deque
from typing import Callable, Iterator

Waiting = Callable[[int, float], None]  # (place in the queue, 1 = next; seconds the holder has held)


class FairLock:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[int] = deque()  # tickets; the first one holds the lock
        self._tickets = itertools.count()
        self._held_since = 0.0
        self._holds: deque[float] = deque(maxlen=20)  # recent hold times, for estimates

    def acquire(self, on_wait: Waiting | None = None, poll_s: float = 0.5) -> None:
        """Block until this caller's turn. `on_wait` is called about every `poll_s` seconds while
        waiting; if it raises (the visitor left, or pressed Stop), the ticket is given back."""
        with self._cond:
            ticket = next(self._tickets)
            self._queue.append(ticket)
            try:
                while self._queue[0] != ticket:
                    if on_wait is not None:
                        place, held = self._queue.index(ticket), time.monotonic() - self._held_since
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
                self._cond.notify_all()
                raise
            self._held_since = time.monotonic()

    def release(self) -> None:
        with self._cond:
            if not self._queue:
                raise RuntimeError("release of an unheld FairLock")
            self._queue.popleft()
            self._holds.append(time.monotonic() - self._held_since)
            self._cond.notify_all()

    @property
    def typical_hold_s(self) -> float | None:
        """Median of the recent hold times (None before any): the base of a wait estimate."""
        with self._cond:
            if not self._holds:
                return None
            return sorted(self._holds)[len(self._holds) // 2]

    @contextlib.contextmanager
    def turn(self, on_wait: Waiting | None = None) -> Iterator[None]:
        self.acquire(on_wait)
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
