"""Variants of the loaded model with its weights in fewer bits, and their bytes, measured.

What each variant quantizes:
- the weight of each Linear inside the decoder layers (q_proj, k_proj, v_proj, o_proj,
  gate_proj, up_proj, down_proj) — 79% of SmolLM2-135M's parameters and all of the per-layer
  matrix work — in the variant's own format;
- the token embedding (tied to the LM head in the default model, so it is also the output
  projection every logit is read through): the variant's dtype in fp16 / bf16, and Q8_0 (8-bit,
  one float16 scale per 32) in every integer variant — what llama.cpp files do, this model's own
  included: its GGUF stores the embedding as Q8_0, so for the default model this step is lossless
  (engine/quant/gguf_grid.py measures that) and the quality columns show the layers' rounding
  alone, while the bytes a decode step streams fall with the LM head's too;
- the RMSNorm weights stay float32 (0.03% of the bytes).

How each stores a quantized Linear weight (out, in): `fp16` / `bf16` as that dtype; `int8` one
float16 scale per output row; `q8_0` and `q4_0` one float16 scale per 32 weights; `q4_1`, `q3`,
`q2` a float16 scale and a float16 minimum per 32 weights; codes packed (see `scheme`); q8_0,
q4_0 and q4_1 are GGML's formats bit for bit (`formats`, `ggml_blocks`). `q4_k`, `q6_k` and
`q4_k_m` store every tensor, the embedding included, as the GGML blocks llama.cpp would give it
(`kmix` picks the type, fallbacks included; `kquants` writes the blocks).
`round_variant` makes the copy by plain rounding; engine/quant/apply.py's `apply_variant` is the
entry for every variant name (an AWQ variant searches its scales first, engine/quant/awq.py).
The returned model holds the dequantized weights in float32, so the torch forward measures what
the rounding of the weights does, not the arithmetic of a low-precision kernel; the native decode
step (engine/kernels/native.py) reads the stored codes themselves.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from i18n import N_, _, using

from ..errors import InputError
from ..loader import LoadedModel
from . import VARIANT_NAMES
from .formats import QuantizedTensor, quantize
from .kmix import K_VARIANTS, RULES, tensor_types
from .kquants import BLOCKS, StoredBlocks, bits_per_weight, code_bits, store_blocks
from .scheme import FORMATS, QuantFormat
from .sites import decoder_linears, embedding_weights  # noqa: F401  (importers use variants')

FLOAT_VARIANTS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
REFERENCE_BYTES = 4  # the unquantized parts stay float32
AWQ_PREFIX = "awq_"  # awq_<format>: the format's rounding after an AWQ-style scale search
EMBEDDING_FORMAT = FORMATS["q8_0"]  # integer variants' token embedding / LM head
SCOPE = N_("the weight of every Linear in the decoder layers (q, k, v, o, gate, up, down); "
           "the token embedding / LM head in the variant's dtype (float variants) or Q8_0 "
           "(integer variants; llama.cpp's choice in the K-quant ones, Q8_0 for rows of 576); the "
           "RMSNorm weights stay float32")  # English in a record (WeightReport.scope); _(SCOPE) shown


@dataclass(frozen=True, slots=True, eq=False)
class StoredFloat:
    """A weight kept as a float tensor (the fp32 / fp16 / bf16 variants)."""

    values: torch.Tensor  # (out, in) in the variant's dtype

    @property
    def code_bytes(self) -> int:
        return self.values.nbytes

    @property
    def group_bytes(self) -> int:
        return 0

    @property
    def nbytes(self) -> int:
        return self.values.nbytes

    def dequantize(self) -> torch.Tensor:
        return self.values.float()  # (out, in); the same tensor when it is already float32


Stored = QuantizedTensor | StoredFloat | StoredBlocks


@dataclass(frozen=True, slots=True)
class WeightReport:
    """Bytes of a variant, measured from its stored tensors, beside the formula's value."""

    variant: str
    storage: str  # how a quantized weight is stored (scheme.describe, or the float dtype)
    quantized_params: int  # decoder Linear weights
    other_params: int  # the norms (and any other float32 parameter)
    code_bytes: int  # measured: the quantized weights' codes (or float values)
    group_bytes: int  # measured: their float16 scales and minimums
    other_bytes: int  # measured: the float32 norms of the copy
    code_bits: int  # bits per stored code (or float)
    formula_group_bytes: int  # Σ over the Linears of out · in / group · (2 or 4) bytes
    embedding_params: int = 0  # token embedding and LM head (each distinct tensor once)
    embedding_bytes: int = 0  # measured: as stored (codes + scales, or float values)
    embedding_storage: str = "float32"
    embedding_bits: float = 32.0  # stored bits per embedding weight by formula (Q8_0: 8.5)
    scope: str = SCOPE
    # Σ over the Linears of params × their type's code bits / 8 where the types differ (the
    # K-quant mixes; code_bits is then the widest); 0: quantized_params × code_bits / 8
    formula_code_bytes: int = 0

    @property
    def nbytes(self) -> int:
        return self.code_bytes + self.group_bytes + self.embedding_bytes + self.other_bytes

    @property
    def formula_embedding_bytes(self) -> int:
        return round(self.embedding_params * self.embedding_bits / 8)

    @property
    def formula_bytes(self) -> int:
        """quantized params × bits / 8 + scale overhead + embedding params × its bits / 8
        + other params × 4 (float32)."""
        codes = self.formula_code_bytes or self.quantized_params * self.code_bits // 8
        return (codes + self.formula_group_bytes + self.formula_embedding_bytes
                + self.other_params * REFERENCE_BYTES)

    @property
    def formula(self) -> str:
        """The sum `formula_bytes` adds, its terms named (in the session's language; a record
        keeps it in English: `to_dict`)."""
        if self.formula_code_bytes:
            form = _("{codes:,} (codes: each Linear's params × its type's bits / 8) + {scales:,} "
                     "(scales) + {embedding:,} × {embedding_bits:g} / 8 (embedding, "
                     "{embedding_storage}) + {other:,} × {other_bytes} (float32 norms)")
        else:
            form = _("{params:,} × {bits} / 8 + {scales:,} (scales) + {embedding:,} × "
                     "{embedding_bits:g} / 8 (embedding, {embedding_storage}) + {other:,} × "
                     "{other_bytes} (float32 norms)")
        return form.format(codes=self.formula_code_bytes, params=self.quantized_params,
                           bits=self.code_bits, scales=self.formula_group_bytes,
                           embedding=self.embedding_params, embedding_bits=self.embedding_bits,
                           embedding_storage=self.embedding_storage, other=self.other_params,
                           other_bytes=REFERENCE_BYTES)

    @property
    def quantized_bits_per_weight(self) -> float:
        """Measured bits per quantized weight, codes and scales: e.g. 4.5 for q4_0."""
        return (self.code_bytes + self.group_bytes) * 8 / self.quantized_params

    def to_dict(self) -> dict[str, Any]:
        with using("en"):  # a record's words are English, whichever language draws the page
            formula = self.formula
        return {"variant": self.variant, "storage": self.storage, "scope": self.scope,
                "quantized_params": self.quantized_params, "other_params": self.other_params,
                "code_bytes": self.code_bytes, "group_bytes": self.group_bytes,
                "other_bytes": self.other_bytes, "embedding_params": self.embedding_params,
                "embedding_bytes": self.embedding_bytes,
                "embedding_storage": self.embedding_storage, "bytes": self.nbytes,
                "formula_bytes": self.formula_bytes, "formula": formula,
                "formula_code_bytes": self.formula_code_bytes,
                "quantized_bits_per_weight": self.quantized_bits_per_weight}


