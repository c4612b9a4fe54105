"""What a kept value really costs in memory: the session store charges records by it.

A record is a tree of dataclasses, tuples, dicts, strings, numbers, numpy arrays and bytes (a
trace, experiment results, serving and load-test runs, a published run's files). The walk adds
`sys.getsizeof` of every object (an array's or a tensor's data by its `nbytes`) and counts an
object reached twice once; it descends only into those containers (never into classes, modules
or functions a value may refer to), so a rough per-step guess cannot undercharge a crafted record of
many small parts. tests/test_fair_store.py checks it against tracemalloc's count of what
decoding a real trace file allocated.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np

MAX_OBJECTS = 2_000_000  # a walk longer than this charges what it has counted so far, plus 1 GiB


def footprint(value: Any) -> int:
    """Bytes held by `value` and everything it refers to (shared parts once)."""
    seen: set[int] = set()
    stack = [value]
    total = 0
    while stack:
        if len(seen) > MAX_OBJECTS:
            return total + (1 << 30)
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            total += sys.getsizeof(obj) + (0 if obj.base is None else obj.nbytes)
            continue  # an array that owns its data counts it in getsizeof
        total += sys.getsizeof(obj)
        if isinstance(obj, (str, bytes, bytearray, int, float, bool, type(None), type)):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (tuple, list, set, frozenset)):
            stack.extend(obj)
        elif dataclasses.is_dataclass(obj):
            stack.extend(getattr(obj, f.name, None) for f in dataclasses.fields(obj))
        elif isinstance(getattr(obj, "nbytes", None), int):
            total += obj.nbytes  # a tensor: its data lives outside the object
    return total
