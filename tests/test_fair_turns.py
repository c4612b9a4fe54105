"""The model turn rotates between clients, not tabs (ui/turns.py): one visitor's four tabs delay
another visitor by the run in progress, not by four runs; the place and the wait estimate a
waiter is told follow that order. Real threads; the lock grants at release, so the order in which
the waiting threads run is the grant order, whatever the scheduler does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from ui import experiment, shared
from ui.turns import FairLock

from .test_wait_estimate import FakeClock


class Left(Exception):
    """The visitor closed the tab."""


def until(done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


class Visitors:
    """Waiting tabs, each a thread that takes the turn, notes its name and gives the turn back.
    `places[name]`: every place (1 = next) that tab was told while it waited."""

    def __init__(self, lock: FairLock) -> None:
        self.lock = lock
        self.order: list[str] = []
        self.places: dict[str, list[int]] = {}
        self.threads: list[threading.Thread] = []

    def tab(self, name: str, client: str, kind: str = "") -> None:
        """Queue one tab's run; return once its ticket is in the queue and it was told its
        place."""
        self.places[name] = []

        def run() -> None:
            self.lock.acquire(on_wait=lambda place, _held: self.places[name].append(place),
                              poll_s=0.005, kind=kind, client=client)
            self.order.append(name)
            self.lock.release()

        waiting = self.lock.waiting
        self.threads.append(threading.Thread(target=run, daemon=True))
        self.threads[-1].start()
        until(lambda: self.lock.waiting == waiting + 1 and self.places[name])

    def told_now(self) -> dict[str, int]:
        """Each tab's place as told after the last arrival (the lists are cleared, then each
        waiter's next report is taken)."""
        for places in self.places.values():
            places.clear()
        until(lambda: all(self.places.values()))
        return {name: places[-1] for name, places in self.places.items()}

    def finish(self) -> list[str]:
        for thread in self.threads:
            thread.join(10)
            assert not thread.is_alive()
        return self.order


def test_a_visitors_four_tabs_delay_another_visitor_by_one_run():
    """Visitor A's four tabs press Generate first (one runs, three wait), then visitor B once: B
    goes right after A's run in progress — the finding was B waiting behind all four."""
    lock = FairLock()
    lock.acquire(client="A")  # A's first tab runs
    tabs = Visitors(lock)
    for name in ("A2", "A3", "A4"):
        tabs.tab(name, "A")
    tabs.tab("B1", "B")
    lock.release()
    assert tabs.finish() == ["B1", "A2", "A3", "A4"]


def test_two_visitors_with_four_tabs_each_take_turns():
    lock = FairLock()
    lock.acquire(client="A")
    tabs = Visitors(lock)
    for name in ("A2", "A3", "A4", "B1", "B2", "B3", "B4"):
        tabs.tab(name, name[0])
    lock.release()
    assert tabs.finish() == ["B1", "A2", "B2", "A3", "B3", "A4", "B4"]


def test_the_waiter_of_another_visitor_is_told_it_is_next():
    """B is told place 1 (not 4); A's last tab, told 3 before B came, is told 4 after."""
    lock = FairLock()
    lock.acquire(client="A")
    tabs = Visitors(lock)
    for name in ("A2", "A3", "A4"):
        tabs.tab(name, "A")
    assert tabs.told_now() == {"A2": 1, "A3": 2, "A4": 3}
    tabs.tab("B1", "B")
    assert tabs.places["B1"] == [1] * len(tabs.places["B1"])
    assert tabs.told_now() == {"A2": 2, "A3": 3, "A4": 4, "B1": 1}
    lock.release()
    tabs.finish()


def test_the_place_told_is_the_order_granted():
    """Three visitors with 3, 1 and 2 tabs, arriving interleaved; C was served a while ago, so
    the never-served B comes first, then C, then A (who holds the turn now), and so on."""
    lock = FairLock()
    with lock.turn(client="C"):
        pass
    lock.acquire(client="A")
    tabs = Visitors(lock)
    for name in ("A2", "C1", "A3", "B1", "C2", "A4"):
        tabs.tab(name, name[0])
    told = tabs.told_now()
    lock.release()
    order = tabs.finish()
    assert order == ["B1", "C1", "A2", "C2", "A3", "A4"]
    assert {name: order.index(name) + 1 for name in order} == told


