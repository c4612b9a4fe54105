"""Quality of a weight variant against float32, by teacher forcing on a fixed text.

Both models read the same tokens (the text, not their own samples), so every position compares
two next-token distributions over the same context — the approach of engine/kv/cachelab.py for
cache variants. Per position t (predicting token t+1 of the text):
- KL(fp32 ‖ variant) = Σ_v p(v) (log p(v) − log q(v)), in nats: what the variant loses of the
  reference distribution (0 when identical);
- top-1 agreement: the same most probable token;
- perplexity = exp(mean over t of −log q(text[t+1])), computed twice — by our own loop over
  log-softmax and by transformers' own loss (labels = input_ids) — which must agree, so the
  number on screen is not one implementation's word.
The text ships in assets/texts/ (source in its README; read by engine/quant/texts.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..loader import LoadedModel
from .apply import apply_variant
from .texts import read_text, text_ids
from .variants import WeightReport


@dataclass(frozen=True, slots=True, eq=False)
class QualityResult:
    report: WeightReport
    tokens: int  # tokens of the text; tokens − 1 positions are scored
    perplexity: float  # our loop over log-softmax
    perplexity_transformers: float  # exp(transformers' loss with labels = input_ids)
    perplexity_fp32: float  # the reference's, by our loop
    kl: np.ndarray  # (tokens − 1,) KL(fp32 ‖ variant) per position, nats
    top1: np.ndarray  # (tokens − 1,) bool: same most probable token as fp32
    seconds: float  # the whole measurement: copy, quantization, both forwards

    @property
    def kl_mean(self) -> float:
        return float(self.kl.mean())

    @property
    def top1_agreement(self) -> float:
        return float(self.top1.mean())

    def to_json(self) -> dict[str, Any]:
        """The `python -m engine quality` document."""
        return {"weights": self.report.variant, "bytes": self.report.nbytes,
                "formula_bytes": self.report.formula_bytes, "perplexity": self.perplexity,
                "perplexity_fp32": self.perplexity_fp32, "kl_mean": self.kl_mean,
                "top1_agreement": self.top1_agreement, "tokens": self.tokens,
                "perplexity_transformers": self.perplexity_transformers,
                "seconds": round(self.seconds, 3), "weight_report": self.report.to_dict()}


@torch.inference_mode()
def scored_forward(model: Any, ids: list[int]) -> tuple[torch.Tensor, float]:
    """(S − 1, V) float32 log-probabilities of each next token, and exp(transformers' loss)."""
    device = next(model.parameters()).device
    seq = torch.tensor([ids], device=device)  # (1, S)
    out = model(input_ids=seq, labels=seq)
    logp = torch.log_softmax(out.logits[0, :-1].float(), -1)  # (S − 1, V)
    return logp, math.exp(float(out.loss))


def perplexity(logp: torch.Tensor, ids: list[int]) -> float:
    """exp(mean −log q(next token)) over the S − 1 scored positions; logp is (S − 1, V)."""
    targets = torch.tensor(ids[1:], device=logp.device).unsqueeze(-1)  # (S − 1, 1)
    nll = -logp.double().gather(-1, targets).squeeze(-1)  # (S − 1,)
    return math.exp(float(nll.mean()))


def kl_per_position(ref: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """(S − 1,) KL(ref ‖ var) in nats from two (S − 1, V) log-probability tensors."""
    return (ref.exp() * (ref - var)).sum(-1)


def reference_log_probs(lm: LoadedModel, ids: list[int]) -> torch.Tensor:
    """(S − 1, V) float32's next-token log-probabilities: the loaded model itself when it is
    float32, otherwise its float32 copy (then "fp32" means the loaded weights widened, not the
    original file's)."""
    ref_model = lm.model if lm.spec.dtype == "float32" else apply_variant(lm, "fp32")[0]
    return scored_forward(ref_model, ids)[0]


def measure_quality(lm: LoadedModel, name: str, text: str | None = None,
                    reference: torch.Tensor | None = None) -> QualityResult:
    """Variant `name` against the loaded model's float32 weights on `text` (default: the
    Gettysburg Address). `reference`: `reference_log_probs` of the same text, when several
    variants are measured against one float32 forward."""
    start = time.perf_counter()
    ids = text_ids(lm, read_text() if text is None else text)
    ref = reference_log_probs(lm, ids) if reference is None else reference
    variant, report = apply_variant(lm, name)
    logp, ppl_transformers = scored_forward(variant, ids)
    del variant
    kl = kl_per_position(ref, logp)
    top1 = ref.argmax(-1) == logp.argmax(-1)
    return QualityResult(report, len(ids), perplexity(logp, ids), ppl_transformers,
                         perplexity(ref, ids), kl.double().cpu().numpy(), top1.cpu().numpy(),
                         time.perf_counter() - start)
