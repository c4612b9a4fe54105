"""The native decode step's packed weights: one layout, described once, for every weight format.

`layout()` lists the parts in buffer order with their byte offsets, stored shapes and formats;
`pack_weights()` (from a torch model) and `pack_blocks()` (from GGML block bytes, as a GGUF file
stores them) fill a buffer at those offsets; engine/kernels/native_decode.c reads them by the
same offsets and formats. Per layer: in_norm | q | k | v | o | post_norm | gate | up | down; then
final_norm | lm_head. Every matrix has its own format (engine/kernels/native_formats.py), so a
GGUF file's mix of types (Q4_K_M: Q4_K, Q6_K, Q5_0, Q8_0 in one layer) packs as it is; q, k and
v are separate parts rather than one fused matrix because such files give them different types
(the C step still runs them as one gemv). Norms are float32 (H,). A matrix (N, K) is stored in
B-row blocks (B = BLOCK, N padded with zero rows to a multiple of B).

Inside a block, by format:
- float32: (K, B) floats, k-major — the block is one sequential stream and x[k] is broadcast;
- group records (int8 per row, Q8_0, Q4_0, Q4_1; see engine/quant/scheme.py): per group of G
  consecutive k (G = the format's group, or K for one group per row) a record of bytes
  [codes][B float16 scales][B float16 minimums, zero-point formats only]; codes are (G, B) int8
  (8-bit, value d·c) or (G/2, B) bytes with k even in the low nibble and k odd in the high one
  (4-bit: Q4_0 value d·(c − 8), Q4_1 value d·c + m). The codes and scales are exactly those of
  engine.quant.formats.quantize — for Q8_0, Q4_0 and Q4_1 GGML's own blocks' (ggml_blocks),
  re-laid 32 rows at a time — so the weights the step multiplies by are the variant's
  dequantized weights, bit for bit;
- GGML's Q5_0, Q4_K and Q6_K: group records too, re-laid at pack time (native_records.py) with
  GGML's values: Q5_0 per 32 k [nibbles][32 uint32 words of bit 4, bit j = row j][B float16 d]
  (value d·(c − 16)); Q4_K per 32 k [nibbles][B float32 d·sc][B float32 dmin·mn] (value
  s·c − m); Q6_K per 16 k [(16, B) int8 c − 32][B float32 d·sc];
- GGML rows (F16, Q5_1, Q5_K): (B, row bytes), B rows of GGML's blocks byte for byte as stored
  (layouts in native_ggml.h); padding rows are zero bytes (scale 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch

from ..errors import EngineError
from ..quant.formats import quantize
from ..quant.scheme import FORMATS, QuantFormat
from ..settings import weights_name
from .microbench import huge_page_buffer
from .native_formats import (
    BLOCK,
    GGML_ROWS,
    HEAD_NAMES,
    MATRICES,
    RELAID,
    MatrixFormat,
    MatrixFormats,
    check_columns,
    format_name,
    formats_from_types,
    matrix_key,
    native_format,
    uniform_formats,
)
from .native_records import GgmlBlocks, _blocks, ggml_stored, quant_blocks

ALIGN = 64  # bytes: every part starts on a cache line
MAX_GROUPS = 4096  # groups per row the C step sums x over (its MAX_GROUPS)
LAYER_PARTS = ("in_norm", "q", "k", "v", "o", "post_norm", "gate", "up", "down")  # the C enum
FINAL_PARTS = ("final_norm", "lm_head")
NORMS = ("in_norm", "post_norm", "final_norm")

# Variant → (format of the decoder Linears, format of the LM head); None = float32. The LM head
# of an integer variant is Q8_0, as engine.quant.variants stores the embedding.
NATIVE_WEIGHTS: dict[str, tuple[QuantFormat | None, QuantFormat | None]] = {
    "fp32": (None, None),
    "int8": (FORMATS["int8"], FORMATS["q8_0"]),
    "q8_0": (FORMATS["q8_0"], FORMATS["q8_0"]),
    "q4_0": (FORMATS["q4_0"], FORMATS["q8_0"]),
    "q4_1": (FORMATS["q4_1"], FORMATS["q8_0"]),
}


def base_variant(weights: str) -> str:
    """The format a variant name runs as natively: "awq_q4_0" → "q4_0", "int4" → "q4_0"."""
    name = weights_name(weights)
    return name.removeprefix("awq_")


@dataclass(frozen=True, slots=True)
class Part:
    """One tensor of the packed weights: where it starts (bytes) and how it is stored."""

    name: str  # one of LAYER_PARTS or FINAL_PARTS
    layer: int | None  # None: after the layers
    offset: int  # bytes before it in the packed buffer
    shape: tuple[int, ...]
    dtype: torch.dtype  # float32, or uint8 for quantized records and GGML rows
    fmt: MatrixFormat = None  # a matrix's format; None for float32 and for the norms

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def key(self) -> tuple[int | None, str]:
        return self.layer, self.name


def matrix_shape(n: int, k: int, fmt: MatrixFormat) -> tuple[tuple[int, ...], torch.dtype]:
    """Stored shape of an (n, k) matrix: (blocks, k, B) float32, (blocks, groups, record bytes)
    uint8 for a group format, or (blocks, B, row bytes) uint8 for GGML rows."""
    blocks = -(-n // BLOCK)
    if fmt is None:
        return (blocks, k, BLOCK), torch.float32
    if isinstance(fmt, str) and fmt in RELAID:
        group, record = RELAID[fmt]
        return (blocks, k // group, record), torch.uint8
    if isinstance(fmt, str):
        kind = GGML_ROWS[fmt]
        return (blocks, BLOCK, k // kind.weights * kind.nbytes), torch.uint8
    g = fmt.group_for(k)
    record = g * fmt.bits // 8 * BLOCK + fmt.group_bits // 8 * BLOCK
    return (blocks, k // g, record), torch.uint8


def matrix_sizes(c: Any) -> dict[str, tuple[int, int]]:
    """(rows, columns) of each matrix for config `c` (a native Config)."""
    h, q, kv = c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim
    return {"q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q), "gate": (c.inter, h),
            "up": (c.inter, h), "down": (h, c.inter), "lm_head": (c.vocab, h)}


def layout(c: Any, formats: MatrixFormats | None = None) -> list[Part]:
    """The packed weights part by part, in buffer order, for config `c` (a native Config);
    `formats` gives every (layer, matrix) its format (None: all float32, `uniform_formats`)."""
    formats = formats if formats is not None else uniform_formats(c.layers, None, None)
    sizes = matrix_sizes(c)
    named = [(name, layer) for layer in range(c.layers) for name in LAYER_PARTS]
    named += [(name, None) for name in FINAL_PARTS]
    parts, offset = [], 0
    for name, layer in named:
        fmt = None
        if name in NORMS:
            shape, dtype = (c.hidden,), torch.float32
        else:
            fmt = formats[(layer, name)]
            problem = check_columns(fmt, sizes[name][1])
            if problem:
                raise EngineError(f"layer {layer} {name}: {problem}" if layer is not None
                                  else f"the LM head: {problem}")
            shape, dtype = matrix_shape(*sizes[name], fmt)
        parts.append(Part(name, layer, offset, shape, dtype, fmt))
        offset += -(-parts[-1].nbytes // ALIGN) * ALIGN
    return parts


def packed_bytes(parts: list[Part]) -> int:
    """Size of the packed weights of a `layout` in bytes (padding included)."""
    return parts[-1].offset + -(-parts[-1].nbytes // ALIGN) * ALIGN


class NotOnGrid(EngineError):
    """A weight to pack in a quantized format does not lie on that format's grid."""


