"""Tokenization made visible: byte-level pieces, the tokenizer's own BPE merges step by step,
and what a text costs on a given model.

Works on byte-level BPE tokenizers (GPT-2 style, as SmolLM2, Llama 3, Qwen use): every piece is a
string over a 256-character alphabet standing for raw bytes.
"""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..assets import asset
from ..forward import special_ids, text_ids
from ..spec import ModelSpec


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


_CONTROL = {c: "␣" for c in [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029]}
_CONTROL.update({ord(" "): "·", ord("\n"): "↵", ord("\t"): "→", ord("\r"): "␍"})
_BYTE_GROUP = re.compile(r"(<[0-9A-F]{2}(?: [0-9A-F]{2})*>)")  # as `byte_label` writes bytes


def visible(text: str) -> str:
    """Make whitespace visible, the one notation every token the app shows uses: space → ·,
    newline → ↵, tab → →, carriage return → ␍, any other control or line-separator character
    → ␣ — except the spaces between the bytes of a `<E6 9D>` group. No line break can reach
    the chips' HTML, where a blank line would end the HTML block and let markdown parse what
    follows."""
    parts = _BYTE_GROUP.split(text)  # odd indices: byte groups
    return "".join(p if i % 2 else p.translate(_CONTROL) for i, p in enumerate(parts)) or "∅"


_SPLIT = re.compile(r"[\udc80-\udcff]+")  # bytes no complete UTF-8 character claims


def byte_label(data: bytes) -> str:
    """Readable text for bytes that may hold part of a UTF-8 character: complete characters as
    text, each run of leftover bytes as `<E6 9D>`. Byte-level BPE cuts text by bytes, so one
    token can carry 2 of the 3 bytes of 東; shown alone those decode to U+FFFD, which hides
    what the token is. `surrogateescape` maps each undecodable byte b to U+DC00 + b."""
    text = data.decode("utf-8", errors="surrogateescape")
    return _SPLIT.sub(lambda m: "<" + " ".join(f"{ord(c) - 0xDC00:02X}" for c in m.group())
                      + ">", text)


def splits_character(data: bytes) -> bool:
    """True when these bytes hold part of a UTF-8 character (not only whole characters)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def split_characters(tokens: "list[Token]") -> list[str]:
    """For each token, the characters it holds only some bytes of ('' when none), found by
    decoding the joined bytes and seeing which characters cross a token boundary."""
    ends, pos = [], 0
    for tok in tokens:
        pos += len(tok.raw)
        ends.append(pos)
    starts = [0, *ends[:-1]]
    text = b"".join(t.raw for t in tokens).decode("utf-8", errors="surrogateescape")
    spans, pos = [], 0  # (first byte, end byte, character) of every character over 1 byte
    for ch in text:
        size = 1 if "\udc80" <= ch <= "\udcff" else len(ch.encode("utf-8"))
        if size > 1:
            spans.append((pos, pos + size, ch))
        pos += size
    out = []
    for start, end in zip(starts, ends):
        out.append("".join(ch for a, b, ch in spans if a < end and b > start
                           and not (start <= a and b <= end)))
    return out


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
    """The text's tokens exactly as the model sees them in a prompt (no BOS/chat template
    added; a typed special-token string is ordinary text, as `text_ids` says)."""
    ids = text_ids(tokenizer, text)
    special = special_ids(tokenizer)
    return [Token(i, p, i in special) for i, p in zip(ids, tokenizer.convert_ids_to_tokens(ids))]


def join_tokens(tokens: list[Token]) -> str:
    """Concatenate the tokens' bytes and decode: the inverse of `tokenize`."""
    return b"".join(t.raw for t in tokens).decode("utf-8", errors="replace")


def piece_label(piece: str) -> str:
    """A vocabulary piece as readable text: 'Ġthe' → ' the', 'æĿ' → '<E6 9D>' (the bytes of a
    character split across tokens); a piece outside the byte alphabet stays as it is."""
    data = piece_bytes(piece)
    return byte_label(data) if data is not None else piece


