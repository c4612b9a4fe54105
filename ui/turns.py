"""FairLock: one run of the shared model at a time, the turn rotating between clients.

`threading.Lock` wakes waiters in no set order (eight waiting sessions can finish 7, 6, 5, 4…).
Here each `acquire` takes a ticket, and names its client (the visitor: ui/clients.py). When the
lock is released it goes to the earliest ticket of the waiting client served least recently (a
client never served first; ties by ticket order): a client's next run queues behind every other
client who waits, so a visitor with four tabs running long jobs delays another visitor by one job,
not four. Within one client the tickets keep their order. A waiter learns its place in that grant
order (for "you are 2nd in line") and how long the current holder has held the lock, and may
give up (its ticket leaves the queue, so nobody waits behind a visitor who left).

Each turn may name its kind of job (a page's action); the lock keeps the recent measured hold
times per kind, and `wait_estimate_s` adds up what the jobs that will run before a waiter (in
grant order) typically take (`estimate_wait_s`) — a generation of a few tokens and a
minute-long sweep are not averaged into one "typical run". The clock is injectable, so the
estimate is tested without waiting.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import statistics
import threading
import time
from collections import OrderedDict, deque
from typing import Callable, Iterator, Sequence

Waiting = Callable[[int, float], None]  # (place in the queue, 1 = next; seconds the holder has held)
HISTORY = 20  # recent hold times kept per kind of job
CLIENTS = 4096  # clients whose last turn is remembered (the rotation's order)


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
    """The model turn: `acquire`/`release` or `turn()`, granted round-robin by client (see the
    module's docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._cond = threading.Condition()
        self._clock = clock
        self._holder: int | None = None  # the ticket holding the lock
        self._holder_kind = ""
        # waiting tickets → (client, kind), in ticket order (tickets only grow)
        self._waiting: dict[int, tuple[str, str]] = {}
        # clients by when they were last granted the lock, least recent first; bounded: a client
        # dropped from the front was the least recently served, and counts as never served
        self._served: OrderedDict[str, None] = OrderedDict()
        self._tickets = itertools.count()
        self._held_since = 0.0
        self._holds: deque[float] = deque(maxlen=HISTORY)  # recent hold times, any kind
        self._by_kind: dict[str, deque[float]] = {}  # kind → its recent hold times

    def acquire(self, on_wait: Waiting | None = None, poll_s: float = 0.5, kind: str = "",
                client: str = "") -> None:
        """Block until this caller's turn. `on_wait` is called about every `poll_s` seconds while
        waiting; if it raises (the visitor left, or pressed Stop), the ticket is given back.
        `kind` names the job, for the wait estimates of those behind it; `client` the visitor
        it is for, whose turns rotate with other visitors' (one name for every caller: first
        come, first served)."""
        with self._cond:
            ticket = next(self._tickets)
            self._waiting[ticket] = (client, kind)
            if self._holder is None:
                self._grant()
            try:
                while self._holder != ticket:
                    if on_wait is not None:
                        place = self._order().index(ticket) + 1
                        held = self._clock() - self._held_since
                        self._cond.release()
                        try:
                            on_wait(place, held)
                        finally:
                            self._cond.acquire()
                        if self._holder == ticket:
                            break
                    self._cond.wait(poll_s)
            except BaseException:
                if self._holder == ticket:  # granted while giving up: it never ran, pass it on
                    self._holder = None
                    self._grant()
                else:
                    del self._waiting[ticket]
                self._cond.notify_all()
                raise

    def release(self) -> None:
        with self._cond:
            if self._holder is None:
                raise RuntimeError("release of an unheld FairLock")
            held = self._clock() - self._held_since
            self._holds.append(held)
            self._by_kind.setdefault(self._holder_kind, deque(maxlen=HISTORY)).append(held)
            self._holder = None
            self._grant()
            self._cond.notify_all()

    def _order(self) -> list[int]:
        """The waiting tickets in the order they will be granted, if no one else comes or
        leaves: the rotation played forward — each time, the earliest ticket of the client
        served least recently (never served: first; ties by ticket), who then counts as served
        last."""
        rank = {client: i for i, client in enumerate(self._served)}
        tickets: dict[str, deque[int]] = {}
        for ticket, (client, _kind) in self._waiting.items():
            tickets.setdefault(client, deque()).append(ticket)
        heap = [(rank.get(client, -1), queue[0], client) for client, queue in tickets.items()]
        heapq.heapify(heap)
        order, served = [], len(rank)
        while heap:
            _rank, ticket, client = heapq.heappop(heap)
            order.append(ticket)
            queue = tickets[client]
            queue.popleft()
            if queue:
                heapq.heappush(heap, (served, queue[0], client))
                served += 1
        return order

    def _grant(self) -> None:
        """Hand the free lock to the first ticket in grant order (if any waits); the waiter
        wakes on the caller's notify. Its hold time counts from now."""
        if not self._waiting:
            return
        ticket = self._order()[0]
        client, self._holder_kind = self._waiting.pop(ticket)
        self._holder = ticket
        self._held_since = self._clock()
        self._served[client] = None
        self._served.move_to_end(client)
        while len(self._served) > CLIENTS:
            self._served.popitem(last=False)

    @property
    def typical_hold_s(self) -> float | None:
        """Median of the recent hold times of any kind (None before any)."""
        with self._cond:
            return statistics.median(self._holds) if self._holds else None

    def _history(self, kind: str) -> tuple[float, ...]:
        """Recent hold times of this kind of job; of any kind when none of it is measured yet."""
        return tuple(self._by_kind.get(kind) or self._holds)

    def wait_estimate_s(self, place: int, held_s: float) -> float | None:
        """Seconds until the waiter at `place` (1 = next, in grant order) gets the turn, from the
        measured hold times of the holder's kind and of each job granted before it
        (`estimate_wait_s`): the jobs that will really run first, not the tickets taken first."""
        with self._cond:
            if self._holder is None or place < 1:
                return None
            ahead = [self._waiting[t][1] for t in self._order()[:place - 1]]
            return estimate_wait_s(self._history, self._holder_kind, held_s, ahead)

    @contextlib.contextmanager
    def turn(self, on_wait: Waiting | None = None, kind: str = "",
             client: str = "") -> Iterator[None]:
        self.acquire(on_wait, kind=kind, client=client)
        try:
            yield
        finally:
            self.release()

    @property
    def waiting(self) -> int:
        """How many callers wait (not counting the holder)."""
        with self._cond:
            return len(self._waiting)

    def locked(self) -> bool:
        with self._cond:
            return self._holder is not None
