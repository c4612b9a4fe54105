"""The serving record: what one stream of requests did on the batched engine, step by step.

Frozen dataclasses, like the Trace, but a run kind of its own (a stream of requests, not one
generation). Times are milliseconds since the stream started (the first request's arrival is at
`arrival_ms`, usually 0). Metrics follow the definitions in the anchors (vLLM's
`benchmark_serving`): TTFT = first token − arrival; ITL = each gap between consecutive output
tokens; TPOT = (end-to-end − TTFT) / (output tokens − 1); throughput = output tokens / (last token −
first arrival). The file format (JSON, versioned, no pickle) is in `servingfile.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCHEDULERS = ("continuous", "static")
FINISH_REASONS = ("eos", "length", "stopped", "running", "waiting", "refused")
STEP_KINDS = ("prefill", "decode", "mixed")
MAX_POOL_SLOTS = 1 << 18  # token slots: 12 GB of K/V for the default model in float32


@dataclass(frozen=True, slots=True)
class ServingConfig:
    """How the engine serves: `scheduler` "continuous" admits waiting requests whenever a slot and
    blocks are free; "static" admits a batch only when the previous batch has fully finished.
    `max_batch` caps the requests decoded together; KV lives in `num_blocks` blocks of `block_size`
    token slots each; `prefix_sharing` reuses full blocks whose tokens (and all before them) equal
    another request's."""

    scheduler: str = "continuous"
    max_batch: int = 8
    block_size: int = 16
    num_blocks: int = 256
    prefix_sharing: bool = True

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {self.scheduler!r} (choose {', '.join(SCHEDULERS)})")
        if not 1 <= self.max_batch <= 256:
            raise ValueError("max batch must be between 1 and 256")
        if not 1 <= self.block_size <= 1024:
            raise ValueError("block size must be between 1 and 1024 token slots")
        if not 1 <= self.num_blocks <= 1 << 16:
            raise ValueError("the block pool must hold between 1 and 65,536 blocks")
        if self.num_blocks * self.block_size > MAX_POOL_SLOTS:
            raise ValueError(f"the block pool may hold at most {MAX_POOL_SLOTS:,} token slots "
                             f"(blocks × block size)")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a stream: its prompt (text and the token ids the model sees), how many
    tokens it may generate, and when it arrives (ms after the stream starts)."""

    prompt: str
    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int
    arrival_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("a request needs at least one prompt token")
        if self.max_new_tokens < 1:
            raise ValueError("a request must be allowed at least one new token")
        if not (self.arrival_ms >= 0 and np.isfinite(self.arrival_ms)):
            raise ValueError("arrival times are finite and not negative")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request. `admitted_ms` is when its prefill started (None: never
    admitted); `token_ms[i]` is when output token i was produced and `token_steps[i]` the engine step
    that produced it; `cached_tokens` prompt tokens were found in shared blocks and not computed;
    `preemptions` counts the times it was evicted to free blocks (and recomputed later)."""

    id: int
    spec: RequestSpec
    admitted_ms: float | None
    token_ids: tuple[int, ...]
    token_ms: tuple[float, ...]
    token_steps: tuple[int, ...]
    text: str
    cached_tokens: int
    preemptions: int
    finish: str

    def __post_init__(self) -> None:
        if self.finish not in FINISH_REASONS:
            raise ValueError(f"unknown finish reason {self.finish!r}")
        if not len(self.token_ids) == len(self.token_ms) == len(self.token_steps):
            raise ValueError("token ids, times and steps differ in length")

    @property
    def queue_ms(self) -> float | None:
        return None if self.admitted_ms is None else self.admitted_ms - self.spec.arrival_ms

    @property
    def ttft_ms(self) -> float | None:
        return self.token_ms[0] - self.spec.arrival_ms if self.token_ms else None

    @property
    def itl_ms(self) -> tuple[float, ...]:
        return tuple(float(b - a) for a, b in zip(self.token_ms, self.token_ms[1:]))

    @property
    def e2e_ms(self) -> float | None:
        return self.token_ms[-1] - self.spec.arrival_ms if self.token_ms else None

    @property
    def tpot_ms(self) -> float | None:
        if len(self.token_ms) < 2:
            return None
        return (self.token_ms[-1] - self.token_ms[0]) / (len(self.token_ms) - 1)


