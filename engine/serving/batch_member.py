"""One run's place in a StepBatcher (batcher.py), and what passes between the two: the fair turn
the batch takes, a step asked for and its answer, the batch as the Serving page shows it.

A `BatchedDecoder` is engine/runner.py's DecodeStep for a run whose steps are batched: its
prefill, in the batch's turn (`joining`), is one more chunk of the batched forward that includes
it (`prefill`: the prompt's K/V written into the pool there), and so is each decode `step`.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Protocol

import torch

from ..errors import InputError
from ..sampling import Choice

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
    attention: torch.Tensor | None  # (L_rec, H, S) a decode step's; a prefill's (L_rec, H, T, T)
    hidden: torch.Tensor | None  # (L + 1, hidden) at the last new position
    batch: int  # runs in the step's forward
    forward_ms: float  # the forward alone (the run's step also waited for it to start)
    choice: Choice | None = None  # the greedy token and its top-k, chosen for the whole batch


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
    """A run's share of the next forward: its new tokens from `position` on (a decode step's
    one token, or with `prefill` the whole prompt from 0), and what it records."""

    decoder: "BatchedDecoder"
    tokens: tuple[int, ...]
    position: int
    layers: tuple[int, ...]
    hidden: bool
    prefill: bool = False
    greedy_top_k: int | None = None  # set: choose the greedy token, keep this many candidates
    done: threading.Event = field(default_factory=threading.Event)
    result: BatchedOutput | None = None
    error: BaseException | None = None


class Batch(Protocol):
    """What a member needs of its StepBatcher (batcher.py)."""

    weights: str
    weight_bytes: int
    model: Any

    def joining(self, member: int, on_wait: Waiting | None = None) -> ContextManager[None]: ...

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
    def joining(self) -> Iterator[None]:
        """The run's prefill, in the batch's turn (waiting for it is reported to `on_wait`, and
        is not the prefill's time): the next step waits for it (prefills first)."""
        with self.batcher.joining(self.member, self.on_wait):
            if self.on_turn is not None:
                self.on_turn()
            yield

    def prefill(self, prompt_ids: list[int], attention_layers: tuple[int, ...] = (),
                hidden: bool = False, greedy_top_k: int | None = None) -> BatchedOutput:
        """The prompt through the model, batched with whatever else the step holds: the last
        position's logits, each recorded layer's whole attention (L_rec, H, T, T), its K/V into
        the pool. `greedy_top_k`: see `step`."""
        if not prompt_ids or len(prompt_ids) > self.max_tokens:
            raise InputError(f"{len(prompt_ids)} positions do not fit this run's {self.max_tokens}")
        return self.batcher.ask(Ask(self, tuple(prompt_ids), 0, tuple(attention_layers), hidden,
                                    prefill=True, greedy_top_k=greedy_top_k))

    def step(self, token: int, position: int, attention_layers: tuple[int, ...] = (),
             hidden: bool = False, greedy_top_k: int | None = None) -> BatchedOutput:
        """One decode step in the batch. With `greedy_top_k` the output also holds the greedy
        token and its `greedy_top_k` most probable candidates (`choice`), chosen for every such
        run of the step at once: a run's thread then does no tensor work between its steps (a
        class of runs each doing its own took as long between two steps as the step itself)."""
        if position >= self.max_tokens:
            raise InputError(f"position {position} is past this run's {self.max_tokens} tokens")
        return self.batcher.ask(Ask(self, (token,), position, tuple(attention_layers), hidden,
                                    greedy_top_k=greedy_top_k))

    def release(self) -> None:
        """Leave the batch: its blocks go back to the pool (also when the decoder is dropped)."""
        self.batcher.release(self.member)
