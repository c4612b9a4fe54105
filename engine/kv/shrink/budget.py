"""Which way to shrink the KV cache, and by how much: a method and its budget.

A budget is read the same way by the CLI, the page and a saved result: `full` (the method
switched off: the unmodified model), a whole number, or a percentage. What the number counts
depends on the method:

- `latent`: the latent's rank per token and layer, of at most 2 · KV heads · head_dim (the
  full rank: keys and values side by side); a percentage is of that full rank.
- `topk`, `indexer`: keys each query head attends to at a decode step; a percentage is of the
  keys cached at that step.
- `h2o`, `window`: tokens the cache holds after every step; `snapkv`, `knorm`: tokens of the
  prompt the cache keeps after the prefill (the new tokens are added, as kvpress's presses do);
  a percentage is of the prompt's tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from i18n import N_, _

from ...errors import InputError

# method → what it is, in a few words (translated where shown)
METHODS = {
    "latent": N_("latent cache (MLA-style, low rank)"),
    "topk": N_("sparse attention, exact top-k"),
    "indexer": N_("sparse attention, cheap indexer"),
    "h2o": N_("eviction: H2O (heavy hitters)"),
    "snapkv": N_("eviction: SnapKV (observation window)"),
    "window": N_("eviction: StreamingLLM (sinks + window)"),
    "knorm": N_("eviction: key norm"),
}
SHORT_NAMES = {"latent": N_("latent"), "topk": "top-k", "indexer": N_("indexer"), "h2o": "H2O",
               "snapkv": "SnapKV", "window": "StreamingLLM", "knorm": N_("key norm")}
TOKEN_METHODS = ("h2o", "window", "snapkv", "knorm")  # a budget of cached tokens
SPARSE_METHODS = ("topk", "indexer")  # a budget of keys attended per step
PROMPT_METHODS = ("snapkv", "knorm")  # compress the prompt once, after the prefill
SINKS = 4  # StreamingLLM's first tokens kept (kvpress's StreamingLLMPress default)


@dataclass(frozen=True, slots=True)
class Budget:
    """`full` (value None), a whole number, or a percentage (percent=True, 0 < value ≤ 100)."""

    value: float | None
    percent: bool = False

    @property
    def full(self) -> bool:
        return self.value is None

    def text(self) -> str:
        if self.value is None:
            return "full"
        return f"{self.value:g}%" if self.percent else str(int(self.value))

    def of(self, whole: int) -> int:
        """The budget as a count, given what a percentage is of (at least 1, at most `whole`)."""
        if self.value is None:
            return whole
        count = math.ceil(self.value / 100 * whole) if self.percent else int(self.value)
        return max(1, min(whole, count))


def parse_budget(text: str) -> Budget:
    """'full', '64' or '25%' → Budget; anything else an InputError of one line."""
    raw = str(text).strip().lower()
    if raw == "full":
        return Budget(None)
    try:
        if raw.endswith("%"):
            value = float(raw[:-1])
            if not (0 < value <= 100) or not math.isfinite(value):
                raise ValueError
            return Budget(value, percent=True)
        value = int(raw)
        if value < 1:
            raise ValueError
        return Budget(float(value))
    except ValueError:
        raise InputError(_("budget must be 'full', a whole number ≥ 1 or a percentage such as "
                           "25%, not {text!r}").format(text=str(text)[:40])) from None


@dataclass(frozen=True, slots=True)
class Shrink:
    """A method and its budget (see the module's docstring)."""

    method: str
    budget: Budget

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(_("unknown method {method!r}: one of {methods}").format(
                method=str(self.method)[:40], methods=", ".join(METHODS)))

    @property
    def label(self) -> str:
        return f"{self.method} {self.budget.text()}"


def described_budget(budget: str) -> str:
    return _("full") if budget == "full" else budget


def described(method: str, budget: str, short: bool = False) -> str:
    """A method at a budget in the reader's language: "eviction: H2O (heavy hitters) · 25%", or
    `short`: "H2O · 25%"."""
    name = _(SHORT_NAMES[method]) if short else _(METHODS[method])
    return f"{name} · {described_budget(budget)}"
