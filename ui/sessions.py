"""SessionStore: each browser session's work, kept on the server so a reload does not lose it.

A reload (or a dropped websocket) starts a new Streamlit session with empty state. The app gives
every session a random token that it keeps in the page's URL; what the session produced (its trace,
its experiment results) is written here under that token, and a new session arriving with the token
gets a copy. A copy, under a fresh token: a link that travels to someone else gives them the work
as it was, and what they do next never lands in the original's record. Bounded three ways: entries,
total bytes (what each value really costs, `size_of`), and age since the last write.

Fair to every visitor (a shared server, a class): each record belongs to a client (a browser, or
an address: ui/clients.py), and one client's records are capped in number and bytes — past its
cap, that client's own least recently used records go, nobody else's. The clients of one address
(a class behind a school's NAT) are capped together too, at a class's size (`group_entries`,
`group_bytes`): past it, that address's own records go, a classmate's only when not recent. A
record written in the last `keep_s` seconds is never evicted for another client's room: when the
store is full of such records, the newcomer's write is refused (`put` returns False, the app says
its work is not kept) instead of somebody else's work disappearing.

A published run ("Share this view") is a record of its own under an unguessable id: written once
(`publish`), never changed, read by whoever has the link (`published`), under a name no session
token can take (`?s=` never reaches it). The app keeps published runs in a store of their own
(ui/shared.py's PUBLISHED) with `evict_own=False` and `keep_s` = its age limit: a link lasts the
time the page promises, whatever its publisher does next; a publish past a quota is refused.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

Record = dict[str, Any]


def new_token() -> str:
    return secrets.token_urlsafe(12)


def new_view_id() -> str:
    """A published run's id: 128 random bits, so a link cannot be guessed from another."""
    return secrets.token_urlsafe(16)


_PUBLISHED = "view:"  # a published run's name in the store: ':' is never in a session token


@dataclass(slots=True)
class _Entry:
    client: str
    changed: float  # the last write: the age limit and the guaranteed keep count from here
    values: Record = field(default_factory=dict)


class SessionStore:
    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float,
                 size_of: Callable[[Any], int], clock: Callable[[], float] = time.monotonic,
                 *, keep_s: float = 0.0, client_entries: int | None = None,
                 client_bytes: int | None = None, group_entries: int | None = None,
                 group_bytes: int | None = None,
                 group_of: Callable[[str], str] = lambda client: client,
                 evict_own: bool = True) -> None:
        """`evict_own` False: a client's own records are not evicted for its new ones either
        (they go by age; past a quota, the new write is refused)."""
        self.max_entries, self.max_bytes, self.ttl_s, self.keep_s = (max_entries, max_bytes,
                                                                     ttl_s, keep_s)
        self.client_entries = client_entries or max_entries
        self.client_bytes = min(client_bytes or max_bytes, max_bytes)
        self.group_entries = max(group_entries or max_entries, self.client_entries)
        self.group_bytes = max(min(group_bytes or max_bytes, max_bytes), self.client_bytes)
        self._group_of = group_of
        self.evict_own = evict_own
        self._size_of, self._clock = size_of, clock
        self._records: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        # Values by identity: a reload's copy shares the same immutable trace, so it is counted
        # once however many records hold it. id → [size, number of records holding it, value]
        self._objects: dict[int, list[Any]] = {}
        self._lock = threading.Lock()

    def put(self, token: str, key: str, value: Any, client: str = "") -> bool:
        """Set one item of this token's record (None removes it); False when it is not kept:
        larger than one client may keep, or the store is full of others' recent work (then the
        record stays as it was before this write)."""
        with self._lock:
            self._expire()
            entry = self._records.pop(token, None)
            new = entry is None
            if entry is None:
                entry = _Entry(client, self._clock())
            old = entry.values.pop(key, None)
            if value is not None:
                entry.values[key] = value
                self._hold(value)
            previous = entry.changed
            entry.changed = self._clock()
            self._records[token] = entry
            if self._unique_size(entry.values) <= self.client_bytes and self._make_room(token):
                if old is not None:
                    self._release(old)
                return True
            if value is not None:  # undo this write
                del entry.values[key]
                self._release(value)
            if old is not None:
                entry.values[key] = old
            entry.changed = previous
            if new:
                del self._records[token]
            return False

    def copy(self, token: str) -> Record | None:
        """A shallow copy of the token's record (values are immutable results), or None."""
        with self._lock:
            self._expire()
            found = self._records.get(token)
            if found is None:
                return None
            self._records.move_to_end(token)
            return dict(found.values)

    def publish(self, record: Record, client: str = "") -> str | None:
        """Keep `record` (its values are the caller's own copies) under a new id and return the
        id; None if it cannot be kept (larger than one client may keep, or no room)."""
        view_id = new_view_id()
        name = _PUBLISHED + view_id
        with self._lock:
            self._expire()
            for value in record.values():
                self._hold(value)
            self._records[name] = _Entry(client, self._clock(), dict(record))
            if self._unique_size(record) > self.client_bytes or not self._make_room(name):
                self._drop(name)
                return None
        return view_id

    def published(self, view_id: str) -> Record | None:
        """The published record `view_id` (a shallow copy: the caller copies its values before
        changing anything), or None (unknown, expired or dropped for room)."""
        return self.copy(_PUBLISHED + view_id)

    def client_usage(self, client: str) -> tuple[int, int]:
        """(records, bytes) this client holds (a value shared by its records counts once)."""
        with self._lock:
            return self._usage(client)

    def _usage(self, client: str) -> tuple[int, int]:
        return self._usage_of(lambda e: e.client == client)

    def _usage_of(self, belongs: Callable[[_Entry], bool]) -> tuple[int, int]:
        entries = [e for e in self._records.values() if belongs(e)]
        held = {id(v) for e in entries for v in e.values.values()}
        return len(entries), sum(self._objects[i][0] for i in held)

    def _make_room(self, token: str) -> bool:
        """Bring the store within its bounds after `token` was written: first that client's own
        older records, then (past its address's cap) its address's records not written in
        `keep_s`, then records of anyone not written in `keep_s`; False if not possible without
        evicting another client's recent work (nothing of others is evicted then)."""
        client = self._records[token].client
        group = self._group_of(client)
        now = self._clock()

        def ours(e: _Entry) -> bool:
            return e.client == client

        def our_group(e: _Entry) -> bool:
            return self._group_of(e.client) == group

        def old(e: _Entry) -> bool:
            return now - e.changed > self.keep_s

        def evictable(e: _Entry) -> bool:
            return (ours(e) and self.evict_own) or old(e)

        bounds = ((ours, lambda c, b: c <= self.client_entries and b <= self.client_bytes,
                   lambda e: ours(e) and evictable(e)),
                  (our_group, lambda c, b: c <= self.group_entries and b <= self.group_bytes,
                   lambda e: our_group(e) and evictable(e)),
                  (lambda e: True, lambda c, b: c <= self.max_entries and b <= self.max_bytes,
                   evictable))
        for belongs, fits, may_go in bounds:
            while not fits(*self._usage_of(belongs)):
                going = next((t for t, e in self._records.items() if t != token and may_go(e)),
                             None)
                if going is None:
                    return False
                self._drop(going)
        return True

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
        for value in self._records.pop(token).values.values():
            self._release(value)

    def _expire(self) -> None:
        now = self._clock()
        for token in [t for t, e in self._records.items() if now - e.changed > self.ttl_s]:
            self._drop(token)

    @property
    def nbytes(self) -> int:
        """Bytes of the distinct values held (a value shared by several records counts once)."""
        return sum(size for size, _, _ in self._objects.values())

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._records)
