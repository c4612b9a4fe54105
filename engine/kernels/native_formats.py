"""The weight formats the native decode step reads, one per matrix.

Why per matrix: a GGUF file chooses a type per tensor — llama.cpp's Q4_K_M stores most matrices
as Q4_K, some layers' attn_v and ffn_down as Q6_K, and a matrix whose rows are not a multiple of
256 weights (all of SmolLM2-135M's 576-column ones) as Q5_0 or Q8_0 instead — so the step takes
a format for every (layer, matrix), `MatrixFormats`.

A matrix's format (`MatrixFormat`) is one of:
- None: float32;
- a `QuantFormat` (int8 per row, Q8_0, Q4_0, Q4_1): the step's own group records, BLOCK rows
  interleaved (native_groups.h) — its fastest kernels; GGML blocks of Q8_0 / Q4_0 / Q4_1 are
  re-laid into them (`GGML_RECORDS`);
- a GGML type name of `GGML_ROWS` (F16, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): GGML's own blocks, stored
  as they are, row after row (native_ggml.h) — except Q5_0, Q4_K and Q6_K (`RELAID`), re-laid
  into group records with the same values, so they run on the group kernels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from ..errors import EngineError
from ..quant.scheme import FORMATS, QuantFormat

MatrixFormat = QuantFormat | str | None
MatrixKey = tuple[int | None, str]  # (layer, one of MATRICES) or (None, "lm_head")
MatrixFormats = dict[MatrixKey, MatrixFormat]

BLOCK = 32  # rows per packed block, compiled into the C step as -DBLOCK
MATRICES = ("q", "k", "v", "o", "gate", "up", "down")  # a layer's matrices, in buffer order

# The C step's format enum (native_decode.c), by name.
FORMAT_CODES = {"F32": 0, "Q8": 1, "Q4_0": 2, "Q4_1": 3, "F16": 4, "Q5_0": 5, "Q5_1": 6,
                "Q4_K": 7, "Q5_K": 8, "Q6_K": 9}


@dataclass(frozen=True, slots=True)
class GgmlType:
    """A GGML block type the step reads as stored: `weights` per block in `nbytes` bytes."""

    name: str
    weights: int
    nbytes: int


GGML_ROWS: dict[str, GgmlType] = {t.name: t for t in (
    GgmlType("F16", 1, 2), GgmlType("Q5_0", 32, 22), GgmlType("Q5_1", 32, 24),
    GgmlType("Q4_K", 256, 144), GgmlType("Q5_K", 256, 176), GgmlType("Q6_K", 256, 210))}
# GGML row types the step re-lays into group records of its own (native_records.py), so they run
# on the fast group kernels: type → (weights per group, record bytes for BLOCK rows). Q5_0:
# nibbles, high-bit words, float16 d; Q4_K: nibbles, float32 d·sc and dmin·mn; Q6_K: int8 codes,
# float32 d·sc (the products GGML dequantizes with, so the values are GGML's own).
RELAID: dict[str, tuple[int, int]] = {"Q5_0": (32, 16 * BLOCK + 4 * 32 + 2 * BLOCK),
                                      "Q4_K": (32, 16 * BLOCK + 8 * BLOCK),
                                      "Q6_K": (16, 16 * BLOCK + 4 * BLOCK)}
# GGML types the step re-lays into its own layouts (the same values: scales and codes moved).
GGML_RECORDS: dict[str, QuantFormat | None] = {
    "F32": None, "Q8_0": FORMATS["q8_0"], "Q4_0": FORMATS["q4_0"], "Q4_1": FORMATS["q4_1"]}
GGML_TYPES = (*GGML_RECORDS, *GGML_ROWS)


def native_format(type_name: str) -> MatrixFormat:
    """The format the step stores a GGML type in ("Q8_0" → FORMATS["q8_0"], "Q4_K" → "Q4_K")."""
    if type_name in GGML_RECORDS:
        return GGML_RECORDS[type_name]
    if type_name in GGML_ROWS:
        return type_name
    raise EngineError(f"the native step has no kernel for GGML type {type_name} "
                      f"(it reads {', '.join(GGML_TYPES)})")


def format_code(fmt: MatrixFormat) -> int:
    """The C step's format enum for a matrix format."""
    if fmt is None:
        return FORMAT_CODES["F32"]
    if isinstance(fmt, str):
        native_format(fmt)
        return FORMAT_CODES[fmt]
    if fmt.bits == 8 and not fmt.zero_point:
        return FORMAT_CODES["Q8"]
    if fmt.bits == 4:
        return FORMAT_CODES["Q4_1" if fmt.zero_point else "Q4_0"]
    raise EngineError(f"the native step has no kernel for {fmt.name} ({fmt.describe()})")


