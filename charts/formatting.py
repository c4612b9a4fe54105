"""Short number formats for `st.metric` values, which Streamlit cuts with "…" once they are wider
than their column (five or more metrics side by side at 1440 px with the sidebar open).

Every value keeps three significant figures at most and a short unit, so it stays within
`MAX_CHARS` characters (a rate: 6 and its unit) whatever its magnitude; a range or a detail
goes to the metric's help or a caption, never into the value. Pure functions: no Streamlit here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timezone

from babel.dates import format_datetime
from babel.numbers import get_decimal_symbol, get_group_symbol

from i18n import N_, _, babel_locale, chinese, ngettext

MAX_CHARS = 8  # durations and sizes: "1.21 MiB", "85.3 ms", "1023 KiB"; a rate adds its unit
NONE = "–"


def localized(text: str) -> str:
    """Python's digits with the session locale's decimal and group symbols (Babel's CLDR data:
    the same "." and "," for English and both Chinese locales, "," and "." in German)."""
    locale = babel_locale()
    decimal, group = get_decimal_symbol(locale), get_group_symbol(locale)
    if (decimal, group) == (".", ","):
        return text
    return text.translate(str.maketrans({".": decimal, ",": group}))


def significant(x: float, digits: int = 3, max_decimals: int = 2) -> str:
    """`x` with at most `digits` significant figures (and `max_decimals` decimals), no exponent
    and no trailing zeros: 21.26 → '21.3', 0.734 → '0.73', 1206.4 → '1206' (too wide: callers
    pick a larger unit first), 999.6 → '1000'."""
    return localized(_significant(x, digits, max_decimals))


def _significant(x: float, digits: int = 3, max_decimals: int = 2) -> str:
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    decimals = min(max(digits - 1 - math.floor(math.log10(abs(x))), 0), max_decimals)
    return _plain(x, decimals)


def _plain(x: float, decimals: int) -> str:
    text = f"{x:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _scaled(x: float, units: list[tuple[float, str]], digits: int = 3) -> str:
    """`x` in the first of `units` (ascending factors) in which it stays under the next unit once
    rounded: 999.7 ms rounds to 1000 ms, so it shows as '1 s'."""
    for i, (factor, unit) in enumerate(units):
        text = _significant(x / factor, digits)
        last = i == len(units) - 1
        if last or abs(float(text)) * factor < units[i + 1][0]:
            return localized(text) + unit
    raise ValueError("no units")


def duration(ms: float | None) -> str:
    """Milliseconds as '0.07 ms', '8.52 ms', '85.3 ms', '853 ms', '1.21 s', '59.9 s', '1.02 min',
    '2.5 h' (≤ 8 characters below 1,000 hours)."""
    if ms is None:
        return NONE
    return _scaled(ms, [(1.0, " ms"), (1000.0, " s"), (60_000.0, " min"), (3_600_000.0, " h")])


def rate(per_s: float | None, unit: str = "tok/s") -> str:
    """A rate as '0.73 tok/s', '21.3 tok/s', '1.21k tok/s' (≤ 6 characters and the unit)."""
    if per_s is None:
        return NONE
    return _scaled(per_s, [(1.0, " " + unit), (1e3, "k " + unit), (1e6, "M " + unit),
                           (1e9, "G " + unit)])


def size(n_bytes: float | None) -> str:
    """Bytes in binary units, as the tensors' `nbytes` and the formulas on the pages: '512 B',
    '45 KiB', '1.21 MiB', '3.13 GiB'."""
    if n_bytes is None:
        return NONE
    return _scaled(float(n_bytes), [(1.0, " B"), (2.0**10, " KiB"), (2.0**20, " MiB"),
                                    (2.0**30, " GiB"), (2.0**40, " TiB")])


def count(n: float | None) -> str:
    """A count as '948', '1,206', '12,100', '123k', '1.21M' (whole below 100,000)."""
    if n is None:
        return NONE
    if abs(n) < 100_000 and float(n).is_integer():
        return localized(f"{int(n):,}")
    return _scaled(float(n), [(1.0, ""), (1e3, "k"), (1e6, "M"), (1e9, "G")])


def moment(iso: str) -> str:
    """A recorded time (ISO 8601, as a trace stores it) as the session's locale writes it, in UTC:
    English keeps the ISO form the files use; Chinese reads "2026年12月6日 上午2:28:27 UTC"
    (Babel's medium date and time). A value that is not ISO is shown as it is."""
    if babel_locale() == "en_US":
        return iso
    try:
        when = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return format_datetime(when, "medium", tzinfo=timezone.utc, locale=babel_locale()) + " UTC"


# Why a recorded run ended (engine/records/trace.py STOP_REASONS), as a reader says it: the
# trace's own words ("eos", "length") are a file format's, not a sentence.
STOP_REASON_WORDS = {"eos": N_("the model ended its answer"),
                     "length": N_("the token limit was reached"),
                     "stopped": N_("stopped before the end"), "running": N_("still running"),
                     "limit": N_("the server's time limit per click was reached")}


def stop_reason(reason: str) -> str:
    """A trace's stop reason in the session's language (an unknown one as recorded)."""
    words = STOP_REASON_WORDS.get(reason)
    return _(words) if words else reason


def batch_note(batches: Sequence[int], prefill: int = 1) -> str:
    """How a run shared the model with other runs: its prefill's forward (`prefill`: the runs in
    it) — "Its prompt went through the model in one forward pass shared with 6 other runs (each
    adding its own prompt or its next token)." — and its decode steps (their batch sizes: 1 =
    alone) — "Decoded in batches of 2 to 3 runs (median 3) for all 47 of its decode steps: …",
    the smallest, largest and median size of the shared steps; "" when everything ran alone."""
    notes = []
    if prefill > 1:
        notes.append(ngettext("Its prompt went through the model in one forward pass shared with "
                              "{n} other run (adding its own prompt or its next token).",
                              "Its prompt went through the model in one forward pass shared with "
                              "{n} other runs (each adding its own prompt or its next token).",
                              prefill - 1).format(n=prefill - 1))
    shared = sorted(b for b in batches if b > 1)
    if shared:
        low, median, high = shared[0], shared[len(shared) // 2], shared[-1]
        size = (_("a batch of {n}").format(n=median) if low == high else
                _("batches of {low} to {high} runs (median {n})").format(low=low, high=high,
                                                                        n=median))
        text = (_("Decoded in {size} for all {steps} of its decode steps: each step was one "
                  "forward pass for every run in it, reading the weights once for all of them, "
                  "as a server batches its users.") if len(shared) == len(batches) else
                _("Decoded in {size} for {shared} of its {steps} decode steps: each of those "
                  "steps was one forward pass for every run in it, reading the weights once for "
                  "all of them, as a server batches its users."))
        notes.append(text.format(size=size, shared=len(shared), steps=len(batches)))
    return ("" if chinese() else " ").join(notes)
