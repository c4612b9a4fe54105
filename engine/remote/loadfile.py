"""The load-test file: one LoadRun as versioned JSON (UTF-8), no pickle.

Files come from strangers (uploads on a hosted demo): the size is capped before parsing, JSON
containers are counted before they are built, every field is type-checked, and the run's
invariants are checked (chunk times in order and within a day, token counts within the request's
limit, KV usage a fraction). A bad file raises TraceFormatError with one sentence. Format in
docs/loadtest-format.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

from ..errors import TraceFormatError
from ..records.fileformat import json_format
from .record import Histogram, LoadConfig, LoadRun, MetricsSample, RemoteRequest

FORMAT_NAME = "inference-explorer-loadtest"
FORMAT_VERSION = 1
MAX_LOAD_BYTES = 64 << 20
MAX_JSON_CONTAINERS = 1 << 20
MAX_MS = 86_400_000.0
MAX_TOKEN_ID = 1 << 31
MAX_COUNTER = float(1 << 53)
SAMPLE_FIELDS = ("running", "waiting", "kv_usage", "preemptions", "prefix_queries", "prefix_hits",
                 "spec_drafts", "spec_accepted", "generation_tokens")


def load_to_dict(run: LoadRun) -> dict[str, Any]:
    config = asdict(run.config)
    config["prompts"] = list(run.config.prompts)
    return {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "server": run.server,
        "created": run.created, "stopped": run.stopped, "error": run.error,
        "metrics_error": run.metrics_error, "kv_block_size": run.kv_block_size,
        "kv_blocks": run.kv_blocks, "config": config,
        "requests": [{"prompt": r.prompt, "sent_ms": r.sent_ms, "chunk_ms": list(r.chunk_ms),
                      "chunk_tokens": list(r.chunk_tokens), "token_ids": list(r.token_ids),
                      "text": r.text, "prompt_tokens": r.prompt_tokens, "finish": r.finish,
                      "error": r.error, "prompt_token_ids": list(r.prompt_token_ids)}
                     for r in run.requests],
        "samples": [{"t_ms": s.t_ms, **{k: getattr(s, k) for k in SAMPLE_FIELDS},
                     "ttft": _hist_to_list(s.ttft), "itl": _hist_to_list(s.itl)}
                    for s in run.samples],
    }


def _hist_to_list(h: Histogram | None) -> Any:
    if h is None:
        return None
    return {"bounds": [b if math.isfinite(b) else "+Inf" for b in h.bounds],
            "counts": list(h.counts), "sum": h.sum, "count": h.count}


def load_to_bytes(run: LoadRun) -> bytes:
    # ASCII escapes: a lone surrogate a server sent in its text still writes, and reads back
    return json.dumps(load_to_dict(run), ensure_ascii=True, separators=(",", ":")).encode()


def _bad(what: str) -> TraceFormatError:
    return TraceFormatError(f"not a valid load-test file: {what}")


def _expect(value: Any, kind: type | tuple[type, ...], what: str, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        raise _bad(f"{what} has the wrong type")
    return value


def _count(value: Any, what: str, low: int = 0, optional: bool = False) -> int | None:
    value = _expect(value, int, what, optional)
    if value is not None and not low <= value < MAX_TOKEN_ID:
        raise _bad(f"{what} is out of range")
    return value


def _number(value: Any, what: str, optional: bool, low: float, high: float,
            say: str = "is out of range") -> float | None:
    value = _expect(value, (int, float), what, optional)
    if value is None:
        return None
    try:
        value = float(value)
    except OverflowError:
        raise _bad(f"{what} {say}") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise _bad(f"{what} {say}")
    return value


def _ms(value: Any, what: str, optional: bool = False, low: float = 0.0) -> float | None:
    """A time in ms: within a day."""
    return _number(value, what, optional, low, MAX_MS, "must be a time within a day")


def _counter(value: Any, what: str, optional: bool = False) -> float | None:
    """A server counter, gauge or histogram count: finite, not negative, below 2⁵³ (a server
    that ran for months counts far past a day's worth of ms)."""
    return _number(value, what, optional, 0.0, MAX_COUNTER)


def _hist(d: Any, what: str) -> Histogram | None:
    if d is None:
        return None
    d = _expect(d, dict, what)
    bounds = [math.inf if b == "+Inf" else _ms(b, f"{what} bound") for b in
              _expect(d.get("bounds"), list, f"{what} bounds")]
    counts = [_counter(c, f"{what} count") for c in
              _expect(d.get("counts"), list, f"{what} counts")]
    if len(bounds) != len(counts) or bounds != sorted(bounds) or counts != sorted(counts):
        raise _bad(f"{what} is not a cumulative histogram")
    return Histogram(tuple(bounds), tuple(counts), _counter(d.get("sum"), f"{what} sum"),
                     _counter(d.get("count"), f"{what} count"))


def _request(i: int, d: Any, config: LoadConfig) -> RemoteRequest:
    what = f"request {i}"
    d = _expect(d, dict, what)
    chunk_ms = tuple(_ms(t, f"{what} chunk time") for t in
                     _expect(d.get("chunk_ms"), list, f"{what} chunk_ms"))
    chunk_tokens = tuple(_count(n, f"{what} chunk tokens", 1) for n in
                         _expect(d.get("chunk_tokens"), list, f"{what} chunk_tokens"))
    token_ids = tuple(_count(t, f"{what} token id") for t in
                      _expect(d.get("token_ids"), list, f"{what} token_ids"))
    sent = _ms(d.get("sent_ms"), f"{what} sent_ms", optional=True)
    if list(chunk_ms) != sorted(chunk_ms) or (chunk_ms and (sent is None or chunk_ms[0] < sent)):
        raise _bad(f"{what}: its chunks are not in time order after it was sent")
    if sum(chunk_tokens) > config.max_new_tokens or len(token_ids) > config.max_new_tokens:
        raise _bad(f"{what} has more tokens than it was allowed")
    try:
        return RemoteRequest(
            i, _expect(d.get("prompt"), str, f"{what} prompt"), sent, chunk_ms, chunk_tokens,
            token_ids, _expect(d.get("text"), str, f"{what} text"),
            _count(d.get("prompt_tokens"), f"{what} prompt_tokens", optional=True),
            _expect(d.get("finish"), str, f"{what} finish"),
            _expect(d.get("error"), str, f"{what} error", optional=True),
            tuple(_count(t, f"{what} prompt token id") for t in
                  _expect(d.get("prompt_token_ids", []), list, f"{what} prompt_token_ids")))
    except ValueError as error:
        if isinstance(error, TraceFormatError):
            raise
        raise _bad(f"{what}: {error}") from None


def _sample(i: int, d: Any) -> MetricsSample:
    what = f"metrics sample {i}"
    d = _expect(d, dict, what)
    values = {k: _counter(d.get(k), f"{what} {k}", optional=True) for k in SAMPLE_FIELDS}
    if values["kv_usage"] is not None and values["kv_usage"] > 1:
        raise _bad(f"{what}: KV usage is a fraction between 0 and 1")
    return MetricsSample(_ms(d.get("t_ms"), f"{what} t_ms", low=-MAX_MS), **values,
                         ttft=_hist(d.get("ttft"), f"{what} ttft"),
                         itl=_hist(d.get("itl"), f"{what} itl"))


def load_from_dict(d: Any) -> LoadRun:
    d = _expect(d, dict, "the file")
    LOADTEST_FORMAT.check_version(d)
    c = _expect(d.get("config"), dict, "config")
    try:
        config = LoadConfig(
            _expect(c.get("base_url"), str, "base_url"), _expect(c.get("model"), str, "model"),
            tuple(_expect(p, str, "a prompt") for p in _expect(c.get("prompts"), list, "prompts")),
            _count(c.get("requests"), "requests", 1), _count(c.get("max_new_tokens"),
                                                             "max_new_tokens", 1),
            _count(c.get("concurrency"), "concurrency", 1),
            _ms(c.get("rate"), "rate", optional=True),
            _expect(c.get("chat_template"), bool, "chat_template"), _count(c.get("seed"), "seed"))
    except ValueError as error:
        if isinstance(error, TraceFormatError):
            raise
        raise _bad(str(error)) from None
    requests = tuple(_request(i, r, config) for i, r in
                     enumerate(_expect(d.get("requests"), list, "requests")))
    if len(requests) != config.requests:
        raise _bad(f"it holds {len(requests)} requests, but its load had {config.requests}")
    return LoadRun(config, _expect(d.get("server"), str, "server"), requests,
                   tuple(_sample(i, s) for i, s in
                         enumerate(_expect(d.get("samples"), list, "samples"))),
                   _expect(d.get("created"), str, "created"),
                   _expect(d.get("stopped"), bool, "stopped"),
                   _expect(d.get("error"), str, "error", optional=True),
                   _expect(d.get("metrics_error"), str, "metrics_error", optional=True),
                   _count(d.get("kv_block_size"), "kv_block_size", 1, optional=True),
                   _count(d.get("kv_blocks"), "kv_blocks", 1, optional=True))


LOADTEST_FORMAT = json_format("load-test", FORMAT_NAME, FORMAT_VERSION, MAX_LOAD_BYTES,
                              MAX_JSON_CONTAINERS, load_from_dict)


def load_loadtest(data: bytes, max_bytes: int = MAX_LOAD_BYTES) -> LoadRun:
    return LOADTEST_FORMAT.read(data, max_bytes)
