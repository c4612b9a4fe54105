"""Checks of the numbers an experiment result in a file holds (engine/experiments.py and
experiments_kv.py read every entry through these): finite, in range, bounded in length, or one
TraceFormatError naming what is wrong."""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from .errors import TraceFormatError
from .settings import MAX_NEW_TOKENS_LIMIT

MAX_RESULTS = 32  # entries per experiment in a file: far more than the page makes
MAX_SERIES = MAX_NEW_TOKENS_LIMIT + 1


def number(value: Any, what: str, optional: bool = False, positive: bool = False
            ) -> float | None:
    """A finite number ≥ 0 (> 1e-6 when `positive`: a time that rates divide by)."""
    if value is None and optional:
        return None
    try:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value) and value >= 0 and (not positive or value > 1e-6))
    except OverflowError:  # an int with hundreds of digits
        ok = False
    if not ok:
        raise TraceFormatError(f"experiment results: {what} must be a finite number "
                               f"{'> 0' if positive else '≥ 0'}")
    return float(value)


def whole(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 1 << 40:
        raise TraceFormatError(f"experiment results: {what} must be a whole number ≥ 0")
    return value


def series(values: Any, what: str, kind: type = float, length: int | None = None) -> np.ndarray:
    """A non-empty list of at most MAX_SERIES values (exactly `length` when given)."""
    if not isinstance(values, list) or not 1 <= len(values) <= MAX_SERIES \
            or (length is not None and len(values) != length):
        raise TraceFormatError(f"experiment results: {what} must be a list of 1 to {MAX_SERIES} "
                               "values, as long as the other series of its run")
    if kind is bool:
        if not all(isinstance(v, bool) for v in values):
            raise TraceFormatError(f"experiment results: {what} must hold true/false values")
        return np.array(values, dtype=bool)
    return np.array([number(v, what) for v in values], dtype=np.float64)


def entries(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key) or []
    if not isinstance(value, list) or len(value) > MAX_RESULTS:
        raise TraceFormatError(f"experiment results: {key} must be a list of at most "
                               f"{MAX_RESULTS} entries")
    return value
