"""The Trace: everything one run measured, the single contract between engine and UI.

Frozen dataclasses. Numbers that can be derived (TTFT, ITL, output text) are properties, not
stored twice. Array fields are numpy arrays; `eq=False` because numpy equality is elementwise —
compare traces with :func:`traces_equal`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from i18n import _

from ..settings import GenerationSettings
from ..spec import ModelSpec

PHASES = ("prefill", "decode")
STOP_REASONS = ("eos", "length", "stopped", "limit", "running")  # limit: a server's time budget


@dataclass(frozen=True, slots=True, eq=False)
class Step:
    """One forward pass and the token it produced.

    The prefill step runs the whole prompt and yields the first output token; each decode step
    runs one token. `context_len` is the number of positions that step attended over (the cache
    length after it); `position` is the produced token's position. `latency_ms` is the step's own
    wall time, sampling and recording included (CUDA: synchronized); `forward_ms` is the model
    forward within it, and `cpu_ms` / `others_share` say whether other work on the machine delayed
    it (see engine/timing/disturbance.py). Attention is
    (L_rec, H, T_query, context_len) float16 — T_query is the prompt length for prefill, 1 for a
    decode step; `hidden` is (layers + 1, hidden_size): the embedding output, then each layer's
    output, at the last position.
    """

    index: int
    phase: str
    token_id: int
    piece: str
    text: str
    position: int
    context_len: int
    latency_ms: float
    kv_bytes: int
    kv_bytes_per_layer: tuple[int, ...]
    top_ids: np.ndarray
    top_probs: np.ndarray
    top_pieces: tuple[str, ...]
    chosen_prob: float
    chosen_rank: int
    attention: np.ndarray | None = None
    hidden: np.ndarray | None = None
    forward_ms: float | None = None  # the model forward alone (no sampling, no recording)
    cpu_ms: float | None = None  # CPU time this process used during the step, all threads
    others_share: float | None = None  # share (0–1) of all CPUs' time other processes used
    batch: int = 1  # runs whose steps shared this forward (engine/serving/batcher.py); 1: alone

    def __post_init__(self) -> None:
        if len(self.top_pieces) != len(self.top_ids):
            raise ValueError("top_pieces and top_ids differ in length")
        if self.phase not in PHASES:
            raise ValueError(f"unknown phase {self.phase!r}")


@dataclass(frozen=True, slots=True)
class MachineLoad:
    """The machine around a run: how many threads the model ran on, how many cores this process
    may use, the 1-minute load average before and after, and the share of all CPUs' time that
    other processes used during the run (None where the OS does not say)."""

    threads: int
    cores: int
    load_before: float | None
    load_after: float | None
    others_share: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        return {name: getattr(self, name) for name in
                ("threads", "cores", "load_before", "load_after", "others_share")}


DECODER_NAMES = ("native", "torch", "batched")


@dataclass(frozen=True, slots=True)
class DecoderUsed:
    """What ran a run's decode steps: the hand-written C step ("native"), transformers
    ("torch", with the one-line reason the native step did not run) or the hosted server's
    batched steps ("batched": engine/serving/batcher.py, one forward for every live run's step),
    and the weights it read.

    `weights` names the variant (fp32, fp16, bf16, int8, q4_0, … — engine/quant/variants.py);
    `weight_bytes` is measured from the tensors the decode step used: the native decoder's packed
    buffer (codes, scales and norms, padding included) when it ran, else the bytes of the torch
    model's tensors (a quantized variant's copy holds them dequantized: float32 bytes).
    """

    name: str
    reason: str | None  # why not native; None when native ran
    weights: str
    weight_bytes: int

    def __post_init__(self) -> None:
        if self.name not in DECODER_NAMES:
            raise ValueError(f"unknown decoder {self.name!r}")
        if (self.name == "torch") != (self.reason is not None):
            raise ValueError("a torch decoder says why the native step did not run; a native one "
                             "has no such reason")

    @property
    def label(self) -> str:
        """One line for a page or the CLI: "native C step" or "torch eager — <reason>", in the
        session's language (a reason recorded in English is one of the runner's messages)."""
        if self.name == "native":
            return _("native C step")
        if self.name == "batched":
            return _("server's batch (continuous batching)")
        return _("torch eager — {reason}").format(reason=_(self.reason) if self.reason else "")

    def to_dict(self) -> dict[str, str | int | None]:
        return {"name": self.name, "reason": self.reason, "weights": self.weights,
                "weight_bytes": self.weight_bytes}


SPECULATION_METHODS = ("prompt-lookup",)


@dataclass(frozen=True, slots=True)
class Speculation:
    """How a speculative run decoded (engine/serving/speculative.py): the drafter (`method`), at
    most `draft_tokens` drafts per verify step, matched on n-grams of up to `ngram` tokens, and per
    verify step — every forward after the prefill, each scoring the last token plus 0 … k drafts —
    the drafts proposed and accepted, the tokens it emitted (accepted + the model's own next
    token; only a last step that accepted an end-of-sequence draft emits just its accepted ones)
    and its ms (the forward, the acceptance and the cache crop; synchronized).

    Kept beside the steps because a verify step's tokens arrive together: the trace still has one
    Step per output token, but only the first token of a verify step carries the verify's time
    (see `Trace.itl_ms`), so per-verify-step times and counts live here."""

    method: str
    draft_tokens: int
    ngram: int
    step_proposed: tuple[int, ...]
    step_accepted: tuple[int, ...]
    step_tokens: tuple[int, ...]
    step_ms: tuple[float, ...]

    @property
    def verify_steps(self) -> int:
        return len(self.step_ms)

    @property
    def proposed(self) -> int:
        return sum(self.step_proposed)

    @property
    def accepted(self) -> int:
        return sum(self.step_accepted)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted ÷ proposed drafts; None when nothing was proposed."""
        return self.accepted / self.proposed if self.proposed else None

    @property
    def tokens_per_verify_step(self) -> float | None:
        """Tokens emitted ÷ verify steps (1.0 is plain decoding); None before the first."""
        return sum(self.step_tokens) / self.verify_steps if self.verify_steps else None

    def drafted(self, output_tokens: int) -> tuple[bool, ...]:
        """Per output token: did it come from an accepted draft? The prefill's token and each
        verify step's own (bonus) token did not."""
        flags = [False] if output_tokens else []
        for accepted, tokens in zip(self.step_accepted, self.step_tokens):
            flags += [True] * accepted + [False] * (tokens - accepted)
        return tuple(flags[:output_tokens])

    def first_of_step(self, output_tokens: int) -> tuple[bool, ...]:
        """Per output token: is it the first of its forward (the prefill's, or a verify step's
        first)? Those tokens carry the forward's time; the others arrived with them."""
        flags = [True] if output_tokens else []
        for tokens in self.step_tokens:
            flags += [True] + [False] * (tokens - 1)
        return tuple(flags[:output_tokens])

    def to_dict(self) -> dict[str, object]:
        return {"method": self.method, "draft_tokens": self.draft_tokens, "ngram": self.ngram,
                "step_proposed": list(self.step_proposed),
                "step_accepted": list(self.step_accepted),
                "step_tokens": list(self.step_tokens), "step_ms": list(self.step_ms)}


