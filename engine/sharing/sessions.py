"""SessionStore: each browser session's work, kept on the server so a reload does not lose it.

A reload (or a dropped websocket) starts a new Streamlit session with empty state. The app gives
every session a random token that it keeps in the page's URL; what the session produced (its trace,
its experiment results) is written here under that token, and a new session arriving with the token
gets a copy. A copy, under a fresh token: a link that travels to someone else gives them the work
as it was, and what they do next never lands in the original's record. Bounded three ways: entries
(least recently used out), total bytes (estimated by `size_of`), and age since the last write.
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


class SessionStore:
    def __init__(self, max_entries: int, max_bytes: int, ttl_s: float,
                 size_of: Callable[[Any], int], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.max_entries, self.max_bytes, self.ttl_s = max_entries, max_bytes, ttl_s
        self._size_of, self._clock = size_of, clock
        self._records: OrderedDict[str, tuple[float, int, Record]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, token: str, key: str, value: Any) -> None:
        """Set one item of this token's record (None removes it)."""
        with self._lock:
            _, _, record = self._records.pop(token, (0.0, 0, {}))
            record = {k: v for k, v in record.items() if k != key}
            if value is not None:
                record[key] = value
            size = sum(self._size_of(v) for v in record.values())
            self._records[token] = (self._clock(), size, record)
            self._trim(keep=token)

    def copy(self, token: str) -> Record | None:
        """A shallow copy of the token's record (values are immutable results), or None."""
        with self._lock:
            self._expire()
            found = self._records.get(token)
            return dict(found[2]) if found else None

    def _expire(self) -> None:
        now = self._clock()
        for token in [t for t, (at, _, _) in self._records.items() if now - at > self.ttl_s]:
            del self._records[token]

    def _trim(self, keep: str) -> None:
        self._expire()
        while len(self._records) > self.max_entries or self.nbytes > self.max_bytes:
            oldest = next(iter(self._records))
            if oldest == keep:
                if len(self._records) == 1:  # one record over the cap on its own: not kept
                    del self._records[keep]
                    return
                self._records.move_to_end(keep)
                continue
            del self._records[oldest]

    @property
    def nbytes(self) -> int:
        return sum(size for _, size, _ in self._records.values())

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._records)
