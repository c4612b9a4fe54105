"""Attention arrays and per-head statistics of a Trace: pure numpy, no figures (those are in charts/).

Attention arrays in a trace: prefill (L_rec, H, T, T); decode step k (L_rec, H, 1, T + k), the row
of the token fed at step k (position T + k − 1) over the whole cache. `full_attention` stitches
them into one (S, S) matrix per head, S = T + decode steps.
"""

from __future__ import annotations

import numpy as np

from ..records.trace import Trace


def has_attention(trace: Trace) -> bool:
    return bool(trace.attention_layers) and bool(trace.steps) and trace.steps[0].attention is not None


def layer_slot(trace: Trace, layer: int) -> int:
    """Index of model layer `layer` in the recorded attention arrays."""
    return trace.attention_layers.index(layer)


def full_attention(trace: Trace, layer: int) -> np.ndarray:
    """(H, S, S) float32: prefill rows, then each decode step's row; NaN where causally masked."""
    slot = layer_slot(trace, layer)
    prefill = trace.steps[0].attention[slot].astype(np.float32)  # (H, T, T)
    heads, t = prefill.shape[0], prefill.shape[1]
    s = t + len(trace.steps) - 1
    out = np.full((heads, s, s), np.nan, dtype=np.float32)
    lower = np.tril(np.ones((t, t), dtype=bool))
    out[:, :t, :t] = np.where(lower, prefill, np.nan)
    for k, step in enumerate(trace.steps[1:], start=1):
        out[:, t + k - 1, : t + k] = step.attention[slot, :, 0, :]  # (H, T + k)
    return out


def head_summary(trace: Trace) -> dict[str, np.ndarray]:
    """Per (layer, head) over the prefill matrix, averaged over query rows:
    entropy (nats), weight on the first token, on the previous token, on itself.
    Works one layer at a time so a long prompt never needs a float64 copy of every layer."""
    attention = trace.steps[0].attention  # (L, H, T, T) float16
    layers, heads, t = attention.shape[0], attention.shape[1], attention.shape[-1]
    out = {name: np.zeros((layers, heads)) for name in ("entropy", "first", "previous", "self")}
    idx = np.arange(t)
    for li in range(layers):
        a = attention[li].astype(np.float32)  # (H, T, T)
        plogp = np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0)
        out["entropy"][li] = -plogp.sum(-1, dtype=np.float64).mean(-1)
        out["first"][li] = a[:, :, 0].mean(-1, dtype=np.float64)
        out["self"][li] = a[:, idx, idx].mean(-1, dtype=np.float64)
        if t > 1:
            out["previous"][li] = a[:, idx[1:], idx[:-1]].mean(-1, dtype=np.float64)
    return out


def head_roles(summary: dict[str, np.ndarray], threshold: float = 0.5) -> np.ndarray:
    """A rough label per head from its summary: sink, previous-token, self, or mixed."""
    roles = np.full(summary["first"].shape, "mixed", dtype=object)
    roles[summary["self"] > threshold] = "self"
    roles[summary["previous"] > threshold] = "previous-token"
    roles[summary["first"] > threshold] = "sink (first token)"
    return roles


def gqa_groups(heads: int, kv_heads: int) -> list[list[int]]:
    """Which query heads read each KV head (transformers' repeat_kv layout: h // (H / KVH))."""
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} KV heads evenly")
    group = heads // kv_heads
    return [list(range(j * group, (j + 1) * group)) for j in range(kv_heads)]