@dataclass(frozen=True, slots=True)
class BranchOf:
    """What makes a run a branch of another (engine/whatif/branch.py): the same prompt and
    `parent_tokens[:at]`, then `token` at index `at` where the parent had `parent_tokens[at]`,
    then the model's own choices. Steps 0 … at are the parent's records (the branch point's with
    the token replaced: the model's distribution there is the parent's); the steps after it ran
    against the parent's cached keys and values of `reused_tokens` positions, `computed_tokens`
    forwards in all, in `branch_ms`; `rerun_ms` is the same branch recomputed from nothing
    (a prefill of prompt + prefix + token, then the same steps) — None when a click's budget ran
    out before it ended: no comparison — and `same_as_rerun` whether the two chose the same
    tokens."""

    at: int
    token: int
    parent_tokens: tuple[int, ...]
    reused_tokens: int
    computed_tokens: int
    branch_ms: float
    rerun_ms: float | None
    same_as_rerun: bool

    @property
    def saved_ms(self) -> float | None:
        return None if self.rerun_ms is None else self.rerun_ms - self.branch_ms

    def to_dict(self) -> dict[str, object]:
        return {name: list(getattr(self, name)) if name == "parent_tokens" else getattr(self, name)
                for name in self.__slots__}


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    model: ModelSpec
    settings: GenerationSettings
    prompt: str
    prompt_token_ids: tuple[int, ...]
    prompt_pieces: tuple[str, ...]
    prompt_special: tuple[bool, ...]
    steps: tuple[Step, ...]
    stop_reason: str
    tokenize_ms: float
    device: str
    attention_layers: tuple[int, ...]
    created_at: str
    engine_version: str
    machine: MachineLoad | None = None  # None in format 1–2 files (not measured then)
    decoder: DecoderUsed | None = None  # None in format 1–3 files (torch, not named)
    speculation: Speculation | None = None  # a speculative run's record; None for plain runs
    branch: BranchOf | None = None  # a branch's record (format 7); None for runs from a prompt

    def __post_init__(self) -> None:
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(f"unknown stop reason {self.stop_reason!r}")

    @property
    def output_token_ids(self) -> tuple[int, ...]:
        return tuple(s.token_id for s in self.steps)

    @property
    def output_text(self) -> str:
        return "".join(s.text for s in self.steps)

    @property
    def prefill(self) -> Step | None:
        return self.steps[0] if self.steps else None

    @property
    def decode_steps(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.phase == "decode")

    @property
    def ttft_ms(self) -> float | None:
        """Request to first output token: tokenization plus the prefill step."""
        return self.tokenize_ms + self.steps[0].latency_ms if self.steps else None

    @property
    def decode_forwards(self) -> tuple[Step, ...]:
        """The decode steps that ran a forward of their own: all of a plain run's; in a
        speculative run, each verify step's first token (the others came with it, forward 0 ms).
        What a per-forward view (a roofline point, bytes per forward) should read."""
        if self.speculation is None:
            return self.decode_steps
        first = self.speculation.first_of_step(len(self.steps))
        return tuple(s for s, f in zip(self.steps, first) if f and s.phase == "decode")

    @property
    def itl_ms(self) -> tuple[float, ...]:
        """Gap between consecutive output tokens, one per decode step (first token excluded).

        In a speculative run the tokens of one verify step arrive together: the first carries the
        verify's time, the others only their own bookkeeping after it (well under a ms), so these
        gaps are true arrival gaps but their median is no per-step cost — read
        `speculation.step_ms` for that, and tokens/s or TPOT for the rate."""
        return tuple(s.latency_ms for s in self.decode_steps)

    @property
    def token_times_ms(self) -> tuple[float, ...]:
        """When each output token was ready, from the request (engine time, for replay pacing)."""
        times, now = [], self.tokenize_ms
        for step in self.steps:
            now += step.latency_ms
            times.append(now)
        return tuple(times)

    @property
    def kv_bytes(self) -> int:
        return self.steps[-1].kv_bytes if self.steps else 0

    def prefix(self, n: int) -> "Trace":
        """The trace as it stood after its first `n` steps (for replaying at the recorded pace)."""
        return replace(self, steps=self.steps[:n], stop_reason="running" if n < len(self.steps)
                       else self.stop_reason)


def _array_equal(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
            and a.shape == b.shape and np.array_equal(a, b))


def traces_equal(a: Trace, b: Trace) -> bool:
    """Exact equality, arrays included (dtype, shape and every value)."""
    for f in fields(Trace):
        if f.name != "steps" and getattr(a, f.name) != getattr(b, f.name):
            return False
    if len(a.steps) != len(b.steps):
        return False
    for sa, sb in zip(a.steps, b.steps):
        for f in fields(Step):
            va, vb = getattr(sa, f.name), getattr(sb, f.name)
            arrays = isinstance(va, np.ndarray) or isinstance(vb, np.ndarray)
            same = _array_equal(va, vb) if arrays else va == vb
            if not same:
                return False
    return True
