"""Activation patching: which layer and position carry what makes the clean answer come out.

Two prompts of the same token length, a clean one ("The Eiffel Tower is in the city of") and a
corrupted one ("The Colosseum is in the city of"). For every layer l and position p, the
corrupted prompt runs with the residual stream entering decoder layer l (TransformerLens's
`blocks.l.hook_resid_pre`; l = 0 is the embedding output) at position p replaced by the clean
run's, and the last position's logit(clean answer) − logit(corrupt answer) is read. Where that
difference comes back to the clean run's, the patched activation carried the fact.

One batch per layer: S copies of the corrupted prompt, copy p patched at position p. The layers
before l see nothing patched, so in every copy they compute exactly the corrupted run's residual
stream; the sweep therefore starts each layer's batch at layer l from the corrupted run's stream
entering it (kept once by `layer_inputs`), puts the clean values in, and runs only decoder layers
l … L−1, the final norm and the LM head at the last position (`patched_from`), called as
transformers' LlamaModel.forward calls them. That is about half the layer work of a full forward
per layer. `patched_logits`, a full forward with a pre-hook on layer l, is the reference it is
tested against. Shapes: S positions, H hidden size, L layers, V vocabulary, B batch copies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from transformers.masking_utils import create_causal_mask

from ..errors import InputError
from ..loader import LoadedModel


@dataclass(frozen=True, slots=True, eq=False)
class PatchResult:
    clean_ids: tuple[int, ...]
    corrupt_ids: tuple[int, ...]
    clean_token: int  # the clean run's greedy answer
    corrupt_token: int  # the corrupted run's
    logit_diff: np.ndarray  # (L, S) logit(clean) − logit(corrupt), position p patched at layer l
    clean_diff: float  # the same difference, clean run unpatched
    corrupt_diff: float  # corrupted run unpatched
    seconds: float

    @property
    def normalized(self) -> np.ndarray:
        """(L, S) 0 = as the corrupted run, 1 = as the clean run (NaN if the two answers'
        differences coincide)."""
        span = self.clean_diff - self.corrupt_diff
        if span == 0:
            return np.full_like(self.logit_diff, np.nan)
        return (self.logit_diff - self.corrupt_diff) / span

    def to_json(self) -> dict[str, Any]:
        return {"clean_token": self.clean_token, "corrupt_token": self.corrupt_token,
                "tokens": list(self.corrupt_ids), "clean_tokens": list(self.clean_ids),
                "logit_diff": self.logit_diff.tolist(), "clean_diff": self.clean_diff,
                "corrupt_diff": self.corrupt_diff, "seconds": round(self.seconds, 3)}


def check_pair(lm: LoadedModel, clean: Sequence[int], corrupt: Sequence[int]) -> None:
    if len(clean) != len(corrupt):
        pieces = lm.tokenizer.convert_ids_to_tokens
        raise InputError(f"the two prompts must have the same number of tokens: clean "
                         f"{len(clean)} {pieces(list(clean))}, corrupted {len(corrupt)} "
                         f"{pieces(list(corrupt))}")
    if len(clean) < 1:
        raise InputError("the prompts are empty")


def layer_inputs(lm: LoadedModel, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """((L, S, H) the residual stream entering each decoder layer, (V,) last logits)."""
    seen: list[torch.Tensor] = []

    def keep(_module: Any, args: tuple, kwargs: dict) -> None:
        h = args[0] if args else kwargs["hidden_states"]
        seen.append(h[0].detach())

    hooks = [layer.register_forward_pre_hook(keep, with_kwargs=True)
             for layer in lm.model.model.layers]
    try:
        with torch.inference_mode():
            out = lm.model(input_ids=torch.tensor([list(ids)], device=lm.device), use_cache=False,
                           logits_to_keep=1)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(seen), out.logits[0, -1].float()


@torch.inference_mode()
def patched_logits(lm: LoadedModel, corrupt: Sequence[int], layer: int, clean_in: torch.Tensor,
                   where: torch.Tensor) -> torch.Tensor:
    """(B, V) last-position logits of B copies of the corrupted prompt, copy b with the residual
    stream entering `layer` replaced by `clean_in` (S, H) at the positions where `where[b]`
    (B, S) is true: a full forward with a pre-hook on `layer`, the reference for `patched_from`."""
    block = lm.model.model.layers[layer]
    mask = where.to(lm.device)[..., None]  # (B, S, 1)

    def put(_module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        h = args[0] if args else kwargs["hidden_states"]  # (B, S, H)
        h = torch.where(mask, clean_in.to(h.dtype)[None], h)
        if args:
            return (h, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": h}

    hook = block.register_forward_pre_hook(put, with_kwargs=True)
    try:
        batch = torch.tensor([list(corrupt)] * where.shape[0], device=lm.device)  # (B, S)
        return lm.model(input_ids=batch, use_cache=False, logits_to_keep=1).logits[:, -1].float()
    finally:
        hook.remove()


@torch.inference_mode()
def patched_from(lm: LoadedModel, layer: int, corrupt_in: torch.Tensor, clean_in: torch.Tensor,
                 where: torch.Tensor) -> torch.Tensor:
    """(B, V) the same logits as `patched_logits`, computed from `layer` on: the residual stream
    entering `layer` is the corrupted run's `corrupt_in` (S, H), replaced by `clean_in` (S, H)
    where `where` (B, S) is true; only decoder layers `layer` … L−1, the final norm and the LM
    head (last position) run. Each layer is called as LlamaModel.forward calls it (no cache)."""
    inner = lm.model.model
    mask = where.to(lm.device)[..., None]  # (B, S, 1)
    h = torch.where(mask, clean_in.to(lm.device)[None], corrupt_in.to(lm.device)[None])  # (B, S, H)
    position_ids = torch.arange(h.shape[1], device=h.device)[None]  # (1, S)
    # sdpa with no padding: None here, and sdpa's is_causal masks the future (as in the model).
    causal_mask = create_causal_mask(config=inner.config, inputs_embeds=h, attention_mask=None,
                                     cache=None, position_ids=position_ids)
    position_embeddings = inner.rotary_emb(h, position_ids=position_ids)  # (cos, sin) (1, S, D)
    for block in inner.layers[layer:inner.config.num_hidden_layers]:
        h = block(h, attention_mask=causal_mask, position_embeddings=position_embeddings,
                  position_ids=position_ids, cache=None, use_cache=False)  # (B, S, H)
    return lm.model.lm_head(inner.norm(h[:, -1:]))[:, -1].float()  # norm is per position


def patch_grid(lm: LoadedModel, clean: Sequence[int], corrupt: Sequence[int],
               say: Callable[[str, float], None] | None = None,
               stop: Callable[[], bool] | None = None) -> PatchResult:
    """The (L, S) logit differences of the corrupted prompt patched with the clean run's
    residual stream, one layer and position at a time (rows not reached before `stop()`: NaN).
    Layer l's batch starts at layer l (`patched_from`): before it every copy is the corrupted run."""
    check_pair(lm, clean, corrupt)
    start = time.perf_counter()
    clean_in, clean_logits = layer_inputs(lm, clean)  # (L, S, H), (V,)
    corrupt_in, corrupt_logits = layer_inputs(lm, corrupt)  # (L, S, H), (V,)
    good, bad = int(clean_logits.argmax()), int(corrupt_logits.argmax())
    s = len(corrupt)
    grid = np.full((lm.spec.layers, s), np.nan)
    one_each = torch.eye(s, dtype=torch.bool)  # (S copies, S): copy p patched at p alone
    for layer in range(lm.spec.layers):
        if stop is not None and stop():
            break
        if say is not None:
            say(f"Patching the residual stream entering layer {layer}…", layer / lm.spec.layers)
        last = patched_from(lm, layer, corrupt_in[layer], clean_in[layer], one_each)  # (S, V)
        grid[layer] = (last[:, good] - last[:, bad]).cpu().numpy()
    return PatchResult(tuple(clean), tuple(corrupt), good, bad, grid,
                       float(clean_logits[good] - clean_logits[bad]),
                       float(corrupt_logits[good] - corrupt_logits[bad]),
                       time.perf_counter() - start)
