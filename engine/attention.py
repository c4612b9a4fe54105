"""Recording attention weights without giving up sdpa.

transformers' `AttentionInterface` lets a model call a named attention function. Ours computes the
layer's output with the stock sdpa function (so tokens and speed match the unrecorded model) and,
only while a :func:`recording` context is active, also the softmax weights from the post-RoPE
query and the keys it is handed — the same formula eager attention uses.

The model's implementation is switched to ours only inside :func:`recording`, and always switched
back on exit, so a model shared by many sessions never keeps an instrument attached. Ours is
registered with transformers there too, on first use: importing this module registers nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from .settings import GenerationSettings
from .spec import ModelSpec

RECORDING_ATTENTION = "inference_explorer_sdpa"

_active: contextvars.ContextVar["AttentionRecorder | None"] = contextvars.ContextVar(
    "inference_explorer_recorder", default=None)
# An attention function that replaces sdpa for this context only (engine/kv/shrink: attention
# over some of the keys): other sessions sharing the model keep the stock path.
_override: contextvars.ContextVar[Callable[..., Any] | None] = contextvars.ContextVar(
    "inference_explorer_attention", default=None)


@dataclass(slots=True)
class AttentionRecorder:
    """Collects one forward pass's attention weights for the chosen layers.

    `last_query_only` keeps just the newest query row (used when the cache is off and every
    step recomputes the whole sequence, but only the new token's row is wanted).
    """

    layers: frozenset[int] | None = None
    last_query_only: bool = False
    qkv_layer: int | None = None
    captured: dict[int, torch.Tensor] = field(default_factory=dict)
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float] | None = None

    def wants(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers

    def take(self, batch_index: int = 0) -> torch.Tensor | None:
        """Stack captured layers in layer order → (L_rec, H, T, S) float16 on the CPU; reset."""
        if not self.captured:
            return None
        stacked = torch.stack([self.captured[k][batch_index] for k in sorted(self.captured)])
        self.captured = {}
        return stacked.to(device="cpu", dtype=torch.float16)


def attention_weights(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
                      scaling: float, last_query_only: bool = False) -> torch.Tensor:
    """softmax(q·kᵀ · scaling + mask) in float32, as eager attention computes it.

    query (B, H, T, D) post-RoPE; key (B, KVH, S, D) = the whole cache after this step's update.
    Query heads are grouped by the KV head they share (head h uses KV head h // (H / KVH), as
    `repeat_kv` lays them out), so keys are never copied per query head.
    Returns (B, H, T, S), or (B, H, 1, S) with `last_query_only`.
    """
    if last_query_only:
        query = query[:, :, -1:, :]
    b, h, t, d = query.shape
    kvh, s = key.shape[1], key.shape[2]
    q = query.float().reshape(b, kvh, (h // kvh) * t, d)  # (B, KVH, G·T, D)
    scores = torch.matmul(q, key.float().transpose(-1, -2)).view(b, h, t, s) * scaling  # (B, H, T, S)
    if attention_mask is not None:
        mask = attention_mask[..., -t:, -s:]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
    elif t > 1:  # no mask given means plain causal; a single new query sees the whole cache
        q_pos = torch.arange(s - t, s, device=scores.device)[:, None]
        allowed = torch.arange(s, device=scores.device)[None, :] <= q_pos  # (T, S)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1)


def _recording_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, attention_mask: torch.Tensor | None,
                    scaling: float | None = None, dropout: float = 0.0,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    replaced = _override.get()
    if replaced is not None:
        return replaced(module, query, key, value, attention_mask, scaling)
    out = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                 dropout=dropout, **kwargs)
    recorder = _active.get()
    layer = getattr(module, "layer_idx", None)
    if recorder is None or layer is None:
        return out
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if recorder.wants(layer):
        recorder.captured[layer] = attention_weights(query, key, attention_mask, scale,
                                                     recorder.last_query_only)
    if recorder.qkv_layer == layer:
        recorder.qkv = (query[0].detach().clone(), key[0].detach().clone(),
                        value[0].detach().clone(), float(scale))
    return out


def register() -> None:
    """Make RECORDING_ATTENTION a name transformers knows (idempotent). Called by `recording`
    before it switches a model to it, so importing this module changes no global table."""
    if AttentionInterface().get(RECORDING_ATTENTION) is not _recording_sdpa:
        AttentionInterface.register(RECORDING_ATTENTION, _recording_sdpa)
        ALL_MASK_ATTENTION_FUNCTIONS.register(RECORDING_ATTENTION, sdpa_mask)


_configs: "weakref.WeakKeyDictionary[Any, list[Any]]" = weakref.WeakKeyDictionary()


def _attention_configs(model: Any) -> list[Any]:
    """Every distinct config in the model that selects an attention function (found once)."""
    if model not in _configs:
        from transformers import PreTrainedModel

        found = {id(m.config): m.config for m in model.modules() if isinstance(m, PreTrainedModel)}
        _configs[model] = list(found.values())
    return _configs[model]


def _switch(model: Any, implementation: str) -> None:
    # What `set_attn_implementation` ends with, minus its validation walk over every module
    # (paid twice a step otherwise): `recording` registered our function, nothing to validate.
    for config in _attention_configs(model):
        config._attn_implementation_internal = implementation


@contextlib.contextmanager
def recording(model: Any, recorder: AttentionRecorder | None) -> Iterator[AttentionRecorder | None]:
    """Route `model`'s attention through the recorder for the duration; always restore it.

    With `recorder=None` nothing is changed: the model runs its usual sdpa path.
    """
    if recorder is None:
        yield None
        return
    register()
    previous = model.config._attn_implementation
    token = _active.set(recorder)
    _switch(model, RECORDING_ATTENTION)
    try:
        yield recorder
    finally:
        _switch(model, previous)
        _active.reset(token)


@contextlib.contextmanager
def overriding(model: Any, attend: Callable[..., Any]) -> Iterator[None]:
    """Route `model`'s attention, in this context only, through `attend(module, query, key,
    value, attention_mask, scaling)` → (output (B, T, H, D), None); always restore it."""
    register()
    previous = model.config._attn_implementation
    token = _override.set(attend)
    _switch(model, RECORDING_ATTENTION)
    try:
        yield
    finally:
        _switch(model, previous)
        _override.reset(token)


def recorded_layers(spec: ModelSpec, settings: GenerationSettings, prompt_len: int) -> tuple[int, ...]:
    """Which layers' attention to keep: the requested ones, or as many evenly spaced layers as fit
    the budget for the whole run's attention, float16: the prefill's matrices (heads · T² · 2
    bytes a layer) and every decode step's row over the growing cache (heads · (T + i) · 2), so a
    run of an 8B model (32 layers × 32 heads) stays within the budget however long it runs."""
    if not settings.record_attention:
        return ()
    if settings.attention_layers is not None:
        return settings.attention_layers
    per_layer = attention_bytes(spec.heads, prompt_len, settings.max_new_tokens)
    fit = max(1, min(spec.layers, settings.attention_budget_mb * 2**20 // max(per_layer, 1)))
    return tuple(sorted({round(i * (spec.layers - 1) / max(fit - 1, 1)) for i in range(fit)}))


def attention_bytes(heads: int, prompt_len: int, new_tokens: int) -> int:
    """Float16 attention one layer records in a run: the prefill's heads · T² and each of the
    new_tokens − 1 decode steps' heads · (T + i) softmax rows."""
    steps = max(0, new_tokens - 1)
    return heads * 2 * (prompt_len * prompt_len + steps * prompt_len + steps * (steps + 1) // 2)