def variant_format(name: str) -> QuantFormat | torch.dtype:
    """The QuantFormat (or float dtype) a variant stores its Linear weights in."""
    if name not in VARIANT_NAMES:
        raise InputError(_("unknown weights variant {name}: use one of {names}").format(
            name=repr(name), names=", ".join(VARIANT_NAMES)))
    if name in FLOAT_VARIANTS:
        return FLOAT_VARIANTS[name]
    if name in K_VARIANTS:
        raise InputError(f"{name} stores each tensor in its own GGML type (kmix.tensor_types)")
    return FORMATS[name.removeprefix(AWQ_PREFIX)]  # an AWQ variant stores its base format


def embedding_format(name: str) -> QuantFormat | torch.dtype:
    """How variant `name` stores the embedding / LM head: its dtype, or Q8_0 (integer variants)."""
    fmt = variant_format(name)
    return fmt if isinstance(fmt, torch.dtype) else EMBEDDING_FORMAT


def store_weight(weight: torch.Tensor, fmt: QuantFormat | torch.dtype) -> Stored:
    """`weight` (out, in) in the variant's stored form."""
    if isinstance(fmt, torch.dtype):
        return StoredFloat(weight.detach().to(fmt))
    try:
        return quantize(weight, fmt)
    except ValueError as err:
        raise InputError(_("cannot store this model's weights as {format}: {error}").format(
            format=fmt.name, error=err)) from err


