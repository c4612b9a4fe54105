"""The load-test record: what a serving engine behind an OpenAI-compatible API did with a load we
sent it — measured on the client, per request and per streamed chunk — and the server's own
Prometheus counters sampled while it ran.

A run kind of its own, frozen dataclasses like the Trace and the serving record; the file format
(JSON, versioned, no pickle) is in `loadfile.py`. Times are ms since the load started. The
metrics are the local engine's (engine/serving/record.py), which are vLLM `benchmark_serving`'s:
TTFT = first streamed token − request sent; ITL = each gap between consecutive streamed chunks
(a chunk normally carries one token; `chunk_tokens` says when it carries more); TPOT =
(last − first token) / (output tokens − 1); end-to-end = last token − sent; throughput = output
tokens / (last token − first request sent). No attention or KV contents: a remote engine shows its
timing and its counters only.
"""

from __future__ import annotations

from dataclasses import dataclass

FINISHES = ("length", "stop", "error", "stopped", "running", "waiting")


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """The load: `requests` requests cycling through `prompts`, each allowed `max_new_tokens`,
    with at most `concurrency` in flight, or (when `rate` is set) sent as a Poisson process of
    `rate` requests per second; `chat_template` says whether prompts were wrapped in the default
    model's chat template before sending (as the local engine does)."""

    base_url: str
    model: str
    prompts: tuple[str, ...]
    requests: int
    max_new_tokens: int
    concurrency: int
    rate: float | None = None
    chat_template: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.prompts or any(not p.strip() for p in self.prompts):
            raise ValueError("a load needs at least one prompt, and no empty prompt")
        if not 1 <= self.requests <= 512:
            raise ValueError("a load has between 1 and 512 requests")
        if not 1 <= self.max_new_tokens <= 4096:
            raise ValueError("max new tokens must be between 1 and 4,096")
        if not 1 <= self.concurrency <= 256:
            raise ValueError("concurrency must be between 1 and 256")
        if self.rate is not None and not 0.01 <= self.rate <= 1000:
            raise ValueError("the request rate must be between 0.01 and 1,000 per second")


@dataclass(frozen=True, slots=True)
class RemoteRequest:
    """One request as the client saw it: sent at `sent_ms`; streamed chunks arrived at `chunk_ms`
    carrying `chunk_tokens` tokens each; `token_ids` when the server returns them (vLLM does when
    asked), else empty, and likewise the `prompt_token_ids` it tokenized the prompt into;
    `prompt_tokens` from the server's usage report (None if it sent none);
    `error` says why a request ended early (the partial tokens are kept)."""

    id: int
    prompt: str
    sent_ms: float | None
    chunk_ms: tuple[float, ...]
    chunk_tokens: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    prompt_tokens: int | None
    finish: str
    error: str | None = None
    prompt_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.finish not in FINISHES:
            raise ValueError(f"unknown finish {self.finish!r}")
        if len(self.chunk_ms) != len(self.chunk_tokens):
            raise ValueError("chunk times and chunk token counts differ in length")

    @property
    def output_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def ttft_ms(self) -> float | None:
        return self.chunk_ms[0] - self.sent_ms if self.chunk_ms and self.sent_ms is not None \
            else None

    @property
    def itl_ms(self) -> tuple[float, ...]:
        return tuple(b - a for a, b in zip(self.chunk_ms, self.chunk_ms[1:]))

    @property
    def e2e_ms(self) -> float | None:
        return self.chunk_ms[-1] - self.sent_ms if self.chunk_ms and self.sent_ms is not None \
            else None

    @property
    def tpot_ms(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.chunk_ms[-1] - self.chunk_ms[0]) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram as scraped: cumulative `counts` at upper bounds `bounds` (seconds,
    the last is +inf), and the running `sum` and `count`."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float
    count: float


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """The server's /metrics at `t_ms`: gauges (running and waiting requests, KV-cache usage as a
    fraction of its blocks) and counters since the server started. None: the server does not
    export that metric (speculative decoding's counters exist only when it is on)."""

    t_ms: float
    running: float | None
    waiting: float | None
    kv_usage: float | None
    preemptions: float | None
    prefix_queries: float | None
    prefix_hits: float | None
    spec_drafts: float | None
    spec_accepted: float | None
    generation_tokens: float | None
    ttft: Histogram | None
    itl: Histogram | None


@dataclass(frozen=True, slots=True)
class LoadRun:
    """A whole load: the config, the served model's name as the server lists it, every request,
    the /metrics samples (the first taken before any request was sent, the last after every
    request ended), whether the user stopped it, any error that ended it early, and the server's KV
    block size and pool (vLLM's cache_config_info; None elsewhere)."""

    config: LoadConfig
    server: str
    requests: tuple[RemoteRequest, ...]
    samples: tuple[MetricsSample, ...]
    created: str
    stopped: bool = False
    error: str | None = None
    metrics_error: str | None = None
    kv_block_size: int | None = None  # tokens per KV block, as the server reports it
    kv_blocks: int | None = None  # blocks in its KV pool

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    @property
    def duration_ms(self) -> float:
        """First request sent → last token."""
        ends = [r.chunk_ms[-1] for r in self.requests if r.chunk_ms]
        starts = [r.sent_ms for r in self.requests if r.sent_ms is not None]
        return max(ends) - min(starts) if ends and starts else 0.0

    @property
    def throughput_tok_s(self) -> float:
        return 1000.0 * self.output_tokens / self.duration_ms if self.duration_ms > 0 else 0.0
