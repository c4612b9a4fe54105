"""The serving file: one ServingRun as versioned JSON (UTF-8), no pickle.

Files come from strangers (uploads on a hosted demo): the size is capped before parsing, the
number of JSON containers is counted before building them, every field is type-checked, and the
record's invariants are checked (steps numbered in order, blocks inside the pool, each token's step
exists and ran that request, tokens within each request's limit). A bad file raises
TraceFormatError with one sentence. Format described in docs/serving-format.md.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..errors import TraceFormatError
from ..records.fileformat import json_format
from ..settings import MAX_NEW_TOKENS_LIMIT
from .record import BlockTableRow, RequestRecord, RequestSpec, ServingConfig, ServingRun, StepRecord

FORMAT_NAME = "inference-explorer-serving"
FORMAT_VERSION = 1
MAX_SERVING_BYTES = 64 << 20
MAX_TOKEN_ID = 1 << 31
MAX_IDS = 1 << 20
MAX_MS = 86_400_000.0  # a day
MAX_JSON_CONTAINERS = 1 << 20  # a step holds ~2 per running request; streams are capped


def serving_to_dict(run: ServingRun) -> dict[str, Any]:
    c = run.config
    return {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "model": run.model,
        "weights": run.weights, "threads": run.threads, "created": run.created,
        "stopped": run.stopped, "cores": run.cores,
        "config": {"scheduler": c.scheduler, "max_batch": c.max_batch, "block_size": c.block_size,
                   "num_blocks": c.num_blocks, "prefix_sharing": c.prefix_sharing},
        "requests": [{
            "prompt": r.spec.prompt, "prompt_token_ids": list(r.spec.prompt_token_ids),
            "max_new_tokens": r.spec.max_new_tokens, "arrival_ms": r.spec.arrival_ms,
            "admitted_ms": r.admitted_ms, "token_ids": list(r.token_ids),
            "token_ms": list(r.token_ms), "token_steps": list(r.token_steps), "text": r.text,
            "cached_tokens": r.cached_tokens, "preemptions": r.preemptions, "finish": r.finish,
        } for r in run.requests],
        "steps": [{
            "index": s.index, "start_ms": s.start_ms, "ms": s.ms, "kind": s.kind,
            "requests": list(s.requests), "new_tokens": list(s.new_tokens),
            "tables": [[t.request, list(t.blocks), t.tokens] for t in s.tables],
            "free_blocks": s.free_blocks, "shared_blocks": s.shared_blocks,
            "copied_blocks": s.copied_blocks, "waiting": s.waiting, "preempted": list(s.preempted),
            "cpu_ms": s.cpu_ms, "others_share": s.others_share,
        } for s in run.steps],
    }


def serving_to_bytes(run: ServingRun) -> bytes:
    return json.dumps(serving_to_dict(run), ensure_ascii=False, separators=(",", ":")).encode()


def _bad(what: str) -> TraceFormatError:
    return TraceFormatError(f"not a valid serving file: {what}")


def _int(value: Any, what: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise _bad(f"{what} must be a whole number ≥ {low}")
    return value


def _num(value: Any, what: str, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise _bad(f"{what} must be a finite number ≥ 0")
    return float(value)


def _share(value: Any, what: str) -> float | None:
    share = _num(value, what, optional=True)
    if share is not None and share > 1:
        raise _bad(f"{what} must lie between 0 and 1")
    return share


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _bad(f"{what} must be a list")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"{what} must be text")
    return value


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"{what} must be an object")
    return value


def _request(i: int, d: Any) -> RequestRecord:
    d = _obj(d, f"request {i}")
    what = f"request {i}"
    try:
        spec = RequestSpec(_str(d.get("prompt"), f"{what} prompt"),
                           tuple(_int(t, f"{what} prompt token") for t in
                                 _list(d.get("prompt_token_ids"), f"{what} prompt_token_ids")),
                           _int(d.get("max_new_tokens"), f"{what} max_new_tokens", 1),
                           _num(d.get("arrival_ms"), f"{what} arrival_ms"))
        return RequestRecord(
            i, spec, _num(d.get("admitted_ms"), f"{what} admitted_ms", optional=True),
            tuple(_int(t, f"{what} token") for t in _list(d.get("token_ids"), f"{what} token_ids")),
            tuple(_num(t, f"{what} token time") for t in _list(d.get("token_ms"), f"{what} token_ms")),
            tuple(_int(t, f"{what} token step") for t in
                  _list(d.get("token_steps"), f"{what} token_steps")),
            _str(d.get("text"), f"{what} text"), _int(d.get("cached_tokens"), f"{what} cached_tokens"),
            _int(d.get("preemptions"), f"{what} preemptions"), _str(d.get("finish"), f"{what} finish"))
    except ValueError as error:
        if isinstance(error, TraceFormatError):
            raise
        raise _bad(f"{what}: {error}") from None


def _step(i: int, d: Any) -> StepRecord:
    d = _obj(d, f"step {i}")
    what = f"step {i}"
    tables = []
    for row in _list(d.get("tables"), f"{what} tables"):
        row = _list(row, f"{what} table row")
        if len(row) != 3:
            raise _bad(f"{what}: a table row is [request, blocks, tokens]")
        tables.append(BlockTableRow(_int(row[0], f"{what} table request"),
                                    tuple(_int(b, f"{what} block") for b in
                                          _list(row[1], f"{what} blocks")),
                                    _int(row[2], f"{what} table tokens")))
    try:
        return StepRecord(
            _int(d.get("index"), f"{what} index"), _num(d.get("start_ms"), f"{what} start_ms"),
            _num(d.get("ms"), f"{what} ms"), _str(d.get("kind"), f"{what} kind"),
            tuple(_int(r, f"{what} request") for r in _list(d.get("requests"), f"{what} requests")),
            tuple(_int(n, f"{what} new tokens", 1) for n in
                  _list(d.get("new_tokens"), f"{what} new_tokens")),
            tuple(tables), _int(d.get("free_blocks"), f"{what} free_blocks"),
            _int(d.get("shared_blocks"), f"{what} shared_blocks"),
            _int(d.get("copied_blocks"), f"{what} copied_blocks"),
            _int(d.get("waiting"), f"{what} waiting"),
            tuple(_int(r, f"{what} preempted") for r in _list(d.get("preempted"), f"{what} preempted")),
            _num(d.get("cpu_ms"), f"{what} cpu_ms", optional=True),
            _share(d.get("others_share"), f"{what} others_share"))
    except ValueError as error:
        if isinstance(error, TraceFormatError):
            raise
        raise _bad(f"{what}: {error}") from None


def _check(run: ServingRun) -> None:
    c, n = run.config, len(run.requests)
    for i, step in enumerate(run.steps):
        if step.index != i:
            raise _bad(f"step {i} is numbered {step.index}")
        if any(r >= n for r in step.requests) or any(t.request >= n for t in step.tables):
            raise _bad(f"step {i} names a request that does not exist")
        for row in step.tables:
            if any(b >= c.num_blocks for b in row.blocks):
                raise _bad(f"step {i}: a block lies outside the pool of {c.num_blocks}")
            if not (len(row.blocks) - 1) * c.block_size < row.tokens <= len(row.blocks) * c.block_size:
                raise _bad(f"step {i}: request {row.request} holds {row.tokens} tokens in "
                           f"{len(row.blocks)} blocks of {c.block_size}")
    for r in run.requests:
        if len(r.token_ids) > r.spec.max_new_tokens:
            raise _bad(f"request {r.id} has more tokens than it was allowed")
        if r.spec.max_new_tokens > MAX_NEW_TOKENS_LIMIT or len(r.spec.prompt_token_ids) > MAX_IDS:
            raise _bad(f"request {r.id} is longer than any stream this app runs")
        if any(t >= MAX_TOKEN_ID for t in (*r.spec.prompt_token_ids, *r.token_ids)):
            raise _bad(f"request {r.id} has a token id beyond any vocabulary")
        if r.cached_tokens >= max(1, len(r.spec.prompt_token_ids) + len(r.token_ids)):
            raise _bad(f"request {r.id} claims more cached tokens than it has")
        if r.preemptions > len(run.steps):
            raise _bad(f"request {r.id} was preempted more often than steps ran")
        if r.spec.arrival_ms > MAX_MS or any(t > MAX_MS for t in r.token_ms):
            raise _bad(f"request {r.id} has times beyond a day")
    for step in run.steps:
        if step.start_ms > MAX_MS or step.ms > MAX_MS or step.waiting > n \
                or step.free_blocks > c.num_blocks:
            raise _bad(f"step {step.index} has numbers no stream can have")
        for token_step in r.token_steps:
            if token_step >= len(run.steps) or r.id not in run.steps[token_step].requests:
                raise _bad(f"request {r.id} names a step that did not run it")


def serving_from_dict(d: Any) -> ServingRun:
    d = _obj(d, "the file")
    SERVING_FORMAT.check_version(d)
    cfg = _obj(d.get("config"), "config")
    try:
        config = ServingConfig(_str(cfg.get("scheduler"), "scheduler"),
                               _int(cfg.get("max_batch"), "max_batch", 1),
                               _int(cfg.get("block_size"), "block_size", 1),
                               _int(cfg.get("num_blocks"), "num_blocks", 1),
                               cfg.get("prefix_sharing") is True)
    except ValueError as error:
        if isinstance(error, TraceFormatError):
            raise
        raise _bad(str(error)) from None
    if not isinstance(d.get("stopped"), bool):
        raise _bad("stopped must be true or false")
    run = ServingRun(
        _str(d.get("model"), "model"), _str(d.get("weights"), "weights"), config,
        tuple(_request(i, r) for i, r in enumerate(_list(d.get("requests"), "requests"))),
        tuple(_step(i, s) for i, s in enumerate(_list(d.get("steps"), "steps"))),
        _int(d.get("threads"), "threads", 1), _str(d.get("created"), "created"), d["stopped"],
        None if d.get("cores") is None else _int(d.get("cores"), "cores", 1))
    if not run.requests:
        raise _bad("it holds no requests")
    _check(run)
    return run


SERVING_FORMAT = json_format("serving", FORMAT_NAME, FORMAT_VERSION, MAX_SERVING_BYTES,
                             MAX_JSON_CONTAINERS, serving_from_dict)


def load_serving(data: bytes, max_bytes: int = MAX_SERVING_BYTES) -> ServingRun:
    return SERVING_FORMAT.read(data, max_bytes)
