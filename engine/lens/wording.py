"""How the story's "what to notice" lines write numbers and token pieces: sizes and
probabilities without exponents, user text isolated from the sentence's direction."""

from __future__ import annotations

import math

from .tokens import piece_bytes, piece_label


def size(n_bytes: float) -> str:
    """Bytes in binary units with 3 significant figures, as the app's pages write them."""
    for factor, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n_bytes >= factor:
            value = n_bytes / factor  # 1 … 1023.x: 3 significant figures, never an exponent
            return f"{value:.3g} {unit}" if value < 999.5 else f"{value:.0f} {unit}"
    return f"{n_bytes:.0f} B"


def isolated(text: str) -> str:
    """User text between Unicode first-strong isolates (FSI … PDI): an Arabic or Hebrew word
    inside an English sentence then keeps its own direction without reordering the sentence's
    numbers and punctuation around it."""
    return f"\u2068{text}\u2069"


def probability(p: float) -> str:
    """0.62, 0.08, and a small one with its first two digits (0.00043), never a bare 0.00 and
    never an exponent (1.2e-05 is written 0.000012)."""
    if p >= 0.01 or p <= 0:
        return f"{p:.2f}"
    return f"{p:.{1 - math.floor(math.log10(p))}f}"


def shown(piece: str) -> str:
    """A vocabulary piece as readable text ('Ġthe' → ' the'; partial characters as <E6 9D>)."""
    return piece_label(piece) if piece_bytes(piece) is not None else piece