def test_the_wait_estimate_counts_only_the_runs_that_go_first():
    """A's long runs take 15 s; B's "Hi" arrives 3 s into A's first, behind A's three other
    tabs: B's estimate is the 12 s A's run has left, not 12 s + three more 15 s runs (the
    finding's queue said "about 24 s" and the wait was 63 s)."""
    clock = FakeClock()
    lock = FairLock(clock=clock)
    for _ in range(3):
        lock.acquire(kind="long", client="A")
        clock.now += 15.0
        lock.release()
    lock.acquire(kind="long", client="A")
    tabs = Visitors(lock)
    for name in ("A2", "A3", "A4"):
        tabs.tab(name, "A", kind="long")
    clock.now += 3.0
    seen: list[tuple[int, float | None]] = []

    def on_wait(place: int, held_s: float) -> None:
        seen.append((place, lock.wait_estimate_s(place, held_s)))
        raise Left

    with pytest.raises(Left):
        lock.acquire(on_wait=on_wait, kind="hi", client="B")
    assert seen == [(1, 12.0)]
    assert lock.wait_estimate_s(3, 3.0) == 12.0 + 2 * 15.0  # A4: behind A2 and A3, as granted
    lock.release()
    tabs.finish()


def test_one_visitors_tabs_keep_their_order():
    lock = FairLock()
    lock.acquire(client="A")
    tabs = Visitors(lock)
    names = ["A2", "B1", "A3", "B2", "A4", "A5"]
    for name in names:
        tabs.tab(name, name[0])
    lock.release()
    order = tabs.finish()
    for client in "AB":
        assert [n for n in order if n[0] == client] == [n for n in names if n[0] == client]


def test_a_visitor_who_leaves_gives_the_turn_to_the_next():
    """B leaves while waiting: its ticket goes, and the places of those behind it move up."""
    lock = FairLock()
    lock.acquire(client="A")
    tabs = Visitors(lock)
    tabs.tab("A2", "A")
    places: list[int] = []

    def on_wait(place: int, _held_s: float) -> None:
        places.append(place)
        raise Left

    with pytest.raises(Left):
        lock.acquire(on_wait=on_wait, client="B")
    assert places == [1] and lock.waiting == 1
    assert tabs.told_now() == {"A2": 1}
    lock.release()
    assert tabs.finish() == ["A2"]
    assert not lock.locked()


def test_a_turn_granted_to_a_visitor_who_is_leaving_passes_on():
    """The turn comes while B's waiting callback runs, and B leaves: the turn goes to the next
    waiter (A2), not to no one."""
    lock = FairLock()
    lock.acquire(client="A")
    tabs = Visitors(lock)
    gate = threading.Event()

    def on_wait(_place: int, _held_s: float) -> None:
        if not gate.is_set():
            gate.set()
            tabs.tab("A2", "A")  # queued behind B
            lock.release()  # A's run ends: B, the client least recently served, is granted
            raise Left

    with pytest.raises(Left):
        lock.acquire(on_wait=on_wait, poll_s=0.005, client="B")
    assert tabs.finish() == ["A2"]
    assert not lock.locked() and lock.waiting == 0


def test_a_session_takes_the_turn_as_its_client(monkeypatch):
    """model_turn names the session's client (ui/clients.py), so tabs of one visitor rotate as
    one."""
    clients: list[str] = []

    class Recording(FairLock):
        def acquire(self, *args, **kwargs) -> None:
            clients.append(kwargs.get("client", ""))
            super().acquire(*args, **kwargs)

    monkeypatch.setattr(shared, "LOCK", Recording())
    monkeypatch.setattr(experiment, "current_client", lambda: "10.0.0.7")
    with experiment.model_turn():
        pass
    assert clients == ["10.0.0.7"]