def weight_store(model: Any, name: str) -> Callable[[torch.Tensor], Stored]:
    """How variant `name` stores a weight of `model`: in its one format, or (a K-quant variant)
    as the GGML blocks of the type llama.cpp gives that tensor (`kmix.tensor_types`)."""
    if name not in K_VARIANTS:
        fmt = variant_format(name)
        return lambda w: store_weight(w, fmt)
    names = {id(p): n for n, p in model.named_parameters()}
    types = tensor_types(name, model)
    return lambda w: store_blocks(w, types[names[id(w)]])


@torch.no_grad()
def quantize_linears(model: Any, name: str) -> dict[str, Stored]:
    """Module name → stored weight, for every decoder Linear (what a low-bit kernel would read)."""
    store = weight_store(model, name)
    return {n: store(m.weight) for n, m in decoder_linears(model)}


def formula_parts(stored: Stored, numel: int) -> tuple[int, int]:
    """(code bytes, scale bytes) of a stored weight of `numel` params by its format's formula."""
    if isinstance(stored, StoredBlocks):
        block, nbytes, codes = BLOCKS[stored.ggml_type]
        return numel * code_bits(stored.ggml_type) // 8, numel // block * (nbytes - codes)
    if isinstance(stored, QuantizedTensor):
        return numel * stored.fmt.bits // 8, stored.fmt.group_bytes(*stored.shape)
    return stored.nbytes, 0


def available_memory() -> int:
    """Bytes of memory the OS can still give this process."""
    try:
        import psutil
    except ImportError:  # psutil is in requirements.txt; this is for bare installs
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(psutil.virtual_memory().available)


def check_memory(lm: LoadedModel, name: str) -> None:
    """Refuse, before starting, a copy that would take more than half the free memory: the copy
    is float32 (4 bytes per parameter) whatever the variant."""
    need = lm.spec.param_count * REFERENCE_BYTES
    free = available_memory()
    if need > free / 2:
        raise InputError(_("a {variant} copy of {model} needs about {need:.1f} GB, more than "
                           "half of the {free:.1f} GB of free memory: not started").format(
            variant=name, model=lm.spec.name, need=need / 1e9, free=free / 1e9))


