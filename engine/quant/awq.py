"""AWQ-style activation-aware weight quantization (Lin et al. 2023): the same round-to-nearest
format as the plain variant, after a per-channel scale search on a small calibration text.

Why it helps: a weight's rounding error reaches the output multiplied by its input activation,
and a few input channels carry activations many times larger than the rest. Multiplying input
channel j of a Linear by s_j > 1 (and its activation by 1 / s_j, so the float function is the
same) shrinks that channel's weights' relative rounding error where it costs most; the group's
scale grows a little, which every other channel pays for. The search picks how much:
s = mean|x|^α, α on a grid of 20 points in [0, 1] (α = 0 is plain rounding), per group of
Linears that read the same input, minimizing the output MSE of the scaled, quantized Linears on
the calibration activations: Σ ‖(x / s) · deq(q(W · s))ᵀ − x · Wᵀ‖² over the group. mean|x|
is taken over every calibration token; the MSE over 128 of them, evenly spaced (the matrix
products of 20 candidate scales are most of the work; on this model's ~400-token text the
subset chose scales of the same quality as the whole, measured on the evaluation text).

Where each 1 / s goes (folded into the op that produces the input, exactly, so the float model
with scales folded computes the same logits; `fold_scales`):
- q / k / v read input_layernorm's output: its RMSNorm weight is divided by s;
- gate / up read post_attention_layernorm's output: its weight is divided by s;
- down reads act(gate) · up: up_proj's output rows are divided by s;
- o reads the attention output, channel h · head_dim + d of query head h, which is
  softmax · V of KV head h // (heads / kv_heads): dividing v_proj's row (k · head_dim + d) by t
  divides that channel of every query head sharing KV head k. With grouped-query attention the
  fold is exact only when s is the same across those query heads, so o's scale is searched in
  that tied form: mean|x| is averaged over the query heads of each KV head before the power.
  (A model whose attention does not have this layout keeps o_proj unscaled.)
After folding, every decoder Linear is rounded once with the base format by
`variants.round_variant` on the folded copy, so the copy holds deq(q(W · s)) and re-quantizing it
with the base format gives the same values back: what the native low-bit step reads.
The search uses the calibration text's activations of the float model; the evaluation text
(assets/texts/gettysburg.txt) is a different text. Weight clipping (AWQ's second step) is not
done. Deterministic: no sampling, a fixed grid, ties go to the smaller α.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from i18n import _

from ..errors import InputError
from ..loader import LoadedModel
from . import VARIANT_NAMES
from .formats import rounded as formats_rounded
from .scheme import AWQ_O_INCLUDED, AWQ_O_UNSCALED, AWQ_STORAGE, FORMATS, QuantFormat
from .texts import TEXTS_DIR, read_text, text_ids
from .variants import AWQ_PREFIX, WeightReport, check_memory, embedding_weights, round_variant

CALIBRATION_TEXT = TEXTS_DIR / "declaration.txt"  # the first two paragraphs (see its README)
ALPHAS = tuple(i / 19 for i in range(20))  # the grid of exponents; α = 0 is plain rounding
LOSS_TOKENS = 128  # calibration rows the output MSE is measured on (mean|x| uses them all)
MIN_MEAN = 1e-4  # floor on mean|x| so a silent channel does not get a zero scale
FOLD_TOLERANCE = 1e-4  # max |Δ logit| / max |logit| of the folded float copy vs the original

Progress = Callable[[float, str], None]
# model → {(base format, calibration text or None): search}; weak, so a dropped model goes
_SEARCHES: weakref.WeakKeyDictionary[Any, dict[tuple[str, str | None], AwqSearch]] = \
    weakref.WeakKeyDictionary()


@dataclass(frozen=True, slots=True, eq=False)
class GroupScale:
    """The scale of one group of Linears that read the same input."""

    name: str  # "qkv", "o", "gate_up", "down"
    scale: torch.Tensor  # (in,) multiplies the Linears' input columns; 1 / scale is folded
    alpha: float  # the chosen exponent: scale = mean|x|^α, normalized
    mse_plain: float  # output MSE at α = 0 (plain rounding) on the calibration activations
    mse_awq: float  # output MSE at the chosen α (≤ mse_plain: α = 0 is on the grid)


@dataclass(frozen=True, slots=True, eq=False)
class AwqSearch:
    """What the search found: per layer, the group scales by group name ("o" absent where
    o_proj is left unscaled)."""

    base: str  # the format the scaled weights are rounded to ("q4_0", "q3")
    calibration_tokens: int
    layers: tuple[dict[str, GroupScale], ...]


def base_format(name: str) -> str:
    """'awq_q3' → 'q3', refusing in one line a name that is not an AWQ variant."""
    base = name.removeprefix(AWQ_PREFIX)
    if name not in VARIANT_NAMES or not name.startswith(AWQ_PREFIX) or base not in FORMATS:
        awq = ", ".join(n for n in VARIANT_NAMES if n.startswith(AWQ_PREFIX))
        raise InputError(_("unknown AWQ variant {name}: use one of {names}").format(
            name=repr(name), names=awq))
    return base


def _parts(layer: Any) -> dict[str, Any]:
    """The modules a Llama-style decoder layer folds through, or a one-line refusal."""
    try:
        attn, mlp = layer.self_attn, layer.mlp
        parts = {"norm1": layer.input_layernorm, "norm2": layer.post_attention_layernorm,
                 "q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj, "o": attn.o_proj,
                 "gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj}
    except AttributeError as err:
        raise InputError(_("AWQ here needs Llama-style decoder layers (input_layernorm, q/k/v/o, "
                           "gate/up/down): this model's differ")) from err
    for key in ("norm1", "norm2"):
        if getattr(parts[key], "bias", None) is not None or not hasattr(parts[key], "weight"):
            raise InputError(_("AWQ here folds scales into RMSNorm weights: this model's norms "
                               "have a bias or no weight"))
    return parts


def _heads(model: Any) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) from the config."""
    cfg = model.config
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return heads, kv, head_dim


