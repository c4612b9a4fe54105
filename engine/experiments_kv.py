"""The KV cache page's shrinking experiments (engine/kv/shrink) as a trace file keeps them: each
method's run, the long-context points and the needle probe, written as plain JSON and read back
with every number checked (engine/experiment_checks.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import EngineError, TraceFormatError
from .experiment_checks import entries, number, series, whole
from .kv.shrink.budget import METHODS, parse_budget
from .kv.shrink.needle import LengthPoint, NeedleResult, NeedleRun
from .kv.shrink.run import SOURCES, ShrinkRun

MAX_ROW_VALUES = 250_000  # a shrink run's attention rows are kept in a file up to this many


def shrink_to_dict(r: ShrinkRun) -> dict[str, Any]:
    rows = None
    if r.rows is not None and r.rows.size <= MAX_ROW_VALUES:
        rows = {"shape": list(r.rows.shape), "values": np.round(r.rows, 4).ravel().tolist()}
    return {"method": r.method, "budget": r.budget, "count": r.count, "source": r.source,
            "delayed": r.delayed,
            "prompt_tokens": r.prompt_tokens, "layer": r.layer, "kl": r.kl.tolist(),
            "agree": r.agree.tolist(), "nll": r.nll.tolist(), "dense_nll": r.dense_nll.tolist(),
            "kv_bytes": r.kv_bytes.tolist(), "dense_kv_bytes": r.dense_kv_bytes.tolist(),
            "read_bytes": r.read_bytes.tolist(), "dense_read_bytes": r.dense_read_bytes.tolist(),
            "step_ms": r.step_ms.tolist(), "dense_step_ms": r.dense_step_ms.tolist(), "rows": rows}


def _rows(d: Any, steps: int) -> np.ndarray | None:
    if d is None:
        return None
    shape = d.get("shape") if isinstance(d, dict) else None
    if not (isinstance(shape, list) and len(shape) == 3
            and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
            and shape[0] == steps and shape[0] * shape[1] * shape[2] <= MAX_ROW_VALUES):
        raise TraceFormatError("experiment results: a shrink run's rows must have a shape "
                               f"[steps, heads, positions] of at most {MAX_ROW_VALUES:,} values")
    values = d.get("values")
    if not isinstance(values, list) or len(values) != shape[0] * shape[1] * shape[2] \
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                       and 0 <= v <= 1 for v in values):
        raise TraceFormatError("experiment results: a shrink run's rows must hold its shape's "
                               "count of weights between 0 and 1")
    return np.array(values, dtype=np.float32).reshape(shape)


def shrink_from_dict(r: Any) -> ShrinkRun:
    if not isinstance(r, dict) or r.get("method") not in METHODS:
        raise TraceFormatError(f"experiment results: a shrink run's method must be one of "
                               f"{', '.join(METHODS)}")
    budget = r.get("budget")
    try:
        if not isinstance(budget, str):
            raise ValueError
        parse_budget(budget)
    except (ValueError, EngineError):
        raise TraceFormatError("experiment results: a shrink run's budget must be 'full', a "
                               "whole number or a percentage") from None
    source = r.get("source", "run")
    if source not in SOURCES:
        raise TraceFormatError(f"experiment results: a shrink run's source must be one of "
                               f"{', '.join(SOURCES)}")
    kl = series(r.get("kl"), "shrink KL")
    n = len(kl)
    steps = n - 1
    later = (lambda key, what: series(r.get(key), what, length=steps)) if steps else \
        (lambda key, what: np.zeros(0))
    return ShrinkRun(
        r["method"], budget, whole(r.get("count"), "shrink count"),
        whole(r.get("prompt_tokens"), "prompt tokens"), kl,
        series(r.get("agree"), "shrink agreement", bool, n), later("nll", "shrink NLL"),
        later("dense_nll", "unmodified NLL"), series(r.get("kv_bytes"), "shrink KV bytes", length=n),
        series(r.get("dense_kv_bytes"), "unmodified KV bytes", length=n),
        later("read_bytes", "shrink read bytes"), later("dense_read_bytes", "unmodified read bytes"),
        later("step_ms", "shrink step times"), later("dense_step_ms", "unmodified step times"),
        whole(r.get("layer"), "shrink layer"), _rows(r.get("rows"), steps), source,
        _flag(r.get("delayed"), "a shrink run's delay flag"))




def _flag(value: Any, what: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TraceFormatError(f"experiment results: {what} must be true, false or null")
    return value


def long_point(p: Any) -> LengthPoint:
    if not isinstance(p, list) or len(p) != 5:
        raise TraceFormatError("experiment results: a long-context point must be [tokens, KV "
                               "bytes, TTFT ms, ITL ms, delayed]")
    return LengthPoint(whole(p[0], "long-context tokens"), whole(p[1], "long-context KV bytes"),
                       number(p[2], "long-context TTFT", positive=True),
                       number(p[3], "long-context ITL", positive=True),
                       _flag(p[4], "a long-context point's delay flag"))


def needle_from_dict(d: Any) -> NeedleRun | None:
    if d is None:
        return None
    if not isinstance(d, dict):
        raise TraceFormatError("experiment results: needle must be an object")
    depth = number(d.get("depth"), "needle depth")
    if depth > 1:
        raise TraceFormatError("experiment results: the needle's depth must be between 0 and 1")
    results = []
    for r in entries(d, "results"):
        method = r.get("method") if isinstance(r, dict) else "?"
        budget = r.get("budget")
        if method is not None and method not in METHODS or not isinstance(budget, str) \
                or len(budget) > 12 or not isinstance(r.get("found"), bool):
            raise TraceFormatError("experiment results: a needle result must name a method, a "
                                   "budget and whether it found the answer")
        logprob = r.get("answer_logprob")
        if not isinstance(logprob, (int, float)) or isinstance(logprob, bool) \
                or not -1e6 <= logprob <= 0:
            raise TraceFormatError("experiment results: a needle's log-probability must be ≤ 0")
        results.append(NeedleResult(method, budget, r["found"], float(logprob),
                                    whole(r.get("kv_bytes"), "needle KV bytes")))
    return NeedleRun(whole(d.get("tokens"), "needle tokens"), depth, tuple(results))


def needle_to_dict(run: NeedleRun | None) -> dict[str, Any] | None:
    return None if run is None else {
        "tokens": run.tokens, "depth": run.depth,
        "results": [{"method": r.method, "budget": r.budget, "found": r.found,
                     "answer_logprob": r.answer_logprob, "kv_bytes": r.kv_bytes}
                    for r in run.results]}