def stored_matrix(weight: torch.Tensor | GgmlBlocks, fmt: MatrixFormat) -> torch.Tensor:
    """A weight in its stored form. GGML blocks are stored as they are (their values are the
    step's); a float weight is quantized only if that is lossless, so the step's weights are
    exactly the model's (its reference)."""
    if isinstance(weight, GgmlBlocks):
        if native_format(weight.type_name) != fmt:
            raise EngineError(f"{weight.type_name} blocks cannot fill a {format_name(fmt)} part")
        return ggml_stored(weight)
    if fmt is None:
        return _blocks(weight)
    if isinstance(fmt, str):
        from ..quant.kquants import dequantize_blocks, quantize_blocks

        blocks = GgmlBlocks(fmt, tuple(weight.shape), quantize_blocks(weight, fmt))
        if not torch.equal(dequantize_blocks(blocks.data, fmt, blocks.shape), weight.float()):
            raise NotOnGrid(f"weights are not on the {fmt} grid: pack the variant's blocks")
        return ggml_stored(blocks)
    q = quantize(weight, fmt)
    if not torch.equal(q.dequantize(), weight.float()):
        raise NotOnGrid(f"weights are not on the {fmt.name} grid: pack the variant's copy "
                        "(engine.quant.apply.apply_variant), whose weights are")
    return quant_blocks(q)


def model_tensors(model: Any) -> dict[tuple[int | None, str], torch.Tensor]:
    """A transformers Llama's weights by (layer, part name), as `layout` names them."""
    tensors: dict[tuple[int | None, str], torch.Tensor] = {}
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        linears = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj, "o": attn.o_proj,
                   "gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj}
        tensors.update({(i, m): linears[m].weight for m in MATRICES})
        tensors[(i, "in_norm")] = layer.input_layernorm.weight
        tensors[(i, "post_norm")] = layer.post_attention_layernorm.weight
    tensors[(None, "final_norm")] = model.model.norm.weight
    tensors[(None, "lm_head")] = model.lm_head.weight
    return tensors


def variant_blocks(model: Any, types: Mapping[str, str]
                   ) -> dict[tuple[int | None, str], torch.Tensor | GgmlBlocks]:
    """`model_tensors` with each matrix as the GGML blocks of its type in `types` (weight name →
    GGML type, kmix.tensor_types): a K-quant variant packed from the float weights it rounds, so
    the step reads exactly the blocks the variant's copy was dequantized from."""
    from ..quant.kquants import quantize_blocks

    tensors = model_tensors(model)
    names = {id(p): n for n, p in model.named_parameters()}
    for key, tensor in tensors.items():
        type_name = types.get(names.get(id(tensor), ""))
        if type_name is not None and key[1] not in NORMS:
            blocks = quantize_blocks(tensor.detach(), type_name)
            tensors[key] = GgmlBlocks(type_name, tuple(tensor.shape), blocks)
    return tensors