def _o_tied(parts: dict[str, Any], heads: int, kv: int, head_dim: int) -> bool:
    """Whether o_proj's input is heads × head_dim channels fed by v_proj's kv × head_dim rows."""
    return (parts["o"].in_features == heads * head_dim and parts["v"].out_features == kv * head_dim
            and heads % kv == 0)


def working_copy(model: Any) -> Any:
    """A float32 copy to fold scales into: every parameter new, except float32 embeddings,
    which no fold touches and are shared read-only (the copy is never returned)."""
    embeds = {id(w) for w in embedding_weights(model)}
    memo: dict[int, Any] = {}
    for p in model.parameters():
        if id(p) in embeds and p.dtype == torch.float32:
            memo[id(p)] = p
        else:
            memo[id(p)] = torch.nn.Parameter(p.detach().float().clone(), requires_grad=False)
    for b in model.buffers():
        memo[id(b)] = b.float().clone() if b.is_floating_point() else b.clone()
    return copy.deepcopy(model, memo).eval()


@torch.no_grad()
def calibration_inputs(model: Any, ids: list[int]) -> tuple[list[dict[str, torch.Tensor]],
                                                            torch.Tensor]:
    """Per layer, the input (tokens, in) of q_proj, o_proj, gate_proj and down_proj on `ids`,
    and the (tokens, V) logits, from one forward with hooks on `model` (removed after)."""
    layers = model.get_decoder().layers
    found: list[dict[str, torch.Tensor]] = [{} for _layer in layers]
    handles = []

    def keep(i: int, key: str) -> Callable[..., None]:
        def hook(_module: Any, args: tuple[torch.Tensor, ...]) -> None:
            found[i][key] = args[0][0].detach().float().clone()  # (tokens, in)
        return hook

    try:
        for i, layer in enumerate(layers):
            parts = _parts(layer)
            for key, linear in (("qkv", "q"), ("o", "o"), ("gate_up", "gate"), ("down", "down")):
                handles.append(parts[linear].register_forward_pre_hook(keep(i, key)))
        device = next(model.parameters()).device
        logits = model(input_ids=torch.tensor([ids], device=device)).logits[0].float()  # (S, V)
    finally:
        for h in handles:
            h.remove()
    return found, logits