@torch.no_grad()
def round_variant(lm: LoadedModel, name: str) -> tuple[Any, WeightReport]:
    """A copy of the loaded model whose decoder Linear weights went through variant `name` by
    plain rounding (stored, then dequantized to float32), and the variant's bytes, measured and
    by formula. An AWQ name rounds to its base format with no scale search: engine/quant/apply.py
    `apply_variant` is the entry that runs AWQ's search first.

    The shared model is only read: every tensor of the copy is new (the memo of deepcopy maps
    each parameter to its replacement, so tied weights stay one tensor in the copy too).
    """
    mixed = name in K_VARIANTS
    fmt = None if mixed else variant_format(name)
    check_memory(lm, name)
    model = lm.model
    linears = decoder_linears(model)
    store = weight_store(model, name)
    embed_store = store if mixed else (lambda w: store_weight(w, embedding_format(name)))
    memo: dict[int, Any] = {}
    code_bytes = group_bytes = formula_codes = formula_groups = quantized = 0
    kinds: dict[str, int] = {}  # a mix's GGML types → how many Linears each
    for _n, module in linears:
        w = module.weight  # (out, in)
        stored = store(w)
        code_bytes += stored.code_bytes
        group_bytes += stored.group_bytes
        codes, groups = formula_parts(stored, w.numel())
        formula_codes += codes
        formula_groups += groups
        quantized += w.numel()
        if isinstance(stored, StoredBlocks):
            kinds[stored.ggml_type] = kinds.get(stored.ggml_type, 0) + 1
        memo[id(w)] = torch.nn.Parameter(stored.dequantize().clone(), requires_grad=False)
        del stored
    embedding_params = embedding_bytes = 0
    embed_types: list[str] = []
    for w in embedding_weights(model):
        stored = embed_store(w)
        embedding_params += w.numel()
        embedding_bytes += stored.nbytes
        if isinstance(stored, StoredBlocks):
            embed_types.append(stored.ggml_type)
        memo[id(w)] = torch.nn.Parameter(stored.dequantize().clone(), requires_grad=False)
        del stored
    other_params = other_bytes = 0
    for p in model.parameters():  # each shared (tied) parameter once
        if id(p) not in memo:
            memo[id(p)] = torch.nn.Parameter(p.detach().float().clone(), requires_grad=False)
            other_params += p.numel()
            other_bytes += memo[id(p)].nbytes
    for b in model.buffers():
        memo[id(b)] = b.float().clone() if b.is_floating_point() else b.clone()
    clone = copy.deepcopy(model, memo).eval()
    if mixed:
        report = WeightReport(name, _mix_storage(name, kinds), quantized, other_params, code_bytes,
                              group_bytes, other_bytes, max(code_bits(t) for t in kinds),
                              formula_groups, embedding_params, embedding_bytes,
                              "/".join(dict.fromkeys(embed_types)),
                              bits_per_weight(embed_types[0]) if len(set(embed_types)) == 1
                              else embedding_bytes * 8 / embedding_params,
                              formula_code_bytes=formula_codes)
        return clone, report
    bits = torch.finfo(fmt).bits if isinstance(fmt, torch.dtype) else fmt.bits
    storage = str(fmt).removeprefix("torch.") if isinstance(fmt, torch.dtype) else fmt.describe()
    embed_fmt = embedding_format(name)
    if isinstance(embed_fmt, torch.dtype):
        embed_storage, embed_bits = str(embed_fmt).removeprefix("torch."), float(bits)
    else:
        embed_storage, embed_bits = "Q8_0", embed_fmt.bits_per_weight()
    report = WeightReport(name, storage, quantized, other_params, code_bytes, group_bytes,
                          other_bytes, bits, formula_groups, embedding_params, embedding_bytes,
                          embed_storage, embed_bits)
    return clone, report


def _mix_storage(name: str, kinds: dict[str, int]) -> str:
    """A K-quant variant's storage line: "GGML types by llama.cpp's Q4_K_M rule (…): Q5_0 ×166, …"."""
    counts = ", ".join(f"{t} ×{n}" for t, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return f"GGML types by {RULES[name]} (fallbacks included): {counts}"
