"""Which GGML type llama.cpp stores each tensor in, for the K-quant variants (src/llama-quant.cpp).

Why this is per tensor: llama-quantize's file types are mixes. `llama_tensor_get_type_impl` picks
a type from the tensor's role and layer, then `tensor_type_fallback` replaces a type whose blocks
do not fit the row: a 256-weight super-block type on rows of 576 weights (every matrix of
SmolLM2-135M that reads the hidden state: q, k, v, o, gate, up and the tied embedding) becomes
Q5_0 (asked Q4_K) or Q8_0 (asked Q6_K). So in this model only down_proj (rows of 1536) is ever
stored as a K-quant, and `tensor_types` says so tensor by tensor.

The variants, each what one llama-quantize command writes (no importance matrix):
- `q4_k_m`: `llama-quantize model.gguf Q4_K_M` — Q4_K, except attn_v and ffn_down on the layers
  `use_more_bits` picks, which get Q6_K; the output (here the tied token embedding) gets Q6_K,
  or Q8_0 when its rows are not whole blocks of the default type (576 % 256 here);
- `q6_k`: `llama-quantize model.gguf Q6_K` — Q6_K everywhere, the output rule as above;
- `q4_k`: Q4_K_M without its two bumps, i.e. `llama-quantize --tensor-type attn_v=q4_k
  --tensor-type ffn_down=q4_k model.gguf Q4_K_M`: Q4_K everywhere, the output rule as above
  (llama.cpp has no plain "Q4_K" file type).
"""

from __future__ import annotations

import re
from typing import Any

from i18n import N_

from .kquants import BLOCKS, stored_type
from .sites import decoder_linears, embedding_weights

K_VARIANTS = ("q4_k", "q6_k", "q4_k_m")
RULES = {"q4_k": "llama.cpp's Q4_K_M rule without its Q6_K bumps", "q6_k": "llama.cpp's Q6_K rule",
         "q4_k_m": "llama.cpp's Q4_K_M rule"}
# what the Quantization page says of each mix: its types and their stored bits per weight
# English where defined (a record's storage); _(STORAGE_TEXT[name]) / _(BITS_TEXT[name]) shown
STORAGE_TEXT = {
    "q4_k": N_("GGML types per tensor (llama.cpp's rule): Q4_K (4.5 bits) where rows are whole "
               "256-blocks, else its fallback Q5_0 (5.5)"),
    "q6_k": N_("GGML types per tensor (llama.cpp's rule): Q6_K (6.5625 bits) where rows are whole "
               "256-blocks, else its fallback Q8_0 (8.5)"),
    "q4_k_m": N_("GGML types per tensor by llama.cpp's Q4_K_M rule: Q4_K (4.5 bits) or its fallback "
                 "Q5_0 (5.5); attn_v and ffn_down of the use_more_bits layers Q6_K (6.5625) or its "
                 "fallback Q8_0 (8.5)"),
}
BITS_TEXT = {"q4_k": N_("4.5 (Q4_K) or 5.5 (Q5_0)"), "q6_k": N_("6.5625 (Q6_K) or 8.5 (Q8_0)"),
             "q4_k_m": N_("4.5 or 5.5; 6.5625 or 8.5 on a third of attn_v / ffn_down")}
DEFAULT_TYPE = {"q4_k": "Q4_K", "q6_k": "Q6_K", "q4_k_m": "Q4_K"}  # the file type's base type
# the Hugging Face Llama module names → llama.cpp's tensor roles (GGUF names blk.N.<role>)
ROLES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
         "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
# variants whose every tensor has one GGML type: (decoder Linears, embedding / LM head)
FIXED_TYPES = {"fp32": ("F32", "F32"), "fp16": ("F16", "F16"), "bf16": ("BF16", "BF16"),
               "q8_0": ("Q8_0", "Q8_0"), "q4_0": ("Q4_0", "Q8_0"), "q4_1": ("Q4_1", "Q8_0")}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp's use_more_bits: the first and last eighth of the layers and every third
    one between (0, 1, 2, 5, 8, …, 23, 26, 27, 28, 29 of 30)."""
    return (i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8
            or (i_layer - n_layers // 8) % 3 == 2)


def requested_type(variant: str, role: str, i_layer: int, n_layers: int) -> str:
    """llama_tensor_get_type_impl's choice for a decoder weight, before the shape fallback."""
    if variant == "q4_k_m" and role in ("attn_v", "ffn_down") and use_more_bits(i_layer, n_layers):
        return "Q6_K"
    return DEFAULT_TYPE[variant]


def output_type(variant: str, cols: int) -> str:
    """The output tensor's type (and a tied token embedding's, which llama.cpp quantizes as the
    output): Q8_0 when its rows are not whole blocks of the file's default type, else Q6_K;
    then the shape fallback (Q6_K on rows that are not whole 256-blocks → Q8_0)."""
    base = DEFAULT_TYPE[variant]
    asked = "Q8_0" if cols % BLOCKS[base][0] else "Q6_K"
    return stored_type(asked, cols)


def tensor_types(variant: str, model: Any) -> dict[str, str]:
    """Parameter name → the GGML type variant `variant` stores it in, for every decoder Linear
    weight and the token embedding (and the LM head when it is a tensor of its own):
    llama.cpp's rule for the K-quant variants (`K_VARIANTS`), the one type of a fixed variant
    (`FIXED_TYPES`). ValueError for a variant of our own (int8, q3, q2, the AWQ copies)."""
    names = {id(p): n for n, p in model.named_parameters()}
    linears = [(names[id(m.weight)], m.weight) for _, m in decoder_linears(model)]
    embedding = embedding_weights(model)
    tied = len(embedding) == 1
    if variant in FIXED_TYPES:
        inner, outer = FIXED_TYPES[variant]
        return {**{n: inner for n, _ in linears}, **{names[id(w)]: outer for w in embedding}}
    if variant not in K_VARIANTS:
        raise ValueError(f"{variant} is not stored in GGML types (our own format)")
    roles = [ROLES.get(n.removesuffix(".weight").rsplit(".", 1)[-1], "other") for n, _ in linears]
    counts = {r: roles.count(r) for r in set(roles)}  # llama.cpp's n_attention_wv, n_ffn_down
    types = {}
    for (name, w), role in zip(linears, roles):
        found = _LAYER.search(name)
        i_layer = int(found.group(1)) if found else 0
        types[name] = stored_type(requested_type(variant, role, i_layer, counts[role]), w.shape[1])
    head = embedding[-1]  # the output tensor (the token embedding itself when tied)
    types[names[id(head)]] = output_type(variant, head.shape[1])
    if not tied:  # a token embedding of its own keeps the default type, shape permitting
        first = embedding[0]
        types[names[id(first)]] = stored_type(DEFAULT_TYPE[variant], first.shape[1])
    return types
