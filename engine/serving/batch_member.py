"""One run's place in a StepBatcher (batcher.py), and what passes between the two: the fair turn
the batch takes, a step asked for and its answer, the batch as the Serving page shows it.

A `BatchedDecoder` is engine/runner.py's DecodeStep for a run whose steps are batched: its
prefill runs alone on the model (`exclusive`), its prompt's K/V go into the batcher's pool
(`load_prefix`), and each `step` waits for the batched forward that includes it.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Protocol

import torch
from transformers import DynamicCache

from ..errors import InputError

Waiting = Callable[[int, float], None]  # (place in the queue, seconds the holder has held)


class Turn(Protocol):
    """The app's fair turn as the batch takes it (ui/batching.py: ui/turns.py's FairLock)."""

    def acquire(self, on_wait: Waiting | None = None) -> None: ...

    def release(self) -> None: ...

    @property
    def others_waiting(self) -> bool: ...
@dataclass(frozen=True, slots=True, eq=False)
class BatchedOutput:
    """One run's share of a batched step (engine/runner.py's StepOutput), and the step's size."""

    logits: torch.Tensor  # (V,)
    attention: torch.Tensor | None  # (L_rec, H, S)
    hidden: torch.Tensor | None  # (L + 1, hidden)
    batch: int  # runs in the step's forward
    forward_ms: float  # the forward alone (the run's step also waited for it to start)


@dataclass(frozen=True, slots=True)
class BatchView:
    """StepBatcher.snapshot: runs admitted, runs waiting to be, the positions each decoding run
    holds, steps run so far, the recent steps as (monotonic s, batch, forward ms), the cap."""

    running: int
    waiting: int
    lengths: tuple[int, ...]
    steps: int
    recent: tuple[tuple[float, int, float], ...]
    max_batch: int


@dataclass(slots=True, eq=False)
class Ask:
    decoder: "BatchedDecoder"
    token: int
    position: int
    layers: tuple[int, ...]
    hidden: bool
    done: threading.Event = field(default_factory=threading.Event)
    result: BatchedOutput | None = None
    error: BaseException | None = None


class Batch(Protocol):
    """What a member needs of its StepBatcher (batcher.py)."""

    weights: str
    weight_bytes: int
    model: Any

    def exclusive(self, on_wait: Waiting | None = None) -> ContextManager[None]: ...

    def load(self, member: int, cache: DynamicCache, n: int) -> None: ...

    def ask(self, ask: "Ask") -> "BatchedOutput": ...

    def release(self, member: int) -> None: ...


class BatchedDecoder:
    """One run's place in a StepBatcher: engine/runner.py's DecodeStep, its steps batched."""

    name = "batched"

    def __init__(self, batcher: Batch, member: int, max_tokens: int) -> None:
        self.batcher, self.member, self.max_tokens = batcher, member, max_tokens
        self.on_wait: Waiting | None = None  # the prefill's report while the turn is elsewhere
        self.on_turn: Callable[[], None] | None = None  # and once it has it

    @property
    def weights(self) -> str:
        return self.batcher.weights

    @property
    def weight_bytes(self) -> int:
        return self.batcher.weight_bytes

    @property
    def model(self) -> Any:
        return self.batcher.model

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The run's prefill, alone on the model, in the batch's turn."""
        with self.batcher.exclusive(self.on_wait):
            if self.on_turn is not None:
                self.on_turn()
            yield

    def load_prefix(self, cache: DynamicCache, n: int) -> None:
        if n > self.max_tokens:
            raise InputError(f"{n} positions do not fit this run's {self.max_tokens}")
        self.batcher.load(self.member, cache, n)

    def step(self, token: int, position: int, attention_layers: tuple[int, ...] = (),
             hidden: bool = False) -> BatchedOutput:
        if position >= self.max_tokens:
            raise InputError(f"position {position} is past this run's {self.max_tokens} tokens")
        return self.batcher.ask(Ask(self, token, position, tuple(attention_layers), hidden))

    def release(self) -> None:
        """Leave the batch: its blocks go back to the pool (also when the decoder is dropped)."""
        self.batcher.release(self.member)
