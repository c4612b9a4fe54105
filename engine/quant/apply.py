"""A weights variant's copy of the loaded model, for every variant name: plain rounding
(engine/quant/variants.py) or, for awq_<format>, AWQ's scale search and then that rounding
(engine/quant/awq.py). The one entry the CLI, the app, the quality measure and the study call.
"""

from __future__ import annotations

from typing import Any

from ..loader import LoadedModel
from .awq import apply_awq
from .variants import AWQ_PREFIX, WeightReport, round_variant


def apply_variant(lm: LoadedModel, name: str) -> tuple[Any, WeightReport]:
    """A copy of the loaded model whose decoder Linear weights went through variant `name`
    (stored, then dequantized to float32), and the variant's bytes, measured and by formula.
    The shared model is only read."""
    if name.startswith(AWQ_PREFIX):  # activation-aware: scales searched first
        return apply_awq(lm, name)
    return round_variant(lm, name)
