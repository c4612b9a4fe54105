"""Token chips: vocabulary pieces shown as readable text, as HTML spans with hover details."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from engine.lens.tokens import (
    MergeStep,
    Token,
    piece_bytes,
    piece_label,
    split_characters,
    splits_character,
    visible,
)
from engine.records.trace import Trace
from i18n import N_, _

from .text import as_text


def piece_text(piece: str) -> str:
    """'Ġthe' → ' the', 'Ċ' → '\\n', '▁the' → ' the'; a piece holding part of a UTF-8 character
    shows those bytes as `<E6 9D>`, not as U+FFFD, which would make every such token look alike."""
    if piece_bytes(piece) is not None:
        return piece_label(piece)
    return piece.replace("▁", " ")


# Said once, on the Tokens page: what the notation every token shown in the app uses means.
WHITESPACE_NOTE = N_("In every token the app shows, · is a space and ↵ a newline. Most words "
                      "begin with a space, and it belongs to the word's token: “·king” (after a "
                      "space) and “king” are two different tokens.")


def shown_piece(piece: str) -> str:
    """A vocabulary piece as the app shows it: its text, whitespace made visible."""
    return visible(piece_text(piece))


BYTES_STYLE = "border-style: dashed"  # a chip holding part of a character


MARKED_STYLE = "outline: 3px solid #d62728; outline-offset: 1px; font-weight: 700"
MARKED_TITLE = N_("first difference between the two runs")


def chip(text: str, title: str, kind: str, partial: bool = False, marked: bool = False) -> str:
    """One token chip (`kind`: prompt, special, gen); `partial` = it holds part of a character
    (dashed), `marked` = the first difference between two runs (outlined in red)."""
    styles = ([BYTES_STYLE] if partial else []) + ([MARKED_STYLE] if marked else [])
    style = f' style="{"; ".join(styles)}"' if styles else ""
    title = f"{_(MARKED_TITLE)} · {title}" if marked else title
    return (f'<span class="ie-chip ie-{kind}{" ie-first-diff" if marked else ""}"{style} '
            f'title="{html.escape(title)}">{as_text(visible(text))}</span>')


def _split_note(token: Token, characters: str) -> str:
    """Hover text for a chip whose bytes are part of a character split across tokens."""
    if token.special or not splits_character(token.raw):
        return ""
    if characters:
        return _(" · <…> are UTF-8 bytes of {characters}: a character split across tokens "
                 "(byte-level BPE cuts text by bytes; the tokens together decode to it)"
                 ).format(characters=characters)
    return _(" · <…> are UTF-8 bytes: a character split across tokens (byte-level BPE cuts "
             "text by bytes; the tokens together decode to it)")


def special_note(special: bool) -> str:
    """' · special' after a special token's hover text."""
    return _(" · special") if special else ""


def token_chips_html(trace: Trace) -> str:
    """Prompt chips (special tokens marked) then one chip per generated token, with hover text."""
    tokens = [Token(tid, piece, special) for tid, piece, special in
              zip(trace.prompt_token_ids, trace.prompt_pieces, trace.prompt_special)]
    tokens += [Token(step.token_id, step.piece, False) for step in trace.steps]
    split = split_characters(tokens)
    n = len(trace.prompt_token_ids)
    parts = []
    for i, (tok, special) in enumerate(zip(tokens[:n], trace.prompt_special)):
        label = tok.piece if special else piece_text(tok.piece)
        note = _split_note(tok, split[i])
        parts.append(chip(label, _("prompt token {i} · id {id}").format(i=i, id=tok.id)
                          + special_note(special) + note, "special" if special else "prompt",
                          bool(note)))
    for step, tok, chars in zip(trace.steps, tokens[n:], split[n:]):
        note = _split_note(tok, chars)
        title = _("{phase} step {index} · id {id} · {ms} ms · p={p} (rank {rank})").format(
            phase=step.phase, index=step.index, id=step.token_id, ms=f"{step.latency_ms:.1f}",
            p=f"{step.chosen_prob:.3f}", rank=step.chosen_rank + 1) + note
        parts.append(chip(piece_text(step.piece), title, "gen", bool(note)))
    return '<div class="ie-chips">' + "".join(parts) + "</div>"


def chips_html(tokens: list[Token]) -> str:
    """Chips for any token list: readable text, id and the raw bytes on hover; a token holding
    part of a character shows its bytes (`<E6 9D>`) and says so on hover."""
    parts = []
    for i, (tok, chars) in enumerate(zip(tokens, split_characters(tokens))):
        label = tok.piece if tok.special else piece_text(tok.piece)
        data = " ".join(f"{b:02X}" for b in tok.raw)
        note = _split_note(tok, chars)
        title = (_("token {i} · id {id} · bytes {data}").format(i=i, id=tok.id, data=data)
                 + special_note(tok.special) + note)
        parts.append(chip(label, title, "special" if tok.special else "prompt", bool(note)))
    return '<div class="ie-chips">' + "".join(parts) + "</div>"


ROW_PX, HEADER_PX = 35, 38  # st.dataframe's row height and its header (with borders), in px
SELECTED = "background-color: #fff1dc; font-weight: 600"  # the slider's merge step


def table_height(rows: int) -> int:
    """A st.dataframe height in px that shows all `rows` without an inner scrollbar: the
    default (10 rows) hid the last merges, whose final row is the tokenizer's own output."""
    return HEADER_PX + ROW_PX * rows


def merge_table(steps: list[MergeStep], selected: int) -> Any:
    """Every BPE merge step as a row (the pieces as text, separated by |), the `selected` step
    highlighted; a pandas Styler for st.dataframe."""
    rank = _("merge rank")  # the columns as shown, in the session's language
    frame = pd.DataFrame([{
        _("step"): i, _("merged"): " + ".join(map(shown_piece, s.pair)) if s.pair else _("(bytes)"),
        rank: s.rank, _("pieces"): " | ".join(map(shown_piece, s.pieces))}
        for i, s in enumerate(steps)])
    frame[rank] = frame[rank].astype("Int64")  # None (the bytes) stays empty
    return frame.style.apply(lambda row: [SELECTED if row.name == selected else ""] * len(row),
                             axis=1).format({rank: "{:,}"}, na_rep="–")
