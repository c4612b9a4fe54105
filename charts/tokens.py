"""Token chips: vocabulary pieces shown as readable text, as HTML spans with hover details."""

from __future__ import annotations

import html
from functools import lru_cache

from engine.trace import Trace


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet (printable stand-ins for the 256 byte values), reversed."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def piece_text(piece: str) -> str:
    """'Ġthe' → ' the', 'Ċ' → '\\n', '▁the' → ' the'; a piece holding part of a UTF-8 character
    shows its bytes as U+FFFD (that is the honest view of one token on its own)."""
    decoder = _byte_decoder()
    if piece and all(ch in decoder for ch in piece):
        return bytes(decoder[ch] for ch in piece).decode("utf-8", errors="replace")
    return piece.replace("▁", " ")


def visible(text: str) -> str:
    """Make whitespace visible in a chip: space → ·, newline → ↵, tab → →."""
    return text.replace(" ", "·").replace("\n", "↵").replace("\t", "→") or "∅"


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
