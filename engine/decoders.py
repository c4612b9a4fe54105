"""What plugs into a recorded run as its decoder (engine/runner.py's `native=`): the protocols a
decode step, and a decoder shared by many runs, follow.

A :class:`DecodeStep` (engine/kernels/native.py's NativeDecoder) decodes one run's tokens after
its prefill; a :class:`Seats` (engine/serving/batcher.py's StepBatcher) hands each run a
:class:`SharedStep` of its own once it has a place: a decoder shared with other runs, which
also runs the prefill (`prefill`, in the batch's turn: `joining`) and gives its place back when
the run ends (`release`); its outputs say the batch they ran in (`batch`, `forward_ms`).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, ContextManager, Protocol

import torch
from transformers import DynamicCache

from .spec import ModelSpec


class StepOutput(Protocol):
    """What one step of a plugged-in decoder returns."""

    @property
    def logits(self) -> torch.Tensor: ...  # (V,)

    @property
    def attention(self) -> torch.Tensor | None: ...  # (L_rec, H, S) softmax rows, or None

    @property
    def hidden(self) -> torch.Tensor | None: ...  # (L + 1, hidden), or None


class Decoder(Protocol):
    """What every plugged-in decoder has: `step` runs one token at a time, recording what the
    run asks for."""

    @property
    def max_tokens(self) -> int: ...  # positions its cache holds

    @property
    def weights(self) -> str: ...  # the weights variant it reads

    @property
    def weight_bytes(self) -> int: ...  # bytes one step streams

    @property
    def model(self) -> Any: ...  # the torch model holding exactly the weights it multiplies by

    def step(self, token: int, position: int, attention_layers: tuple[int, ...] = (),
             hidden: bool = False) -> StepOutput: ...


class DecodeStep(Decoder, Protocol):
    """A decoder the run hands its decode steps to (engine/kernels/native.py's NativeDecoder):
    the prefill runs in transformers on `model`, then `load_prefix` copies its K/V into the
    decoder's own cache."""

    def load_prefix(self, cache: DynamicCache, n: int) -> None: ...


class Seats(Protocol):
    """A decoder shared by many runs (engine/serving/batcher.py's StepBatcher): `admit` waits
    for a place holding `tokens` positions (or `stop`), and returns the run's DecodeStep."""

    def admit(self, tokens: int, stop: threading.Event) -> "SharedStep": ...


DecoderSource = DecodeStep | Callable[[], DecodeStep] | Seats


def native_cache_bytes(spec: ModelSpec, positions: int) -> tuple[int, ...]:
    """Per layer, the bytes a transformers DynamicCache holds for `positions` cached tokens —
    2 (K and V) · kv_heads · positions · head_dim · bytes per value — so a run decoded by the
    native step reports the same KV figure as one decoded in torch (its own cache is
    preallocated to its max_tokens; this counts what is in use, the same positions)."""
    return (2 * spec.kv_heads * positions * spec.head_dim * spec.dtype_bytes,) * spec.layers


class SharedStep(Decoder, Protocol):
    """A decoder shared with other runs (engine/serving/batch_member.py's BatchedDecoder): the
    run finds these members with getattr, so a DecodeStep needs none of them."""

    def joining(self) -> ContextManager[None]: ...  # the prefill's turn (its wait not timed)

    def prefill(self, prompt_ids: list[int], attention_layers: tuple[int, ...] = (),
                hidden: bool = False) -> StepOutput: ...  # attention (L_rec, H, T, T)

    def release(self) -> None: ...  # the run has ended: its place goes back
