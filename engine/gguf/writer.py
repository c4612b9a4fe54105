"""Write a llama-family GGUF with gguf-py's `GGUFWriter`: the architecture's settings, the
tokenizer, the chat template and tensors already in their GGML types.

What goes in the metadata is what llama.cpp's convert_hf_to_gguf.py writes for a llama model, so
llama.cpp and transformers' GGUF loader both read the file: `{arch}.context_length`,
`.embedding_length`, `.block_count`, `.feed_forward_length`, `.attention.head_count(_kv)`,
`.rope.freq_base`, `.attention.layer_norm_rms_epsilon`, `.vocab_size`, `.rope.dimension_count`;
the vocabulary as a byte-level BPE ("gpt2") one — tokens in id order, merges "a b", token types
(control for special added tokens, user-defined for other added ones, normal for the rest) — its
bos / eos / unk / pad ids and the chat template. Tensors come in as numpy arrays: float values
(F32, F16) or uint8 block bytes with their GGML type (`OutTensor`); this module knows nothing of
quantization (engine/gguf/export.py makes the blocks).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError

# GGML type name → llama.cpp's file type (LlamaFileType) when it is the main matrix type
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "BF16": 32,
              "Q6_K": 18, "Q4_K": 15}  # Q4_K → MOSTLY_Q4_K_M (the mix llama-quantize names so)
TOKEN_NORMAL, TOKEN_UNUSED, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 5, 3, 4


@dataclass(frozen=True, slots=True, eq=False)
class OutTensor:
    """One tensor as it goes into the file."""

    name: str  # llama.cpp's name (engine/gguf/names.py)
    data: np.ndarray  # (rows, cols) float32 / float16 values, or (rows, bytes per row) uint8 blocks
    ggml_type: str  # "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"


@dataclass(frozen=True, slots=True)
class Settings:
    """The architecture's numbers, as the file states them."""

    arch: str  # "llama" or "qwen2"
    name: str
    context: int
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    vocab: int


@dataclass(frozen=True, slots=True)
class Vocab:
    """A byte-level BPE vocabulary in llama.cpp's terms."""

    tokens: tuple[str, ...]  # id order, len == Settings.vocab
    types: tuple[int, ...]
    merges: tuple[str, ...]  # "a b", best first
    bos: int | None
    eos: int | None
    unk: int | None
    pad: int | None
    add_bos: bool
    chat_template: str | None
    pre: str  # llama.cpp's pre-tokenizer name ("smollm", "qwen2", … or "default")


def settings_from_config(config: Any, arch: str, name: str) -> Settings:
    """A Hugging Face llama / mistral / qwen2 config as GGUF settings; InputError for RoPE
    scaling, which this writer does not carry over (the file would run a different model)."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope = rope if isinstance(rope, dict) else {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise InputError(f"export writes plain RoPE only; this model uses {rope_type!r} scaling")
    theta = rope.get("rope_theta")
    theta = theta if theta is not None else getattr(config, "rope_theta", 10000.0)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return Settings(arch, name, config.max_position_embeddings, config.hidden_size,
                    config.num_hidden_layers, config.intermediate_size, heads,
                    getattr(config, "num_key_value_heads", None) or heads, head_dim,
                    float(theta), float(config.rms_norm_eps), config.vocab_size)


def vocab_from_tokenizer(tokenizer: Any, vocab_size: int, pre: str) -> Vocab:
    """The tokens, merges and types of a fast byte-level BPE tokenizer, as llama.cpp's
    `get_vocab_base` lists them: ids the tokenizer lacks up to the model's vocabulary size are
    "[PAD{id}]" placeholders (unused)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = json.loads(backend.to_str())["model"] if backend is not None else {}
    if model.get("type") != "BPE":
        raise InputError("export writes byte-level BPE tokenizers only (this one is "
                         f"{model.get('type') or type(tokenizer).__name__})")
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
        elif i in added:
            tokens.append(added[i].content)
            types.append(TOKEN_CONTROL if added[i].special else TOKEN_USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(TOKEN_NORMAL)
    merges = tuple(m if isinstance(m, str) else " ".join(m) for m in model.get("merges", ()))
    return Vocab(tuple(tokens), tuple(types), merges, tokenizer.bos_token_id,
                 tokenizer.eos_token_id, tokenizer.unk_token_id, tokenizer.pad_token_id,
                 bool(getattr(tokenizer, "add_bos_token", False)),
                 getattr(tokenizer, "chat_template", None), pre)


def write_gguf(path: Path, settings: Settings, vocab: Vocab, tensors: list[OutTensor],
               file_type: str) -> None:
    """The whole file at `path` (a temporary name: the caller renames it into place)."""
    import gguf

    w = gguf.GGUFWriter(path, settings.arch)
    s = settings
    w.add_type("model")
    w.add_name(s.name)
    w.add_context_length(s.context)
    w.add_embedding_length(s.hidden)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_file_type(FILE_TYPES[file_type])
    w.add_vocab_size(s.vocab)
    w.add_rope_dimension_count(s.head_dim)
    if s.head_dim * s.heads != s.hidden:  # llama.cpp assumes hidden / heads otherwise
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(list(vocab.tokens))
    w.add_token_types(list(vocab.types))
    w.add_token_merges(list(vocab.merges))
    for value, add in ((vocab.bos, w.add_bos_token_id), (vocab.eos, w.add_eos_token_id),
                       (vocab.unk, w.add_unk_token_id), (vocab.pad, w.add_pad_token_id)):
        if value is not None:
            add(value)
    w.add_add_bos_token(vocab.add_bos)
    if vocab.chat_template:
        w.add_chat_template(vocab.chat_template)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for t in tensors:  # uint8 block bytes: gguf-py derives the weight shape from the type
        w.add_tensor(t.name, t.data, raw_dtype=gguf.GGMLQuantizationType[t.ggml_type])
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
