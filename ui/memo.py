"""One memo for every page: a value computed once per session for each new key, so a page's
reruns (every widget click reruns it) do not redo heavy work or rebuild a download's bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ui.state import app_state

T = TypeVar("T")
_PLAIN = (str, int, float, bool, bytes, type(None))


def _same(a: Any, b: Any) -> bool:
    """Plain values compare by equality, tuples item by item, records (a Trace, a run, a model)
    by identity: equal-looking records from different runs are different keys."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, _PLAIN):
        return type(a) is type(b) and a == b
    return a is b


def memo(name: str, key: tuple, compute: Callable[[], T], fresh: bool = False) -> T:
    """`compute()` once per session for each new `key` (only the last one is kept under `name`);
    `fresh` computes it again. A None result (an experiment that failed, its message shown) is
    not kept, so the next page run tries again."""
    memos = app_state().memos
    held = memos.get(name)
    if fresh or held is None or not _same(held[0], key):
        value = compute()
        if value is None:
            return value
        held = memos[name] = (key, value)
    return held[1]


def held(name: str, key: tuple) -> Any:
    """The value kept under `name` for `key`, or None (nothing computed for that key)."""
    found = app_state().memos.get(name)
    return found[1] if found is not None and _same(found[0], key) else None


def keep(name: str, key: tuple, value: Any) -> None:
    """Keep `value`, computed elsewhere, as `name`'s value for `key`."""
    app_state().memos[name] = (key, value)


def file_bytes(name: str, record: Any, to_bytes: Callable[[Any], bytes]) -> bytes:
    """A record's file bytes for a download button, made once per record. Bytes, not a deferred
    callable: Streamlit stores a deferred download's file unreferenced, and another session's
    rerun can delete it before the browser fetches it ("download canceled")."""
    return memo(name, (record,), lambda: to_bytes(record))
