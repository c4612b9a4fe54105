"""The model store (engine/models.py): each (source, weights) choice loaded once, within a
memory cap."""

from __future__ import annotations

import threading
import time

from engine.models import ModelStore


class _Loaded:
    def __init__(self, source: str, dtype: str, mb: int) -> None:
        self.source, self.dtype = source, dtype
        self.spec = type("Spec", (), {"weight_bytes": mb << 20})()


def test_each_choice_loads_once_and_the_store_keeps_its_cap():
    loads = []

    def loader(source: str, dtype: str) -> _Loaded:
        loads.append((source, dtype))
        time.sleep(0.05)
        return _Loaded(source, dtype, 100)

    store = ModelStore(max_bytes=250 << 20, loader=loader)
    got = []
    threads = [threading.Thread(target=lambda: got.append(store.get("default", "float32")))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert loads == [("default", "float32")] and len({id(e) for e in got}) == 1
    fp32 = got[0]
    fp16 = store.get("default", "float16")
    assert fp16.lm.dtype == "float16" and store.get("default", "float32") is fp32
    store.get("other", "float32")  # 300 MB > 250 MB: the least recently used (float16) goes
    assert store.keys == [("default", "fp32"), ("other", "fp32")]  # dtype names: aliases
    assert fp16.lm.dtype == "float16"  # a session holding it keeps it


def test_entry_extras_are_built_once():
    store = ModelStore(max_bytes=1 << 30, loader=lambda s, dtype: _Loaded(s, dtype, 1))
    entry, built = store.get("default", "float32"), []
    first = entry.extra("index", lambda lm: built.append(lm) or object())
    assert entry.extra("index", lambda lm: built.append(lm) or object()) is first
    assert len(built) == 1


def test_one_compiled_decoder_per_process_for_the_asking_model():
    store = ModelStore(max_bytes=1 << 30, loader=lambda s, dtype: _Loaded(s, dtype, 1))
    a = store.compiled(("default", "float32"), lambda lm: ("compiled", lm.dtype))
    assert store.compiled(("default", "float32"), lambda lm: 1 / 0) is a
    b = store.compiled(("default", "float16"), lambda lm: ("compiled", lm.dtype))
    assert b == ("compiled", "float16") and b is not a


def test_a_peek_counts_as_a_use_for_eviction():
    """The sidebar takes a loaded entry with `peek` (so no eviction between a check and a load
    can make it quantize outside the model turn): that use must keep the entry recent."""
    store = ModelStore(max_bytes=250 << 20, loader=lambda s, dtype: _Loaded(s, dtype, 100))
    first = store.get("a", "float32")
    store.get("b", "float32")
    assert store.peek("a", "float32") is first  # used now: "b" is the least recently used
    store.get("c", "float32")
    assert store.keys == [("a", "fp32"), ("c", "fp32")]
