"""What visitors of one app process share (ui/turns.py, ui/sessions.py): the fair model turn
and the session records."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ui.sessions import SessionStore
from ui.turns import FairLock


def test_waiters_are_served_first_come_first_served():
    lock, order = FairLock(), []
    lock.acquire()

    def visitor(i: int) -> None:
        with lock.turn():
            order.append(i)

    threads = []
    for i in range(8):
        threads.append(threading.Thread(target=visitor, args=(i,)))
        threads[-1].start()
        while lock.waiting < i + 1:  # visitor i is in the queue before i + 1 arrives
            time.sleep(0.001)
    lock.release()
    for t in threads:
        t.join(10)
    assert order == list(range(8))


def test_a_waiter_learns_its_place_and_can_give_up():
    lock, places = FairLock(), []
    lock.acquire()
    first = threading.Thread(target=lock.acquire)
    first.start()
    while lock.waiting < 1:
        time.sleep(0.001)

    class Left(Exception):
        pass

    def on_wait(place: int, held_s: float) -> None:
        places.append((place, held_s >= 0))
        raise Left  # the visitor closed the tab

    with pytest.raises(Left):
        lock.acquire(on_wait=on_wait, poll_s=0.01)
    assert places == [(2, True)] and lock.waiting == 1  # its ticket left the queue
    lock.release()
    first.join(5)
    assert lock.locked()  # the first waiter holds it now; nobody waits behind a visitor who left
    lock.release()
    assert not lock.locked()


def _sized(value) -> int:
    return int(value.nbytes) if isinstance(value, np.ndarray) else 10


def test_session_records_are_copies_bounded_in_count_bytes_and_age():
    now = [0.0]
    store = SessionStore(max_entries=3, max_bytes=1000, ttl_s=60, size_of=_sized,
                         clock=lambda: now[0])
    store.put("a", "trace", np.zeros(50))  # 400 bytes
    copy = store.copy("a")
    copy["trace"] = "changed"
    assert isinstance(store.copy("a")["trace"], np.ndarray)  # the record itself did not change
    store.put("b", "trace", np.zeros(50))
    store.put("c", "trace", np.zeros(50))  # 1,200 bytes > 1,000: "a", the oldest, goes
    assert store.copy("a") is None and store.copy("b") is not None
    store.put("d", "prompt", "hi")
    store.put("e", "prompt", "hi")  # four records > 3: the oldest goes
    assert len(store) == 3 and store.nbytes <= 1000
    now[0] = 61.0
    assert store.copy("d") is None and len(store) == 0  # expired
    store.put("big", "trace", np.zeros(500))  # alone over the byte cap: not kept
    assert store.copy("big") is None


def test_putting_none_removes_an_item():
    store = SessionStore(4, 1000, 60, _sized)
    store.put("a", "trace", "x")
    store.put("a", "trace", None)
    assert store.copy("a") == {}


def test_a_value_shared_by_several_records_counts_once():
    """Every reload copies a record under a new token; the trace in it is the same object, so
    five reloads of a 400-byte trace hold 400 bytes, not 2,000 (which would evict others)."""
    store = SessionStore(max_entries=10, max_bytes=1000, ttl_s=60, size_of=_sized)
    trace = np.zeros(50)
    for token in "abcde":
        store.put(token, "trace", trace)
    assert store.nbytes == 400 and len(store) == 5
    store.put("f", "trace", np.zeros(50))
    assert store.nbytes == 800 and store.copy("a") is not None
    for token in "abcde":
        store.put(token, "trace", None)
    assert store.nbytes == 400


def test_reading_a_record_keeps_it_from_being_the_oldest():
    store = SessionStore(max_entries=2, max_bytes=1000, ttl_s=60, size_of=_sized)
    store.put("a", "prompt", "x")
    store.put("b", "prompt", "y")
    store.copy("a")  # a reload read "a": "b" is now the least recently used
    store.put("c", "prompt", "z")
    assert store.copy("a") is not None and store.copy("b") is None