@dataclass(frozen=True, slots=True)
class BlockTableRow:
    """One running request's block table after a step: logical block i of the request lives in
    physical block `blocks[i]`; the request holds `tokens` positions (the last block may be
    partly empty)."""

    request: int
    blocks: tuple[int, ...]
    tokens: int


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step: a single forward over every request in it. `requests[i]` computed
    `new_tokens[i]` positions (its prompt, or the uncached part of it, for a prefill; 1 for a
    decode). After the step: `tables` of the running requests, `free_blocks` of the pool,
    `shared_blocks` physical blocks referenced by more than one request, `copied_blocks` blocks
    copied on write in this step, `waiting` requests that had arrived but were not running,
    `preempted` requests evicted in this step. `cpu_ms` (this process, all threads) and
    `others_share` (other processes' share of all CPUs) say whether other work delayed the step
    (engine/timing/disturbance.py's rule; None where the OS does not say)."""

    index: int
    start_ms: float
    ms: float
    kind: str
    requests: tuple[int, ...]
    new_tokens: tuple[int, ...]
    tables: tuple[BlockTableRow, ...]
    free_blocks: int
    shared_blocks: int
    copied_blocks: int
    waiting: int
    preempted: tuple[int, ...] = ()
    cpu_ms: float | None = None
    others_share: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in STEP_KINDS:
            raise ValueError(f"unknown step kind {self.kind!r}")
        if len(self.requests) != len(self.new_tokens):
            raise ValueError("requests and new_tokens differ in length")

    @property
    def batch_size(self) -> int:
        return len(self.requests)

    @property
    def blocks_used(self) -> int:
        return len({b for row in self.tables for b in row.blocks})

    def empty_slots(self, block_size: int) -> int:
        """Token slots allocated to running requests but not (yet) filled: the paged cache's only
        waste, at most block_size − 1 per request."""
        return sum(len(row.blocks) * block_size - row.tokens for row in self.tables)


@dataclass(frozen=True, slots=True)
class ServingRun:
    """A whole stream: the model and weights that served it, the configuration, every request and
    every step. `stopped` is True when the user stopped it (the record is the partial run)."""

    model: str
    weights: str
    config: ServingConfig
    requests: tuple[RequestRecord, ...]
    steps: tuple[StepRecord, ...]
    threads: int
    created: str
    stopped: bool = False
    cores: int | None = None  # CPU cores this process could use

    def delayed_steps(self) -> tuple[int, ...]:
        """Steps other work on the machine delayed, by the Trace's rule (disturbance.py): others
        used ≥ OTHERS_LIMIT of all CPUs and this process got < CPU_SHARE_LIMIT of its threads'
        possible CPU time."""
        from ..timing.disturbance import CPU_SHARE_LIMIT, OTHERS_LIMIT

        threads = max(1, min(self.threads, self.cores or self.threads))
        return tuple(s.index for s in self.steps
                     if s.cpu_ms is not None and s.others_share is not None and s.ms > 0
                     and s.others_share >= OTHERS_LIMIT
                     and s.cpu_ms / (threads * s.ms) < CPU_SHARE_LIMIT)

    @property
    def output_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.requests)

    @property
    def duration_ms(self) -> float:
        """First arrival → last output token."""
        ends = [r.token_ms[-1] for r in self.requests if r.token_ms]
        if not ends:
            return 0.0
        return max(ends) - min(r.spec.arrival_ms for r in self.requests)

    @property
    def throughput_tok_s(self) -> float:
        return 1000.0 * self.output_tokens / self.duration_ms if self.duration_ms > 0 else 0.0