def rounded(weight: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """deq(q(weight)) (out, in) without packing codes: the search evaluates 20 scales per
    group, and packing is most of `quantize`'s time. `formats.rounded`: the same rule as
    `formats.quantize` then `dequantize`, which a test checks value for value; the kept weights
    are rounded by `quantize` itself."""
    return formats_rounded(weight, fmt)


def _output_mse(x: torch.Tensor, weight: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor,
                fmt: QuantFormat) -> float:
    """‖(x / s) · deq(q(W · s))ᵀ − x · Wᵀ‖² / its size; W is the group's Linears stacked by rows
    (rounding groups lie along rows, so stacking changes no rounding)."""
    out = (x / scale) @ rounded(weight * scale, fmt).T  # (tokens, out)
    return float(((out - ref) ** 2).mean())


def search_group(name: str, x: torch.Tensor, weights: list[torch.Tensor], fmt: QuantFormat,
                 mean_abs: torch.Tensor | None = None) -> GroupScale:
    """The α of ALPHAS whose scale mean|x|^α gives the least output MSE; `mean_abs` (in,) may be
    given already tied (o_proj under grouped-query attention), else it is mean|x| over tokens."""
    a = (x.abs().mean(0) if mean_abs is None else mean_abs).clamp(min=MIN_MEAN)  # (in,)
    weight = torch.cat(weights)  # (Σ out, in)
    if x.shape[0] > LOSS_TOKENS:  # evenly spaced rows, first and last included: 3× less work
        x = x[torch.linspace(0, x.shape[0] - 1, LOSS_TOKENS).round().long()]
    ref = x @ weight.T  # (tokens, Σ out): the float outputs
    best: tuple[float, float, torch.Tensor] | None = None
    plain = 0.0
    for alpha in ALPHAS:
        s = a ** alpha
        s = s / (s.max() * s.min()).sqrt()  # centred on 1 in log scale, as AWQ does
        mse = _output_mse(x, weight, ref, s, fmt)
        if alpha == 0.0:
            plain = mse
        if best is None or mse < best[0]:
            best = (mse, alpha, s)
    assert best is not None
    return GroupScale(name, best[2], best[1], plain, best[0])


@torch.no_grad()
def search_scales(model: Any, ids: list[int], base: str,
                  progress: Progress | None = None) -> tuple[AwqSearch, torch.Tensor]:
    """Every layer's group scales for `base`, on `model`'s activations over `ids` (`model` is
    only read), and the logits of that forward (the reference the fold check compares with)."""
    fmt = FORMATS[base]
    heads, kv, head_dim = _heads(model)
    inputs, logits = calibration_inputs(model, ids)
    layers = model.get_decoder().layers
    found: list[dict[str, GroupScale]] = []
    for i, layer in enumerate(layers):
        parts = _parts(layer)
        x = inputs[i]
        w = {k: parts[k].weight.detach().float() for k in ("q", "k", "v", "o", "gate", "up",
                                                            "down")}
        groups = {"qkv": search_group("qkv", x["qkv"], [w["q"], w["k"], w["v"]], fmt),
                  "gate_up": search_group("gate_up", x["gate_up"], [w["gate"], w["up"]], fmt),
                  "down": search_group("down", x["down"], [w["down"]], fmt)}
        if _o_tied(parts, heads, kv, head_dim):
            a = x["o"].abs().mean(0).reshape(kv, heads // kv, head_dim)  # (kv, per kv, hd)
            tied = a.mean(1, keepdim=True).expand_as(a).reshape(-1)  # (heads · hd,)
            groups["o"] = search_group("o", x["o"], [w["o"]], fmt, tied)
        found.append(groups)
        inputs[i] = {}  # free this layer's activations
        if progress is not None:
            progress((i + 1) / len(layers), _("AWQ scale search: layer {layer} of {layers}").format(
                layer=i + 1, layers=len(layers)))
    return AwqSearch(base, len(ids), tuple(found)), logits


@torch.no_grad()
def fold_scales(model: Any, search: AwqSearch) -> None:
    """Multiply each group's Linear input columns by its scale and divide the op before by it,
    in place on `model` (a copy): the float function stays the same (see the module docstring)."""
    heads, kv, head_dim = _heads(model)
    for layer, groups in zip(model.get_decoder().layers, search.layers):
        parts = _parts(layer)
        for gname, norm, linears in (("qkv", "norm1", ("q", "k", "v")),
                                     ("gate_up", "norm2", ("gate", "up"))):
            s = groups[gname].scale
            parts[norm].weight.div_(s)
            for key in linears:
                parts[key].weight.mul_(s)  # (out, in) · (in,): columns
        s = groups["down"].scale  # (intermediate,)
        _scale_rows(parts["up"], 1 / s)
        parts["down"].weight.mul_(s)
        if "o" in groups:
            s = groups["o"].scale  # (heads · hd,), the same across a KV head's query heads
            t = s.reshape(kv, heads // kv, head_dim)[:, 0].reshape(-1)  # (kv · hd,)
            _scale_rows(parts["v"], 1 / t)
            parts["o"].weight.mul_(s)


def _scale_rows(linear: torch.nn.Linear, factor: torch.Tensor) -> None:
    """Scale a Linear's output channels (weight rows and bias) by factor (out,)."""
    linear.weight.mul_(factor.unsqueeze(-1))
    if linear.bias is not None:
        linear.bias.mul_(factor)


def folded_model(lm: LoadedModel, name: str, progress: Progress | None = None,
                 text: str | None = None) -> tuple[Any, AwqSearch]:
    """A float32 copy of the loaded model with the searched scales folded in, not yet rounded:
    the same function as the original (checked on the calibration text the first time, refused
    in one line otherwise), and the search. The shared model is only read. The search is kept
    per model, format and text (`cached_search`), so a second copy costs a copy and a fold."""
    base = base_format(name)
    check_memory(lm, name)
    work = working_copy(lm.model)
    search = cached_search(lm, name, text)
    if search is not None:
        fold_scales(work, search)
        return work, search
    ids = text_ids(lm, read_text(CALIBRATION_TEXT) if text is None else text)
    search, reference = search_scales(work, ids, base, progress)
    fold_scales(work, search)
    with torch.no_grad():
        device = next(work.parameters()).device
        logits = work(input_ids=torch.tensor([ids], device=device)).logits[0].float()  # (S, V)
    drift = float((logits - reference).abs().max() / reference.abs().max().clamp(min=1e-30))
    if drift > FOLD_TOLERANCE:
        raise InputError(_("folding AWQ's scales changed this model's logits (relative "
                           "{drift:.1e}): its layers are not Llama-style, not applied").format(
            drift=drift))
    _SEARCHES.setdefault(lm.model, {})[(base, text)] = search
    return work, search


def cached_search(lm: LoadedModel, name: str, text: str | None = None) -> AwqSearch | None:
    """The search already done for this model, variant and calibration text (None: the
    default text), or None: what a page shows (α and MSE per group) without searching again."""
    return _SEARCHES.get(lm.model, {}).get((base_format(name), text))


def apply_awq(lm: LoadedModel, name: str,
              progress: Progress | None = None) -> tuple[Any, WeightReport]:
    """A float32 copy whose decoder Linears hold deq(q(W · s)) in the base format with AWQ's
    searched scales (1 / s folded into the norms, up_proj and v_proj), the embedding as Q8_0,
    and its bytes measured from the stored tensors (the changed norm weights are float32
    "other" parameters, as in every variant). Peak memory: the folded float copy and the
    returned copy, about twice what `check_memory` sizes (it refuses above half the free
    memory, so both fit)."""
    base = base_format(name)
    work, search = folded_model(lm, name, progress)
    if progress is not None:
        progress(1.0, _("rounding the scaled weights to {format}").format(format=base))
    model, report = round_variant(dataclasses.replace(lm, model=work), base)
    del work
    tied = AWQ_O_INCLUDED if all("o" in g for g in search.layers) else AWQ_O_UNSCALED
    storage = AWQ_STORAGE.format(storage=report.storage, tokens=search.calibration_tokens,
                                 tied=tied)  # English: a record's (scheme.shown_storage shows it)
    return model, dataclasses.replace(report, variant=name, storage=storage)
