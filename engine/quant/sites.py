"""Where a variant's weights live in a model: the decoder Linears and the embedding / LM head.

Below `variants` (which quantizes them) and `kmix` (which names each one's GGML type), so that
neither imports the other to find them.
"""

from __future__ import annotations

from typing import Any

import torch

from i18n import _

from ..errors import InputError


def embedding_weights(model: Any) -> list[torch.Tensor]:
    """The token embedding and the LM head weight, each distinct tensor once (one when tied)."""
    found = [model.get_input_embeddings().weight]
    head = getattr(model, "lm_head", None)
    if head is not None and head.weight is not found[0]:
        found.append(head.weight)
    return found


def decoder_linears(model: Any) -> list[tuple[str, torch.nn.Linear]]:
    """Every Linear inside the decoder layers (not the LM head), in module order."""
    found = [(n, m) for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and ".layers." in f".{n}"]
    if not found:
        raise InputError(_("this model has no Linear layers inside decoder layers to quantize"))
    return found
