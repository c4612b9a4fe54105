"""Where quantization error enters: each variant's drift from float32, layer by layer.

The quality table says how far a variant's output distribution is from float32's; this says at
which layer the two models part. Both read the same tokens; at every layer l (0 = the embedding
output, l = the residual stream after decoder layer l) and every position:
- cosine similarity of the two residual streams (1: same direction);
- KL(fp32 ‖ variant) of their logit lens, softmax(LM head(final norm(h_l))), in nats — what the
  model would predict had it stopped after layer l (engine/lens/logit_lens.py reads a trace's
  recorded states the same way).
Both are averaged over positions. The residual streams are read with forward hooks on the
embedding and each decoder layer, not from transformers' `hidden_states`, whose last entry has
the final norm applied already. At the last layer the lens is the model's own head, so its KL is
the quality table's KL (engine/quant/quality.py) on the same text: the tests check both that and
that float32 against itself gives cosine 1 and KL 0 at every layer.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from i18n import N_, _, using

from ..errors import EngineError
from ..loader import LoadedModel
from .apply import apply_variant, refuse_mapped

Say = Callable[[str, float], None]  # (what is happening, share done)
_LENS_ROWS = 256  # positions put through the LM head at once: (rows, vocabulary) float32 each
DRIFT_MAPPED = N_("The drift compares each quantized copy with the float32 weights; a model opened "
                  "from a GGUF file runs on its stored blocks and holds no float32 weights to "
                  "copy: load the default model to measure it.")


@dataclass(frozen=True, slots=True, eq=False)
class LayerDrift:
    """One variant's drift from float32 at each layer, 0 (embeddings) … L (after the last)."""

    variant: str
    cosine: np.ndarray  # (L + 1,) mean over positions of cos(h_fp32, h_variant)
    kl: np.ndarray  # (L + 1,) mean over positions of KL(lens_fp32 ‖ lens_variant), nats

    @property
    def fastest(self) -> tuple[int, float]:
        """(layer l, KL(l) − KL(l − 1)): where the lens KL grows the most in one layer."""
        steps = np.diff(self.kl)  # (L,): step i is layer i + 1's growth
        i = int(np.argmax(steps))
        return i + 1, float(steps[i])

    def to_dict(self) -> dict[str, Any]:
        layer, growth = self.fastest
        return {"variant": self.variant, "cosine": self.cosine.tolist(), "kl": self.kl.tolist(),
                "fastest_layer": layer, "fastest_growth": growth}


@dataclass(frozen=True, slots=True, eq=False)
class DriftStudy:
    """Per-layer drift of some variants on one token sequence."""

    model: str
    source: str  # what was read: "your prompt", "the Gettysburg Address"
    tokens: int  # positions averaged over
    variants: tuple[LayerDrift, ...]
    seconds: float

    @property
    def layers(self) -> int:
        return len(self.variants[0].kl) - 1 if self.variants else 0

    def notice(self) -> str:
        """The "what to notice" line: where the most drifting variant's lens KL grows fastest."""
        worst = max(self.variants, key=lambda d: d.kl[-1])
        layer, growth = worst.fastest
        last = self.layers
        return _("{variant} drifts most: its logit lens moves furthest from float32's at layer "
                 "{layer} (KL +{growth:.3g} nats, from {before:.3g} to {after:.3g}); after layer "
                 "{last} its KL is {final:.3g} nats and its residual stream's cosine to float32's "
                 "{cosine:.4f}.").format(
            variant=worst.variant, layer=layer, growth=growth, before=worst.kl[layer - 1],
            after=worst.kl[layer], last=last, final=worst.kl[-1], cosine=worst.cosine[-1])


@torch.inference_mode()
def residual_streams(model: Any, ids: Sequence[int]) -> torch.Tensor:
    """(L + 1, S, H) float32: the embedding output and each decoder layer's output, read by
    forward hooks during one forward of `ids`."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    embed = getattr(inner, "embed_tokens", None)
    if layers is None or embed is None:
        raise EngineError(_("this model has no decoder layers and embedding to read the "
                            "residual stream from"))
    seen: list[torch.Tensor] = []

    def keep(_module: Any, _args: Any, output: Any) -> None:
        out = output[0] if isinstance(output, tuple) else output
        seen.append(out[0].detach().float())  # (S, H) of the batch's only row

    hooks = [embed.register_forward_hook(keep)]
    hooks += [layer.register_forward_hook(keep) for layer in layers]
    try:
        device = next(model.parameters()).device
        model(input_ids=torch.tensor([list(ids)], device=device), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    if len(seen) != len(layers) + 1:
        raise EngineError(_("the forward did not pass every decoder layer once"))
    return torch.stack(seen)  # (L + 1, S, H)


@torch.inference_mode()
def lens_log_probs(model: Any, h: torch.Tensor) -> torch.Tensor:
    """(S, V) float32 log-softmax(LM head(final norm(h))) for one layer's (S, H) states."""
    head = model.lm_head
    w = head.weight
    x = model.model.norm(h.to(w.device, w.dtype))  # (S, H)
    return torch.log_softmax(head(x).float(), dim=-1)  # (S, V)


