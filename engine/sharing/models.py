"""ModelStore: the models visitors chose, each loaded once, within a memory cap.

Each visitor's (source, dtype) choice maps to its own entry, so one visitor switching to float16
never swaps the model under another visitor's run (the old single shared model did). Entries are
kept least-recently-used first out once their weights pass `max_bytes`; a model a session still
holds stays alive with that session (Python frees it when the last run drops it), so the cap bounds
what the store keeps, not what running sessions hold. The process's one compiled decoder lives here
too (a compiled graph's frozen weights must belong to the model that asks for it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from ..loader import LoadedModel, load_model

Key = tuple[str, str]  # (source, dtype)


@dataclass(eq=False)
class ModelEntry:
    """A loaded model and what is built from it on first use (each built once, under a lock)."""

    lm: LoadedModel
    extras: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def extra(self, name: str, build: Callable[[LoadedModel], Any]) -> Any:
        """`build(lm)` once per entry (the native decoder, the embedding index…)."""
        with self._lock:
            if name not in self.extras:
                self.extras[name] = build(self.lm)
            return self.extras[name]

    @property
    def nbytes(self) -> int:
        """The weights, plus what extras report holding (the native decoder's packed copy…)."""
        with self._lock:
            extras = sum(getattr(x, "nbytes", 0) for x in self.extras.values())
        return self.lm.spec.weight_bytes + int(extras)


class ModelStore:
    def __init__(self, max_bytes: int, loader: Callable[..., LoadedModel] = load_model) -> None:
        self.max_bytes = max_bytes
        self._loader = loader
        self._entries: OrderedDict[Key, ModelEntry] = OrderedDict()
        self._loading: dict[Key, threading.Lock] = {}
        self._lock = threading.Lock()
        self._compiled: tuple[Key, Any] | None = None
        self._failed: dict[Key, Exception] = {}
        self._background: set[Key] = set()

    def get(self, source: str, dtype: str) -> ModelEntry:
        """The entry for this choice, loading it if needed (one load per key, even when several
        sessions ask at once); raises what `load_model` raises (EngineError for a bad choice)."""
        key = (source, dtype)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            gate = self._loading.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    return self._entries[key]
            try:
                entry = ModelEntry(self._loader(source, dtype=dtype))
            finally:
                with self._lock:
                    self._loading.pop(key, None)  # a failed load leaves nothing behind
            with self._lock:
                self._entries[key] = entry
                self._evict(keep=key)
            return entry

    def peek(self, source: str, dtype: str) -> ModelEntry | None:
        """The entry if it is loaded; never loads, never waits."""
        with self._lock:
            return self._entries.get((source, dtype))

    def load_in_background(self, source: str, dtype: str) -> None:
        """Start loading in a thread (once: a load under way is not started again); a failure
        is kept for `failure()`. For a page that must draw before the model is ready."""
        key = (source, dtype)
        with self._lock:
            if key in self._entries or key in self._loading or key in self._background:
                return
            self._failed.pop(key, None)
            self._background.add(key)

        def load() -> None:
            try:
                self.get(source, dtype)
            except Exception as err:  # noqa: BLE001 — reported to the page by failure()
                with self._lock:
                    self._failed[key] = err
            finally:
                with self._lock:
                    self._background.discard(key)

        threading.Thread(target=load, name=f"load {source} {dtype}", daemon=True).start()

    def failure(self, source: str, dtype: str) -> Exception | None:
        with self._lock:
            return self._failed.get((source, dtype))

    def _evict(self, keep: Key) -> None:
        while sum(e.nbytes for e in self._entries.values()) > self.max_bytes:
            oldest = next((k for k in self._entries if k != keep), None)
            if oldest is None:
                return
            del self._entries[oldest]
            if self._compiled is not None and self._compiled[0] == oldest:
                self._compiled = None

    def compiled(self, key: Key, build: Callable[[LoadedModel], Any]) -> Any:
        """The one compiled decoder, for `key`'s model (a new key replaces the old one). Not
        remembered if the model was evicted meanwhile: the caller still gets a working one."""
        entry = self.get(*key)
        with self._lock:
            if self._compiled is None or self._compiled[0] != key:
                decoder = build(entry.lm)
                if key not in self._entries:
                    return decoder
                self._compiled = (key, decoder)
            return self._compiled[1]

    @property
    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._entries)