def _stored(parts: list[Part],
            tensors: Mapping[tuple[int | None, str], torch.Tensor | GgmlBlocks]
            ) -> Iterator[tuple[Part, torch.Tensor | None]]:
    for part in parts:
        source = tensors.get(part.key)
        if source is None:
            yield part, None
        elif part.name in NORMS:
            yield part, source.detach().float() if isinstance(source, torch.Tensor) else None
        else:
            yield part, stored_matrix(source, part.fmt)


def pack(parts: list[Part],
         tensors: Mapping[tuple[int | None, str], torch.Tensor | GgmlBlocks]) -> torch.Tensor:
    """The weights `tensors` ((layer, part name) → a float tensor, or a matrix's GGML blocks) at
    the offsets of `parts` (`layout`), in one huge-page byte buffer; each part must have exactly
    the shape the layout gives it."""
    total = packed_bytes(parts)
    buffer = huge_page_buffer(-(-total // 4)).view(torch.uint8)[:total]
    buffer.zero_()
    for part, tensor in _stored(parts, tensors):
        if tensor is None or tuple(tensor.shape) != part.shape:
            where = part.name if part.layer is None else f"layer {part.layer} {part.name}"
            got = "nothing" if tensor is None else f"shape {tuple(tensor.shape)}"
            raise EngineError(f"the native decoder cannot pack {where}: {got}, its layout "
                              f"expects {part.shape}")
        view = buffer[part.offset:part.offset + part.nbytes].view(part.dtype).view(part.shape)
        view.copy_(tensor)
    return buffer


def pack_weights(model: Any, parts: list[Part]) -> torch.Tensor:
    """A transformers Llama's weights, packed in the formats of `parts` (`layout`); NotOnGrid if a
    weight does not lie on its part's grid."""
    with torch.inference_mode():
        return pack(parts, model_tensors(model))


def pack_blocks(c: Any, tensors: Mapping[str, GgmlBlocks | torch.Tensor]
                ) -> tuple[list[Part], torch.Tensor]:
    """Pack an opened GGUF file's tensors as stored: `tensors` maps weight names (GGUF's
    "blk.3.attn_v.weight", "output_norm.weight", or transformers' names) to `GgmlBlocks` (type
    name, (out, in) shape, the block bytes) for the matrices and float tensors for the norms.
    The formats come from the blocks' types, one per matrix (`formats_from_types`); the step
    then multiplies by exactly the values in those blocks (F16, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K as
    stored, Q8_0 / Q4_0 / Q4_1 / F32 re-laid). Under GGUF's names, attn_q and attn_k rows are in
    llama.cpp's order (convert_hf_to_gguf permutes them per head) and are put back in
    transformers' order, which the step's RoPE reads: a row's blocks are its own, so moving whole
    rows of bytes changes no value. Returns the layout and the packed buffer, for a
    NativeDecoder's `parts` and `packed`. `c` is the native Config of the file's model."""
    from ..gguf.names import heads_for, unpermute

    keyed: dict[tuple[int | None, str], GgmlBlocks | torch.Tensor] = {}
    types: dict[str, str] = {}
    for name, tensor in sorted(tensors.items(), key=lambda item: item[0] in HEAD_NAMES):
        key = matrix_key(name) or norm_key(name)  # an LM head last: it wins over the embedding
        heads = heads_for(name, c.heads, c.kv_heads) if name.startswith("blk.") else None
        if heads and isinstance(tensor, GgmlBlocks):
            rows = unpermute(tensor.data.reshape(tensor.shape[0], -1), heads)  # (out, row bytes)
            tensor = GgmlBlocks(tensor.type_name, tensor.shape, rows.reshape(-1))
        elif heads:
            tensor = unpermute(tensor, heads)
        if key is not None:
            keyed[key] = tensor
            if isinstance(tensor, GgmlBlocks):
                types[name] = tensor.type_name
    parts = layout(c, formats_from_types(types, c.layers))
    return parts, pack(parts, keyed)


def norm_key(name: str) -> tuple[int | None, str] | None:
    """(layer, norm part) of a norm weight named as in a GGUF file or in transformers."""
    pieces = name.split(".")
    if name in ("output_norm.weight", "model.norm.weight"):
        return None, "final_norm"
    if len(pieces) == 4 and pieces[0] == "blk" and pieces[1].isdigit():
        return {"attn_norm": (int(pieces[1]), "in_norm"),
                "ffn_norm": (int(pieces[1]), "post_norm")}.get(pieces[2])
    if len(pieces) == 5 and pieces[:2] == ["model", "layers"] and pieces[2].isdigit():
        return {"input_layernorm": (int(pieces[2]), "in_norm"),
                "post_attention_layernorm": (int(pieces[2]), "post_norm")}.get(pieces[3])
    return None