@torch.inference_mode()
def compare_streams(ref_model: Any, ref: torch.Tensor, model: Any, var: torch.Tensor
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(L + 1,) mean cosine and (L + 1,) mean lens KL between two (L + 1, S, H) streams."""
    cosine = torch.nn.functional.cosine_similarity(ref.double(), var.double(), dim=-1)  # (L+1, S)
    kl = torch.zeros(ref.shape[0], dtype=torch.float64)
    for layer in range(ref.shape[0]):
        total = 0.0
        for start in range(0, ref.shape[1], _LENS_ROWS):
            p = lens_log_probs(ref_model, ref[layer, start:start + _LENS_ROWS])  # (rows, V)
            q = lens_log_probs(model, var[layer, start:start + _LENS_ROWS])
            total += float((p.exp() * (p - q)).sum(-1).double().sum())
        kl[layer] = total / ref.shape[1]
    return cosine.mean(-1).numpy(), kl.numpy()


def measure_drift(lm: LoadedModel, names: Sequence[str], ids: Sequence[int], source: str,
                  say: Say | None = None, stop: Callable[[], bool] | None = None,
                  scored: slice = slice(None)) -> DriftStudy:
    """Variants `names` against the loaded model's float32 weights on token ids `ids`, layer by
    layer, averaged over the positions `scored` (all; the quality table scores a text's
    positions that have a next token, `slice(0, -1)`). The reference is the loaded model when
    it is float32, otherwise its float32 copy. `stop()` true: the variants measured so far.
    A model on a GGUF file's blocks is refused (`DRIFT_MAPPED`)."""
    refuse_mapped(lm, DRIFT_MAPPED)
    start = time.perf_counter()
    say = say or (lambda text, done: None)
    ref_model = lm.model if lm.spec.dtype == "float32" else apply_variant(lm, "fp32")[0]
    say(_("Reading float32's residual stream at every layer…"), 0.0)
    ref = residual_streams(ref_model, ids)[:, scored]  # (L + 1, S', H)
    found: list[LayerDrift] = []
    for i, name in enumerate(names):
        if stop is not None and stop():
            break
        say(_("{variant}: quantizing, then reading its residual stream…").format(variant=name),
            i / max(len(names), 1))
        model = ref_model if name == "fp32" else apply_variant(lm, name)[0]
        var = residual_streams(model, ids)[:, scored]  # (L + 1, S', H)
        cosine, kl = compare_streams(ref_model, ref, model, var)
        found.append(LayerDrift(name, cosine, kl))
        del model
    if not found:
        raise EngineError(_("stopped before the first variant was measured"))
    return DriftStudy(lm.spec.name, source, int(ref.shape[1]), tuple(found),
                      time.perf_counter() - start)


def drift_to_dict(study: DriftStudy) -> dict[str, Any]:
    with using("en"):  # a record keeps the English line; the page shows study.notice() translated
        english_notice = study.notice()
    return {"model": study.model, "source": study.source, "tokens": study.tokens,
            "seconds": round(study.seconds, 3), "layers": list(range(study.layers + 1)),
            "variants": [d.to_dict() for d in study.variants], "notice": english_notice}


def drift_from_dict(data: Any, max_layers: int = 1024, max_variants: int = 32) -> DriftStudy:
    """A study from its plain-JSON form (a trace file's experiments), every number checked."""
    if not isinstance(data, dict):
        raise ValueError("the per-layer drift is not an object")
    variants = data.get("variants")
    if not isinstance(variants, list) or not 0 < len(variants) <= max_variants:
        raise ValueError("the per-layer drift has no variants, or too many")
    found = []
    for v in variants:
        if not isinstance(v, dict) or not isinstance(v.get("variant"), str):
            raise ValueError("a per-layer drift entry has no variant name")
        arrays = []
        for key in ("cosine", "kl"):
            values = v.get(key)
            if (not isinstance(values, list) or not 1 < len(values) <= max_layers + 1
                    or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in values)):
                raise ValueError(f"the per-layer drift's {key} is not a list of numbers")
            arrays.append(np.asarray(values, dtype=np.float64))
        if len(arrays[0]) != len(arrays[1]):
            raise ValueError("the per-layer drift's cosine and KL differ in length")
        found.append(LayerDrift(v["variant"][:64], arrays[0], arrays[1]))
    if len({len(d.kl) for d in found}) != 1:
        raise ValueError("the per-layer drift's variants differ in layer count")
    tokens, seconds = data.get("tokens"), data.get("seconds")
    if not isinstance(tokens, int) or tokens < 1 or not isinstance(seconds, (int, float)):
        raise ValueError("the per-layer drift's token count or time is missing")
    return DriftStudy(str(data.get("model", ""))[:200], str(data.get("source", ""))[:200],
                      tokens, tuple(found), float(seconds))
