"""The sidebar's generation settings as one table — each setting's widget key, kind, range and
default — read by the sidebar's widgets (app.py) and by share links (ui/links.py), so a link can
hold exactly what the sidebar can set."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import streamlit as st

from engine import Trace
from i18n import N_, _
from ui.config import Limits, config


@dataclass(frozen=True, slots=True)
class Setting:
    """A sidebar generation setting: its widget's key, kind and range — the same for the widget
    (app.py sidebar_settings) and for a link's value."""

    key: str
    kind: type  # int, float or bool
    default: int | float | bool
    low: int | float = 0
    high: int | float = 1
    step: int | float = 1

    def widget(self) -> dict[str, Any]:
        """Keyword arguments of the sidebar widget (no value: it comes from session state)."""
        if self.kind is bool:
            return {"key": self.key}
        return {"min_value": self.low, "max_value": self.high, "step": self.step, "key": self.key}

    def parse(self, text: str) -> int | float | bool:
        """The value a link's text stands for; ValueError saying what is allowed."""
        if self.kind is bool:
            if text not in ("0", "1"):
                raise ValueError(_("must be 0 or 1"))
            return text == "1"
        low, high = f"{self.low:g}", f"{self.high:g}"
        if self.kind is int:
            if not re.fullmatch(r"\d{1,10}", text) or not self.low <= int(text) <= self.high:
                raise ValueError(_("must be a whole number from {low} to {high}").format(
                    low=low, high=high))
            return int(text)
        if not re.fullmatch(r"\d{1,3}(\.\d{1,6})?", text) or not self.low <= float(text) <= self.high:
            raise ValueError(_("must be a number from {low} to {high}").format(low=low, high=high))
        steps = float(text) / self.step
        if abs(steps - round(steps)) > 1e-6:
            raise ValueError(_("must be a multiple of {step}").format(step=f"{self.step:g}"))
        return round(round(steps) * self.step, 6)

    def text(self, value: int | float | bool) -> str:
        return str(int(value)) if self.kind is not float else f"{value:g}"


# Each weights variant's label (`N_`: shown through `_`, as `weights_label` does).
WEIGHTS_LABELS = {"fp32": "fp32 (float32)", "fp16": "fp16 (float16)", "bf16": "bf16 (bfloat16)",
                  "int8": N_("int8 (per-row scale)"), "q8_0": N_("q8_0 (8-bit, scale per 32)"),
                  "q4_0": N_("q4_0 (4-bit, scale per 32)"),
                  "q4_1": N_("q4_1 (4-bit, scale + min per 32)"),
                  "q6_k": N_("q6_k (GGML Q6_K, llama.cpp's types)"),
                  "q4_k_m": N_("q4_k_m (llama.cpp's Q4_K_M mix)"),
                  "q4_k": N_("q4_k (GGML Q4_K, llama.cpp's types)")}
DECODER_HELP = N_("The prefill always runs in PyTorch (transformers). The decode steps run in the "
                  "hand-written C step (engine/kernels/native.py) wherever it can: float32 and "
                  "integer weights, KV cache on. It records the same attention rows, hidden "
                  "states and top-k as PyTorch (tests check them equal); each trace says which "
                  "one ran. On a shared server with batching on (the hosted demo), the decode "
                  "steps of every visitor's run go into one batch instead: one forward per step "
                  "for all of them.")


def weights_label(weights: str) -> str:
    """A weights variant's label in the session's language (the variant itself if unknown)."""
    label = WEIGHTS_LABELS.get(weights)
    return _(label) if label is not None else weights


def decoder_line(problem: str | None, kv_cache: bool, file_blocks: bool = False,
                 batched: bool = False) -> str:
    """What will run the decode steps: the server's batch (`batched`: ui/batching.py seats a
    run with the cache on), "native C step" (`file_blocks`: on a GGUF file's own blocks, which
    it then reads rather than the float32 copy), or "torch eager — <reason>" with the reason a
    Run would record (`problem`: why the native step cannot run these weights)."""
    from engine.runner import KV_OFF_REASON

    if batched and kv_cache:
        return _("server's batch (continuous batching)")
    if problem is None and not kv_cache:
        problem = KV_OFF_REASON
    if problem is not None:
        return _("torch eager — {reason}").format(reason=_(problem) if problem else problem)
    return _("native C step on the file's GGML blocks") if file_blocks else _("native C step")


def setting_table(limits: Limits) -> dict[str, Setting]:
    """The sidebar's generation settings by their name in a link."""
    return {
        "new_tokens": Setting("gen_new_tokens", int, min(48, limits.new_tokens), 1, limits.new_tokens),
        "temperature": Setting("gen_temperature", float, 0.0, 0.0, 2.0, 0.05),
        "top_k": Setting("gen_top_k", int, 0, 0, 1000),
        "top_p": Setting("gen_top_p", float, 1.0, 0.05, 1.0, 0.05),
        "seed": Setting("gen_seed", int, 0, 0, 2**31 - 1),
        "chat": Setting("gen_chat", bool, True),
        "kv_cache": Setting("gen_kv_cache", bool, True),
        "attention": Setting("gen_attention", bool, True),
    }


def preset_settings() -> dict[str, Setting]:
    """Each sidebar setting's default, unless a share link (or the user) set it already."""
    table = setting_table(config().limits)
    for setting in table.values():
        st.session_state.setdefault(setting.key, setting.default)
    return table


def settings_of(trace: Trace) -> dict[str, int | float | bool]:
    """A run's settings under the table's names (what its sidebar was set to)."""
    s = trace.settings
    return {"new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_k": s.top_k,
            "top_p": s.top_p, "seed": s.seed if s.seed is not None else 0,
            "chat": s.chat_template, "kv_cache": s.kv_cache, "attention": s.record_attention}