def format_group(fmt: MatrixFormat) -> int:
    """The group the C step reads for a group format (0: one group per row, or no groups)."""
    return (fmt.group or 0) if isinstance(fmt, QuantFormat) else 0


def format_name(fmt: MatrixFormat) -> str:
    return "fp32" if fmt is None else fmt if isinstance(fmt, str) else fmt.name


def check_columns(fmt: MatrixFormat, k: int) -> str | None:
    """Why a matrix of k columns cannot be stored in `fmt`: one line, or None."""
    if isinstance(fmt, str):
        per = GGML_ROWS[fmt].weights
    elif fmt is not None and fmt.group:
        per = fmt.group
    else:
        return None
    return None if k % per == 0 else f"{format_name(fmt)} needs rows of a multiple of {per} weights, not {k}"


def uniform_formats(layers: int, layer_fmt: MatrixFormat,
                    head_fmt: MatrixFormat) -> MatrixFormats:
    """One format for every layer's matrices and one for the LM head (the integer variants)."""
    formats: MatrixFormats = {(layer, m): layer_fmt for layer in range(layers) for m in MATRICES}
    formats[(None, "lm_head")] = head_fmt
    return formats


_HF = re.compile(r"model\.layers\.(\d+)\.(?:self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\.weight")
_GGUF = re.compile(r"blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)"
                   r"\.weight")
_GGUF_MATRIX = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
                "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down"}
HEAD_NAMES = ("lm_head.weight", "output.weight")
_EMBEDDINGS = ("model.embed_tokens.weight", "token_embd.weight")  # the LM head when tied


def matrix_key(name: str) -> MatrixKey | None:
    """(layer, matrix) of a weight named as in transformers ("model.layers.3.self_attn.v_proj
    .weight") or in a GGUF file ("blk.3.attn_v.weight"); (None, "lm_head") for the LM head
    (or the embedding, which a tied model's LM head is); None for any other tensor."""
    if match := _HF.fullmatch(name):
        return int(match[1]), match[2]
    if match := _GGUF.fullmatch(name):
        return int(match[1]), _GGUF_MATRIX[match[2]]
    if name in HEAD_NAMES or name in _EMBEDDINGS:
        return None, "lm_head"
    return None


def formats_from_types(types: Mapping[str, str], layers: int) -> MatrixFormats:
    """Per-matrix formats from GGML type names per weight name (transformers' or GGUF's names,
    as `matrix_key` reads them); an explicit LM head wins over the embedding it is tied to.
    Every layer's seven matrices and the LM head must be named."""
    formats: MatrixFormats = {}
    for name, type_name in sorted(types.items(), key=lambda item: item[0] in HEAD_NAMES):
        key = matrix_key(name)
        if key is not None:
            formats[key] = native_format(type_name)
    missing = [f"{m} of layer {layer}" for layer in range(layers) for m in MATRICES
               if (layer, m) not in formats]
    missing += [] if (None, "lm_head") in formats else ["the LM head"]
    if missing:
        raise EngineError(f"no weight type for {', '.join(missing[:3])}"
                          f"{' and more' if len(missing) > 3 else ''}")
    return formats