@dataclass(frozen=True, slots=True)
class ProbedToken:
    """Which token a typed word probes: its first token. The same letters are different tokens
    with and without the space before them ('king' is a word ending, '·king' the word), so the
    page says which one it used and offers the word-initial form."""

    word: str  # as typed
    ids: tuple[int, ...]  # the word's tokens, as the tokenizer cuts it alone
    pieces: tuple[str, ...]
    word_initial: tuple[str, int, str] | None  # (" word", its first id, piece) when that differs

    @property
    def token_id(self) -> int:
        return self.ids[0]

    @property
    def piece(self) -> str:
        return self.pieces[0]

    @property
    def split(self) -> bool:
        return len(self.ids) > 1

    def description(self) -> str:
        """One or two sentences naming the probed piece and its id, for the page."""
        first = f"the piece {_shown(self.piece)} (id {self.token_id})"
        if self.split:
            what = (f"“{self.word}” splits into {len(self.ids)} pieces: "
                    + " | ".join(_shown(p) for p in self.pieces) + f"; probed: the first, {first}")
        else:
            what = f"“{self.word}” is one token: {first}"
        if self.piece.startswith("Ġ"):
            what += ", word-initial: the space before the word is part of its token."
        elif self.word_initial is not None:
            text, tid, piece = self.word_initial
            what += (", with no space before it: the form used inside a longer word or at the "
                     f"very start of a text. In running text the word follows a space: "
                     f"“{text}” starts with {_shown(piece)} (id {tid}).")
        else:
            what += "."
        if any(splits_character(piece_bytes(p) or b"") for p in self.pieces):
            what += " <…> are UTF-8 bytes of a character split across tokens."
        return what


def _shown(piece: str) -> str:
    """A piece as text in the app's notation (`visible`: · for a space), the bytes of a
    partial UTF-8 character as `<E6 9D>`; a special token as the vocabulary spells it."""
    return visible(piece_label(piece)) if piece_bytes(piece) is not None else piece


def probe_token(tokenizer: Any, word: str) -> ProbedToken | None:
    """The token a typed word probes and, for a word typed without a leading space, the
    word-initial form; None when the word has no tokens (empty)."""
    ids = tokenizer(word, add_special_tokens=False)["input_ids"]
    if not ids:
        return None
    alternative = None
    stripped = word.lstrip()
    if stripped and stripped == word and stripped[0].isalnum():
        alt_ids = tokenizer(" " + stripped, add_special_tokens=False)["input_ids"]
        alt_piece = tokenizer.convert_ids_to_tokens(alt_ids[0]) if alt_ids else "Ġ"
        if alt_ids[0] != ids[0] and piece_label(alt_piece).strip()[:1].isalpha():
            alternative = (" " + stripped, alt_ids[0], alt_piece)
    return ProbedToken(word, tuple(ids), tuple(tokenizer.convert_ids_to_tokens(ids)), alternative)


def prompt_word(tokenizer: Any, text: str, min_letters: int = 4) -> int | None:
    """A token to start the neighbour view on: the first whole word of the user's text (one
    word-initial piece of at least `min_letters` letters, not continued by the next piece),
    else its first word-initial piece, else None."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    continues = [piece_label(p)[:1].isalpha() for p in pieces[1:]] + [False]  # no space first
    initial = [(i, p) for i, p, more in zip(ids, pieces, continues)
               if p.startswith("Ġ") and p[1:].isalpha() and not more]
    for tid, piece in initial:
        if len(piece) - 1 >= min_letters:
            return tid
    return initial[0][0] if initial else None


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


def sentence_costs(tokenizer: Any, spec: ModelSpec, texts: list[str]) -> list[TextCost]:
    """What each text costs on this model: its tokens (the tokenizer's own count, no special
    tokens added), characters, KV-cache bytes and prefill FLOPs — one sentence in several
    languages side by side (the Tokens page, `python -m engine tokens`)."""
    return [text_cost(spec, text, len(tokenizer(text).input_ids)) for text in texts]


ARTICLE_FORMS = ("zh-Hant", "zh-Hans", "en")


def article_sentences() -> dict[str, str]:
    """The article's opening sentences by language — its Traditional Chinese, Simplified (OpenCC,
    reviewed) and English (assets/multilingual.json)."""
    article = json.loads(asset("multilingual.json").read_text())["article"]
    return {form: article[form] for form in ARTICLE_FORMS}
