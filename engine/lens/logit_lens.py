"""The logit lens: what each layer would predict if the model stopped there — its recorded hidden
state at the last position, through the model's final norm and LM head.

Why the last row is special: transformers returns the last layer's hidden state *after* the
final norm (it is what the LM head reads), so the lens applies the norm to the embedding output
and every layer but the last, and the LM head alone to the last. The last row is therefore the
model's own next-token distribution — which the tests check against the trace's top-k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import EngineError


@dataclass(frozen=True, slots=True)
class LensRow:
    layer: int  # 0 = the embedding output, l = after decoder layer l
    top_ids: tuple[int, ...]
    top_pieces: tuple[str, ...]
    top_probs: tuple[float, ...]
    chosen_prob: float  # the token the model finally produced, at this layer
    chosen_rank: int  # 0 = this layer's most probable token


def logit_lens(lm: Any, hidden: np.ndarray, chosen: int, k: int = 5) -> tuple[LensRow, ...]:
    """One row per entry of `hidden` (layers + 1, hidden_size) from a trace step."""
    model = lm.model
    norm = getattr(getattr(model, "model", None), "norm", None)
    head = getattr(model, "lm_head", None)
    if norm is None or head is None:
        raise EngineError("this model has no final norm and LM head the lens can apply")
    if hidden.ndim != 2 or hidden.shape[1] != lm.spec.hidden_size:
        raise EngineError(f"hidden states of shape {hidden.shape} do not fit this model")
    if not 0 <= chosen < lm.spec.vocab_size:
        raise EngineError(f"token id {chosen} is outside this model's vocabulary")
    like = norm.weight  # the head's device and dtype: a GGUF's stored head has no float weight
    with torch.inference_mode():
        h = torch.from_numpy(np.ascontiguousarray(hidden)).to(like.device, like.dtype)
        normed = norm(h)  # (L+1, hidden): the residual stream, through the model's final norm
        probs = torch.softmax(head(normed).float(), dim=-1)  # (L+1, V)
        top = torch.topk(probs, k, dim=-1)
        chosen_probs = probs[:, chosen]  # (L+1,)
        ranks = (probs > chosen_probs[:, None]).sum(dim=-1)  # (L+1,)
    ids = top.indices.cpu().numpy()
    return tuple(
        LensRow(layer=i, top_ids=tuple(int(t) for t in ids[i]),
                top_pieces=tuple(lm.tokenizer.convert_ids_to_tokens(ids[i].tolist())),
                top_probs=tuple(float(p) for p in top.values[i].cpu()),
                chosen_prob=float(chosen_probs[i]), chosen_rank=int(ranks[i]))
        for i in range(len(ids)))
