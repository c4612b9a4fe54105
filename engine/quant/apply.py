"""A weights variant's copy of the loaded model, for every variant name: plain rounding
(engine/quant/variants.py) or, for awq_<format>, AWQ's scale search and then that rounding
(engine/quant/awq.py). The one entry the CLI, the app, the quality measure and the study call.
"""

from __future__ import annotations

from typing import Any

from i18n import N_, _

from ..errors import EngineError
from ..loader import LoadedModel, is_mapped_model
from .awq import apply_awq
from .variants import AWQ_PREFIX, WeightReport, round_variant

MAPPED_COPY = N_("A weights variant is a quantized copy of float32 weights; a model opened from a "
                 "GGUF file runs on its stored blocks, already quantized, and holds no float32 "
                 "weights to copy (an 8B model's would be 32 GB): use the default model.")


def refuse_mapped(lm: LoadedModel, why: str = MAPPED_COPY) -> None:
    """EngineError(`why`, translated) for a model on a GGUF file's mapped blocks: whatever would
    need its float32 weights (a copy of them all) says so in one line instead of making one."""
    if is_mapped_model(lm.model):
        raise EngineError(_(why))


def apply_variant(lm: LoadedModel, name: str) -> tuple[Any, WeightReport]:
    """A copy of the loaded model whose decoder Linear weights went through variant `name`
    (stored, then dequantized to float32), and the variant's bytes, measured and by formula.
    The shared model is only read; a model on a GGUF file's blocks is refused (`MAPPED_COPY`)."""
    refuse_mapped(lm)
    if name.startswith(AWQ_PREFIX):  # activation-aware: scales searched first
        return apply_awq(lm, name)
    return round_variant(lm, name)
