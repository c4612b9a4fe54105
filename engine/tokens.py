"""Tokenization made visible: byte-level pieces, the tokenizer's own BPE merges step by step,
and what a text costs on a given model.

Works on byte-level BPE tokenizers (GPT-2 style, as SmolLM2, Llama 3, Qwen use): every piece is a
string over a 256-character alphabet standing for raw bytes.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .spec import ModelSpec


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (printable stand-ins for the 256 byte values), reversed."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def piece_bytes(piece: str) -> bytes | None:
    """The raw bytes a byte-level piece stands for; None for a piece outside that alphabet
    (a special token such as <|im_start|>)."""
    decoder = byte_decoder()
    if piece and all(ch in decoder for ch in piece):
        return bytes(decoder[ch] for ch in piece)
    return None


@dataclass(frozen=True, slots=True)
class Token:
    id: int
    piece: str
    special: bool

    @property
    def raw(self) -> bytes:
        """Bytes this token contributes to the text (a special token: its literal name)."""
        data = None if self.special else piece_bytes(self.piece)
        return data if data is not None else self.piece.encode()


def tokenize(tokenizer: Any, text: str) -> list[Token]:
    """The text's tokens exactly as the model sees them (no BOS/chat template added)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids)
    return [Token(i, p, i in special) for i, p in zip(ids, tokenizer.convert_ids_to_tokens(ids))]


def join_tokens(tokens: list[Token]) -> str:
    """Concatenate the tokens' bytes and decode: the inverse of `tokenize`."""
    return b"".join(t.raw for t in tokens).decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class MergeStep:
    pieces: tuple[str, ...]  # the word after this merge
    pair: tuple[str, str] | None  # the merged pair (None for the starting bytes)
    rank: int | None  # its rank in the tokenizer's merge list (lower merges first)


def merge_ranks(tokenizer: Any) -> dict[tuple[str, str], int]:
    """The merge list stored in the tokenizer itself (tokenizer.json), pair → rank; parsed once
    per tokenizer object (weakly held: a replaced model's tokenizer never lends its ranks to a
    new one that happens to reuse its id)."""
    if tokenizer not in _RANKS:
        model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
        if model.get("type") != "BPE":
            raise ValueError("this tokenizer is not BPE")
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        _RANKS[tokenizer] = {pair: rank for rank, pair in enumerate(merges)}
    return _RANKS[tokenizer]


_RANKS: "weakref.WeakKeyDictionary[Any, dict[tuple[str, str], int]]" = weakref.WeakKeyDictionary()


def pre_tokens(tokenizer: Any, text: str) -> list[str]:
    """The tokenizer's own pre-tokenization (words, with spaces as Ġ), before any merge."""
    return [piece for piece, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]


def bpe_steps(tokenizer: Any, word: str) -> list[MergeStep]:
    """Merge a pre-token from single bytes to final pieces, always the lowest-ranked pair first."""
    ranks = merge_ranks(tokenizer)
    pieces = list(word)
    steps = [MergeStep(tuple(pieces), None, None)]
    while len(pieces) > 1:
        candidates = [(ranks[p], i) for i, p in enumerate(zip(pieces, pieces[1:])) if p in ranks]
        if not candidates:
            break
        rank, i = min(candidates)
        pair = (pieces[i], pieces[i + 1])
        pieces[i:i + 2] = [pair[0] + pair[1]]
        steps.append(MergeStep(tuple(pieces), pair, rank))
    return steps


@dataclass(frozen=True, slots=True)
class TextCost:
    tokens: int
    characters: int
    kv_bytes: int  # 2 · layers · kv_heads · head_dim · bytes · tokens
    prefill_flops: float  # ≈ 2 · parameters · tokens

    @property
    def tokens_per_char(self) -> float:
        return self.tokens / self.characters if self.characters else 0.0


def text_cost(spec: ModelSpec, text: str, tokens: int) -> TextCost:
    return TextCost(tokens, len(text), spec.kv_bytes(tokens), 2.0 * spec.param_count * tokens)
