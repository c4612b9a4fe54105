"""The weight formats as numbers: bits per code, group size, what each group stores.

Kept free of torch so the calculator (bytes for any parameter count) and the CLI's argument
checks can use the same definitions the quantizer does without loading a tensor library.

Every format rounds groups of consecutive weights along a Linear layer's input dimension (one row
of the (out, in) weight matrix is split into in / group groups), by GGML's rules (see `formats`):
- symmetric: one float16 scale d per group, value = d · c with a signed code c; 8-bit as GGML's
  Q8_0 (d = max|w| / 127, c in [-127, 127]); fewer bits as GGML's Q4_0 (d = the signed weight of
  largest magnitude / −2^(b-1), c in [-2^(b-1), 2^(b-1) - 1]; d may be negative); 0 is exact;
- with a zero point (GGML's Q4_1): a float16 scale d and a float16 group minimum m per group,
  value = d · c + m with c in [0, 2^b - 1]; d = (max w - min w) / (2^b - 1), so the grid spans
  the group's own range (better for groups that are not centred on 0).
Only q4_0, q4_1 and q8_0 (groups of 32) carry GGML names, and they are GGML's formats bit for bit;
int8 (one scale per row), q3 and q2 (3 and 2 bits) are our own, named so.
`group=None` means one group per row: int8 "per output channel".

Codes are packed: `lcm(b, 8) / b` consecutive codes fill `lcm(b, 8) / 8` bytes (two 4-bit codes
per byte, four 2-bit codes per byte, eight 3-bit codes in 3 bytes), so the stored bytes are
exactly params · b / 8 for the codes, plus 2 (or 4) bytes per group.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from i18n import N_, _

SCALE_BITS = 16  # float16 scale (and float16 minimum, with a zero point) per group


@dataclass(frozen=True, slots=True)
class QuantFormat:
    name: str
    bits: int  # bits per stored code
    group: int | None  # weights per scale along the input dimension; None = a whole row
    zero_point: bool  # True: scale + minimum per group (Q4_1 idea); False: scale only (Q4_0)

    def __post_init__(self) -> None:
        if self.bits not in (2, 3, 4, 8):
            raise ValueError(f"{self.name}: codes of {self.bits} bits are not supported (2, 3, 4, 8)")
        if self.group is not None and (self.group <= 0 or self.group % self.codes_per_unit):
            raise ValueError(f"{self.name}: group {self.group} must be a positive multiple of "
                             f"{self.codes_per_unit}")

    @property
    def codes_per_unit(self) -> int:
        """Codes packed together into whole bytes: lcm(bits, 8) / bits."""
        return math.lcm(self.bits, 8) // self.bits

    @property
    def bytes_per_unit(self) -> int:
        return math.lcm(self.bits, 8) // 8

    @property
    def group_bits(self) -> int:
        """Bits stored once per group: a float16 scale, and a float16 minimum with a zero point."""
        return SCALE_BITS * (2 if self.zero_point else 1)

    def group_for(self, in_features: int) -> int:
        return in_features if self.group is None else self.group

    def check_shape(self, out_features: int, in_features: int) -> None:
        """Raise ValueError (one line) when a weight of this shape cannot be stored this way."""
        group = self.group_for(in_features)
        if out_features <= 0 or in_features <= 0:
            raise ValueError(f"{self.name}: an empty weight ({out_features}×{in_features})")
        if in_features % group or in_features % self.codes_per_unit:
            raise ValueError(f"{self.name}: rows of {in_features} weights do not split into "
                             f"groups of {group} (and packs of {self.codes_per_unit} codes)")

    def overhead_bits(self, in_features: int | None = None) -> float:
        """Scale (and minimum) bits per weight: group_bits / group. Per output channel the
        group is the row, so this needs the row length (in_features)."""
        if self.group is None and in_features is None:
            raise ValueError(f"{self.name} keeps one scale per row: give in_features")
        return self.group_bits / self.group_for(in_features or 0)

    def bits_per_weight(self, in_features: int | None = None) -> float:
        """Stored bits per weight, codes and scales: e.g. Q4_0 (group 32) 4 + 16/32 = 4.5."""
        return self.bits + self.overhead_bits(in_features)

    def code_bytes(self, out_features: int, in_features: int) -> int:
        """Packed code bytes of an (out, in) weight: out · in · bits / 8."""
        self.check_shape(out_features, in_features)
        return out_features * in_features * self.bits // 8

    def group_bytes(self, out_features: int, in_features: int) -> int:
        """Scale (and minimum) bytes: one entry per group, out · in / group of them."""
        self.check_shape(out_features, in_features)
        groups = out_features * (in_features // self.group_for(in_features))
        return groups * self.group_bits // 8

    def describe(self) -> str:
        """English: what a record stores (WeightReport.storage) and errors name."""
        return self._describe(str)

    def shown(self) -> str:
        """describe() in the session's language, for a page."""
        return self._describe(_)

    def _describe(self, translate: Callable[[str], str]) -> str:
        text = _DESCRIPTIONS[(self.group is None, self.zero_point)]
        return translate(text).format(bits=self.bits, group=self.group)



# describe()'s sentences: (one group per row, zero point) → the message
_DESCRIPTIONS = {
    (True, False): N_("{bits}-bit codes, GGML's rounding, float16 scale per output channel (one row)"),
    (True, True): N_("{bits}-bit codes, GGML's rounding, float16 scale + float16 minimum per output "
                     "channel (one row)"),
    (False, False): N_("{bits}-bit codes, GGML's rounding, float16 scale per group of {group}"),
    (False, True): N_("{bits}-bit codes, GGML's rounding, float16 scale + float16 minimum per group "
                      "of {group}"),
}

# The weight formats of the variants (Q8_0 is also every integer variant's embedding format, as
# in the default GGUF). q4_0, q4_1, q8_0: GGML's formats of those names (engine/quant/ggml_blocks.py).
FORMATS: dict[str, QuantFormat] = {
    "int8": QuantFormat("int8", 8, None, False),
    "q8_0": QuantFormat("q8_0", 8, 32, False),
    "q4_0": QuantFormat("q4_0", 4, 32, False),
    "q4_1": QuantFormat("q4_1", 4, 32, True),
    "q3": QuantFormat("q3", 3, 32, True),
    "q2": QuantFormat("q2", 2, 32, True),
}


# an AWQ variant's storage line (engine/quant/awq.py), English in its record
AWQ_STORAGE = N_("{storage}, after AWQ per-channel scales searched on {tokens} calibration tokens "
                 "({tied})")
AWQ_O_INCLUDED, AWQ_O_UNSCALED = N_("o_proj included"), N_("o_proj unscaled")
_AWQ_LINE = re.compile(r"(?P<storage>.+), after AWQ per-channel scales searched on (?P<tokens>\d+) "
                       r"calibration tokens \((?P<tied>o_proj included|o_proj unscaled)\)", re.DOTALL)


def shown_storage(text: str) -> str:
    """A record's storage line (WeightReport.storage, English) in the session's language when it
    is one of describe()'s (or an AWQ line around one); any other line as it is."""
    awq = _AWQ_LINE.fullmatch(text)
    if awq:
        return _(AWQ_STORAGE).format(storage=shown_storage(awq["storage"]), tokens=awq["tokens"],
                                     tied=_(awq["tied"]))
    for fmt in FORMATS.values():
        if text == fmt.describe():
            return fmt.shown()
    return text
