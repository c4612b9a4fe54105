"""The native decode step's packed weights: one layout, described once, for every weight format.

`layout()` lists the parts in buffer order with their byte offsets and stored shapes;
`pack_weights()` fills a buffer at those offsets; engine/kernels/native_decode.c reads them by
the same offsets. Per layer: in_norm | qkv | o | post_norm | gate_up | down; then final_norm |
lm_head. Norms are float32 (H,). A matrix (N, K) is stored in B-row blocks (B = BLOCK, N padded
with zero rows to a multiple of B); gate_up puts each block of gate beside the same block of up.

Inside a block, by format:
- float32: (K, B) floats, k-major — the block is one sequential stream and x[k] is broadcast;
- quantized (int8 per row, Q8_0, Q4_0, Q4_1; see engine/quant/scheme.py): per group of G
  consecutive k (G = the format's group, or K for one group per row) a record of bytes
  [codes][B float16 scales][B float16 minimums, zero-point formats only]; codes are (G, B) int8
  (8-bit, value d·c) or (G/2, B) bytes with k even in the low nibble and k odd in the high one
  (4-bit: Q4_0 value d·(c − 8), Q4_1 value d·c + m). The codes and scales are exactly those of
  engine.quant.formats.quantize — for Q8_0, Q4_0 and Q4_1 GGML's own blocks' (ggml_blocks),
  re-laid 32 rows at a time — so the weights the step multiplies by are the variant's
  dequantized weights, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ..errors import EngineError
from ..quant.formats import QuantizedTensor, quantize
from ..quant.scheme import FORMATS, QuantFormat
from ..settings import weights_name
from .microbench import huge_page_buffer

BLOCK = 32  # rows per packed block, compiled into the C step as -DBLOCK
ALIGN = 64  # bytes: every part starts on a cache line
MAX_GROUPS = 4096  # groups per row the C step sums x over (its MAX_GROUPS)
LAYER_PARTS = ("in_norm", "qkv", "o", "post_norm", "gate_up", "down")  # the C enum's order
FINAL_PARTS = ("final_norm", "lm_head")
MATRICES = ("qkv", "o", "gate_up", "down", "lm_head")

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


def format_code(fmt: QuantFormat | None) -> int:
    """The C step's format enum (F32, Q8, Q4_0, Q4_1) for a weight format."""
    if fmt is None:
        return 0
    if fmt.bits == 8 and not fmt.zero_point:
        return 1
    if fmt.bits == 4:
        return 3 if fmt.zero_point else 2
    raise EngineError(f"the native step has no kernel for {fmt.name} ({fmt.describe()})")


