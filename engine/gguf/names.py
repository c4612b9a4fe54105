"""llama.cpp's names for a llama-family model's tensors, and its query / key row order.

Hugging Face names a weight `model.layers.3.self_attn.q_proj.weight`; llama.cpp's GGUF files call
the same weight `blk.3.attn_q.weight` (gguf-py's `TensorNameMap`). A name table of our own, not
gguf-py's map, because the reader must also know which tensors a model of this shape *needs*:
a missing one is refused, never replaced by the random values a fresh module holds.

The row order: llama.cpp's rotary embedding rotates adjacent pairs (x0, x1), (x2, x3), … of a
head, Hugging Face's llama rotates the two halves (x_i, x_{i + d/2}). So convert_hf_to_gguf.py
(`LlamaModel.permute`) reorders the rows of q_proj and k_proj, head by head, when it writes a
llama file, and every reader undoes it. Qwen2 files are written with the halves order kept (its
converter does not permute), so only the llama architecture permutes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# architecture in the file → the Hugging Face model type the reader builds. llama.cpp writes
# Mistral (and SmolLM, a llama) under "llama"; a few older files say "mistral".
ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}
PERMUTED = frozenset({"llama", "mistral"})  # q/k rows in llama.cpp's pair order
BIASED = frozenset({"qwen2"})  # q, k and v projections carry a bias
QK_NORMED = frozenset({"qwen3"})  # an RMS norm over each head's query and key before RoPE
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.x: RoPE's per-frequency divisors (optional)

# GGUF name (after "blk.N.") → Hugging Face name (after "model.layers.N.")
_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BIASES = {"attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
           "attn_v.bias": "self_attn.v_proj.bias"}
_QK_NORMS = {"attn_q_norm.weight": "self_attn.q_norm.weight",
             "attn_k_norm.weight": "self_attn.k_norm.weight"}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


@dataclass(frozen=True, slots=True)
class Shapes:
    """The sizes a llama-family model's tensors follow from (all from the file's metadata)."""

    vocab: int
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int


def expected_tensors(arch: str, s: Shapes) -> dict[str, tuple[int, ...]]:
    """GGUF name → shape in torch order (rows, cols) for every tensor the model needs, except
    output.weight (absent when the LM head is tied to the embedding)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    block = {"attn_norm.weight": (s.hidden,), "attn_q.weight": (q, s.hidden),
             "attn_k.weight": (kv, s.hidden), "attn_v.weight": (kv, s.hidden),
             "attn_output.weight": (s.hidden, q), "ffn_norm.weight": (s.hidden,),
             "ffn_gate.weight": (s.ffn, s.hidden), "ffn_up.weight": (s.ffn, s.hidden),
             "ffn_down.weight": (s.hidden, s.ffn)}
    if arch in BIASED:
        block |= {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}
    if arch in QK_NORMED:
        block |= {"attn_q_norm.weight": (s.head_dim,), "attn_k_norm.weight": (s.head_dim,)}
    found = {"token_embd.weight": (s.vocab, s.hidden), "output_norm.weight": (s.hidden,)}
    for i in range(s.layers):
        found |= {f"blk.{i}.{k}": v for k, v in block.items()}
    return found


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` → `model.layers.3.self_attn.q_proj.weight`; KeyError if unknown."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    head, _, rest = gguf_name.partition(".")
    index, _, leaf = rest.partition(".")
    if head != "blk" or not index.isdigit():
        raise KeyError(gguf_name)
    return f"model.layers.{int(index)}.{(_BLOCK | _BIASES | _QK_NORMS)[leaf]}"


def gguf_name(hf: str) -> str:
    """The inverse of `hf_name`; KeyError for a name llama.cpp has no tensor for."""
    for g, h in _GLOBAL.items():
        if h == hf:
            return g
    head, _, rest = hf.partition("model.layers.")
    index, _, leaf = rest.partition(".")
    if head or not index.isdigit():
        raise KeyError(hf)
    for g, h in (_BLOCK | _BIASES).items():
        if h == leaf:
            return f"blk.{int(index)}.{g}"
    raise KeyError(hf)


def heads_for(gguf_tensor: str, heads: int, kv_heads: int) -> int | None:
    """How many heads the rows of a llama file's tensor are permuted by: q → heads, k → kv heads,
    anything else → None (not permuted)."""
    if ".attn_q." in gguf_tensor:
        return heads
    if ".attn_k." in gguf_tensor:
        return kv_heads
    return None


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Hugging Face's row order → llama.cpp's, as convert_hf_to_gguf.py's `LlamaModel.permute`:
    rows (n_head · 2 · half, …) viewed as (n_head, 2, half, …), the middle axes swapped."""
    rows = w.shape[0]
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])  # (H, 2, d/2, …)
            .transpose(1, 2).reshape(w.shape))


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's row order → Hugging Face's: the inverse of `permute`."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])  # (H, d/2, 2, …)
            .transpose(1, 2).reshape(w.shape))
