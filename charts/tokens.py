"""Token chips: vocabulary pieces shown as readable text, as HTML spans with hover details."""

from __future__ import annotations

import html

from engine.tokens import Token, piece_bytes
from engine.trace import Trace


def piece_text(piece: str) -> str:
    """'Ġthe' → ' the', 'Ċ' → '\\n', '▁the' → ' the'; a piece holding part of a UTF-8 character
    shows its bytes as U+FFFD (that is the honest view of one token on its own)."""
    data = piece_bytes(piece)
    if data is not None:
        return data.decode("utf-8", errors="replace")
    return piece.replace("▁", " ")


_CONTROL = {c: "␣" for c in [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029]}
_CONTROL.update({ord(" "): "·", ord("\n"): "↵", ord("\t"): "→", ord("\r"): "␍"})


def visible(text: str) -> str:
    """Make whitespace visible in a chip: space → ·, newline → ↵, tab → →, carriage return → ␍,
    any other control or line-separator character → ␣. No line break can reach the chips' HTML,
    where a blank line would end the HTML block and let markdown parse what follows."""
    return text.translate(_CONTROL) or "∅"


def _chip(text: str, title: str, kind: str) -> str:
    return (f'<span class="ie-chip ie-{kind}" title="{html.escape(title, quote=True)}">'
            f"{html.escape(visible(text))}</span>")


def token_chips_html(trace: Trace) -> str:
    """Prompt chips (special tokens marked) then one chip per generated token, with hover text."""
    parts = []
    for i, (tid, piece, special) in enumerate(zip(trace.prompt_token_ids, trace.prompt_pieces,
                                                  trace.prompt_special)):
        label = piece if special else piece_text(piece)
        kind = "special" if special else "prompt"
        parts.append(_chip(label, f"prompt token {i} · id {tid}{' · special' if special else ''}",
                           kind))
    for step in trace.steps:
        title = (f"{step.phase} step {step.index} · id {step.token_id} · {step.latency_ms:.1f} ms"
                 f" · p={step.chosen_prob:.3f} (rank {step.chosen_rank + 1})")
        parts.append(_chip(piece_text(step.piece), title, "gen"))
    return '<div class="ie-chips">' + "".join(parts) + "</div>"


def chips_html(tokens: list[Token]) -> str:
    """Chips for any token list: readable text, id and the raw bytes on hover."""
    parts = []
    for i, tok in enumerate(tokens):
        label = tok.piece if tok.special else piece_text(tok.piece)
        data = " ".join(f"{b:02x}" for b in tok.raw)
        title = f"token {i} · id {tok.id} · bytes {data}" + (" · special" if tok.special else "")
        parts.append(_chip(label, title, "special" if tok.special else "prompt"))
    return '<div class="ie-chips">' + "".join(parts) + "</div>"
