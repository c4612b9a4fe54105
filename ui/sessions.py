"""SessionStore: each browser session's work, kept on the server so a reload does not lose it.

A reload (or a dropped websocket) starts a new Streamlit session with empty state. The app gives
every session a random token that it keeps in the page's URL; what the session produced (its trace,
its experiment results) is written here under that token, and a new session arriving with the token
gets a copy. A copy, under a fresh token: a link that travels to someone else gives them the work
as it was, and what they do next never lands in the original's record. Bounded three ways: entries
(least recently used out), total bytes (estimated by `size_of`), and age since the last write.

A published run ("Share this view") is a record of its own under an unguessable id: written once
(`publish`), never changed, read by whoever has the link (`published`). It counts against the same
three bounds as the sessions, under a name no session token can take (`?s=` never reaches it).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

Record = dict[str, Any]


def new_token() -> str:
    return secrets.token_urlsafe(12)


def new_view_id() -> str:
    """A published run's id: 128 random bits, so a link cannot be guessed from another."""
    return secrets.token_urlsafe(16)


_PUBLISHED = "view:"  # a published run's name in the store: ':' is never in a session token


class SessionStore:
    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float,
                 size_of: Callable[[Any], int], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.max_entries, self.max_bytes, self.ttl_s = max_entries, max_bytes, ttl_s
        self._size_of, self._clock = size_of, clock
        self._records: OrderedDict[str, tuple[float, Record]] = OrderedDict()
        # Values by identity: a reload's copy shares the same immutable trace, so it is counted
        # once however many records hold it. id → [size, number of records holding it, value]
        self._objects: dict[int, list[Any]] = {}
        self._lock = threading.Lock()

    def put(self, token: str, key: str, value: Any) -> None:
        """Set one item of this token's record (None removes it)."""
        with self._lock:
            self._expire()
            _, record = self._records.pop(token, (0.0, {}))
            old = record.pop(key, None)
            if old is not None:
                self._release(old)
            if value is not None:
                record[key] = value
                self._hold(value)
            self._records[token] = (self._clock(), record)
            if self._unique_size(record) > self.max_bytes:  # too large on its own: not kept
                self._drop(token)
                return
            self._trim()

    def copy(self, token: str) -> Record | None:
        """A shallow copy of the token's record (values are immutable results), or None."""
        with self._lock:
            self._expire()
            found = self._records.get(token)
            if found is None:
                return None
            self._records.move_to_end(token)
            return dict(found[1])

    def publish(self, record: Record) -> str | None:
        """Keep `record` (its values are the caller's own copies) under a new id and return the
        id; None if it is larger than the whole store."""
        view_id = new_view_id()
        with self._lock:
            self._expire()
            for value in record.values():
                self._hold(value)
            self._records[_PUBLISHED + view_id] = (self._clock(), dict(record))
            if self._unique_size(record) > self.max_bytes:
                self._drop(_PUBLISHED + view_id)
                return None
            self._trim()
        return view_id if self.published(view_id) is not None else None

    def published(self, view_id: str) -> Record | None:
        """The published record `view_id` (a shallow copy: the caller copies its values before
        changing anything), or None (unknown, expired or dropped for room)."""
        return self.copy(_PUBLISHED + view_id)

    def _hold(self, value: Any) -> None:
        entry = self._objects.setdefault(id(value), [self._size_of(value), 0, value])
        entry[1] += 1

    def _release(self, value: Any) -> None:
        entry = self._objects[id(value)]
        entry[1] -= 1
        if entry[1] == 0:
            del self._objects[id(value)]

    def _unique_size(self, record: Record) -> int:
        return sum(self._objects[id(v)][0] for v in {id(v): v for v in record.values()}.values())

    def _drop(self, token: str) -> None:
        _, record = self._records.pop(token)
        for value in record.values():
            self._release(value)

    def _expire(self) -> None:
        now = self._clock()
        for token in [t for t, (at, _) in self._records.items() if now - at > self.ttl_s]:
            self._drop(token)

    def _trim(self) -> None:
        while len(self._records) > self.max_entries or self.nbytes > self.max_bytes:
            self._drop(next(iter(self._records)))  # least recently used first

    @property
    def nbytes(self) -> int:
        """Bytes of the distinct values held (a value shared by several records counts once)."""
        return sum(size for size, _, _ in self._objects.values())

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._records)