@dataclass(frozen=True, slots=True)
class Part:
    """One tensor of the packed weights: where it starts (bytes) and how it is stored."""

    name: str  # one of LAYER_PARTS or FINAL_PARTS
    layer: int | None  # None: after the layers
    offset: int  # bytes before it in the packed buffer
    shape: tuple[int, ...]
    dtype: torch.dtype  # float32, or uint8 for quantized records

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def matrix_shape(n: int, k: int, fmt: QuantFormat | None) -> tuple[tuple[int, ...], torch.dtype]:
    """Stored shape of an (n, k) matrix: (blocks, k, B) float32, or (blocks, groups, record
    bytes) uint8 for a quantized format."""
    blocks = -(-n // BLOCK)
    if fmt is None:
        return (blocks, k, BLOCK), torch.float32
    g = fmt.group_for(k)
    record = g * fmt.bits // 8 * BLOCK + fmt.group_bits // 8 * BLOCK
    return (blocks, k // g, record), torch.uint8


def layout(c: Any, layer_fmt: QuantFormat | None = None,
           head_fmt: QuantFormat | None = None) -> list[Part]:
    """The packed weights part by part, in buffer order, for config `c` (a native Config)."""
    h = c.hidden
    q, nqkv = c.heads * c.head_dim, (c.heads + 2 * c.kv_heads) * c.head_dim
    mats = {"qkv": (nqkv, h, layer_fmt), "o": (h, q, layer_fmt), "down": (h, c.inter, layer_fmt),
            "lm_head": (c.vocab, h, head_fmt)}
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        name: matrix_shape(*size) for name, size in mats.items()}
    gate, dtype = matrix_shape(c.inter, h, layer_fmt)
    shapes["gate_up"] = (gate[0], 2, *gate[1:]), dtype
    for norm in ("in_norm", "post_norm", "final_norm"):
        shapes[norm] = (h,), torch.float32
    named = [(name, layer) for layer in range(c.layers) for name in LAYER_PARTS]
    named += [(name, None) for name in FINAL_PARTS]
    parts, offset = [], 0
    for name, layer in named:
        shape, dtype = shapes[name]
        parts.append(Part(name, layer, offset, shape, dtype))
        offset += -(-parts[-1].nbytes // ALIGN) * ALIGN
    return parts


def packed_bytes(parts: list[Part]) -> int:
    """Size of the packed weights of a `layout` in bytes (padding included)."""
    return parts[-1].offset + -(-parts[-1].nbytes // ALIGN) * ALIGN


def _blocks(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) → (ceil(N/B), K, B): each B-row block stored k-major, zero rows as padding."""
    n, k = weight.shape
    if n % BLOCK:
        weight = torch.cat([weight, weight.new_zeros(BLOCK - n % BLOCK, k)])
    return weight.view(-1, BLOCK, k).transpose(1, 2)


def _pad_rows(t: torch.Tensor, value: int = 0) -> torch.Tensor:
    n = t.shape[0]
    if n % BLOCK == 0:
        return t
    return torch.cat([t, t.new_full((BLOCK - n % BLOCK, *t.shape[1:]), value)])


def quant_blocks(q: QuantizedTensor) -> torch.Tensor:
    """A quantized (N, K) weight → (blocks, groups, record) uint8 in the layout's record order.
    Padding rows get scale 0 (and minimum 0), so they produce 0 whatever their codes."""
    fmt, k = q.fmt, q.shape[1]
    g = q.group
    codes = _pad_rows(q.unpacked_codes())  # (Np, K) in [0, 2^bits)
    blocks = codes.shape[0] // BLOCK
    c = codes.view(blocks, BLOCK, k // g, g).permute(0, 2, 3, 1)  # (nb, G#, g, B)
    if fmt.bits == 8:
        half = 2 ** (fmt.bits - 1)
        code_bytes = (c - half).to(torch.int8).view(torch.uint8)  # signed: value d·c
    else:
        pairs = c.reshape(blocks, k // g, g // 2, 2, BLOCK)  # k even, k odd
        code_bytes = (pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)).to(torch.uint8)
    records = [code_bytes.reshape(blocks, k // g, -1)]
    for table in (q.scales, q.minimums):
        if table is not None:  # (N, G#) float16 → (nb, G#, B) → bytes
            t = _pad_rows(table).view(blocks, BLOCK, k // g).transpose(1, 2).contiguous()
            records.append(t.view(torch.uint8).reshape(blocks, k // g, 2 * BLOCK))
    return torch.cat(records, dim=-1)


class NotOnGrid(EngineError):
    """A weight to pack in a quantized format does not lie on that format's grid."""


def _matrix(weight: torch.Tensor, fmt: QuantFormat | None) -> torch.Tensor:
    """A weight in its stored form; a quantized one only if quantizing it is lossless, so the
    step's weights are exactly the model's (its reference)."""
    if fmt is None:
        return _blocks(weight)
    q = quantize(weight, fmt)
    if not torch.equal(q.dequantize(), weight.float()):
        raise NotOnGrid(f"weights are not on the {fmt.name} grid: pack the variant's copy "
                        "(engine.quant.apply.apply_variant), whose weights are")
    return quant_blocks(q)


def _part_tensors(model: Any, layer_fmt: QuantFormat | None,
                  head_fmt: QuantFormat | None) -> Iterator[torch.Tensor]:
    """The model's weights in `layout` order, each in its stored shape."""
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])  # (Nqkv, H)
        gate = _matrix(mlp.gate_proj.weight, layer_fmt)
        up = _matrix(mlp.up_proj.weight, layer_fmt)
        yield from (layer.input_layernorm.weight, _matrix(qkv, layer_fmt),
                    _matrix(attn.o_proj.weight, layer_fmt), layer.post_attention_layernorm.weight,
                    torch.stack([gate, up], dim=1), _matrix(mlp.down_proj.weight, layer_fmt))
    yield model.model.norm.weight
    yield _matrix(model.lm_head.weight, head_fmt)


def pack_weights(model: Any, parts: list[Part], layer_fmt: QuantFormat | None = None,
                 head_fmt: QuantFormat | None = None) -> torch.Tensor:
    """The model's weights at the offsets of `parts` (`layout`), in one huge-page byte buffer;
    each part must have exactly the shape the layout gives it."""
    total = packed_bytes(parts)
    buffer = huge_page_buffer(-(-total // 4)).view(torch.uint8)[:total]
    buffer.zero_()
    tensors = _part_tensors(model, layer_fmt, head_fmt)
    for part in parts:
        tensor = next(tensors, None)
        if tensor is None or tuple(tensor.shape) != part.shape:
            where = part.name if part.layer is None else f"layer {part.layer} {part.name}"
            got = "nothing" if tensor is None else f"shape {tuple(tensor.shape)}"
            raise EngineError(f"the native decoder cannot pack {where}: {got}, its layout "
                              f"expects {part.shape}")
        view = buffer[part.offset:part.offset + part.nbytes].view(part.dtype).view(part.shape)
        view.copy_(tensor)
    if next(tensors, None) is not None:
        raise EngineError("the native decoder's layout has fewer parts than the model has weights")
    return buffer
