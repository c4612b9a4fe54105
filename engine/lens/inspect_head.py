"""One attention head, step by step, from the model's own q, k and v.

`capture_qkv` runs a real forward over a token sequence with the recording attention function and
keeps one layer's post-RoPE queries, keys and values. `explain_head` then redoes the recipe by
hand — q·Kᵀ, scale by 1/√head_dim (the per-head dimension, not the hidden size), softmax, weighted
sum of the values — so the page can show every intermediate number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..attention import AttentionRecorder, recording
from ..kv.cachelab import check_sequence
from ..loader import LoadedModel


@dataclass(frozen=True, slots=True, eq=False)
class HeadInputs:
    query: np.ndarray  # (H, S, D) post-RoPE
    key: np.ndarray  # (KVH, S, D) post-RoPE
    value: np.ndarray  # (KVH, S, D)
    scaling: float  # what the model multiplies q·k by (1/√head_dim for Llama-family models)


@dataclass(frozen=True, slots=True, eq=False)
class HeadSteps:
    scores: np.ndarray  # (S,) q·kᵀ
    scaled: np.ndarray  # (S,) scores · scaling
    weights: np.ndarray  # (S,) softmax over the visible keys
    output: np.ndarray  # (D,) Σ weights · v


def capture_qkv(lm: LoadedModel, token_ids: list[int], layer: int, max_tokens: int = 4096
                ) -> HeadInputs:
    """One forward over `token_ids` (at most `max_tokens`, all in the vocabulary: InputError)."""
    if not 0 <= layer < lm.spec.layers:
        raise ValueError(f"layer must be between 0 and {lm.spec.layers - 1}")
    check_sequence(lm, token_ids, max_tokens)
    recorder = AttentionRecorder(layers=frozenset(), qkv_layer=layer)
    ids = torch.tensor([token_ids], device=lm.device)  # (1, S)
    with torch.inference_mode(), recording(lm.model, recorder):
        lm.model(input_ids=ids, use_cache=False, logits_to_keep=1)
    q, k, v, scaling = recorder.qkv
    return HeadInputs(q.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(),
                      scaling)


def explain_head(inputs: HeadInputs, head: int, position: int) -> HeadSteps:
    """The attention of query `position` in query head `head` over keys 0..position (causal)."""
    groups = inputs.query.shape[0] // inputs.key.shape[0]
    kv = head // groups  # the KV head this query head shares
    q = inputs.query[head, position].astype(np.float64)  # (D,)
    keys = inputs.key[kv, : position + 1].astype(np.float64)  # (S, D)
    values = inputs.value[kv, : position + 1].astype(np.float64)  # (S, D)
    scores = keys @ q
    scaled = scores * inputs.scaling
    exp = np.exp(scaled - scaled.max())
    weights = exp / exp.sum()
    return HeadSteps(scores, scaled, weights, weights @ values)
