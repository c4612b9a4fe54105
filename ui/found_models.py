"""The model box's "Models on this machine": the GGUF files that Ollama, LM Studio, the Hugging
Face cache and the user's folders hold (engine/gguf/discover.py), each one choice away from the
model box, marked where it would not fit.

Local only. On a shared server (ui/guard.py `shared`: hosted, or bound beyond loopback) the list
would tell strangers what the operator's disk holds and the folder field would let them search
it, so neither is drawn and nothing is searched.
"""

from __future__ import annotations

import os

import streamlit as st

from charts.formatting import count, significant, size
from engine.gguf.discover import GB, FoundModel, find_models
from i18n import N_, _, ngettext
from ui.guard import shared
from ui.keys import FOUND_MODEL, MODEL_FOLDERS, MODEL_SOURCE
from ui.text import message

SOURCE_LABELS = {"ollama": "Ollama", "lmstudio": "LM Studio",
                 "huggingface": N_("Hugging Face cache"), "folder": N_("your folders")}


def parameters(n: int | None) -> str:
    """A parameter count as model names write it: '135M', '3.21B' (a test's tiny file: '576')."""
    if not n:
        return "–"
    if n < 1e6:
        return count(n)
    return significant(n / 1e9) + "B" if n >= 1e9 else significant(n / 1e6) + "M"


def fit_label(model: FoundModel) -> str:
    if model.fits:
        return _("fits")
    return _("needs {gb} GB more").format(gb=significant(max(model.shortfall, 1) / GB, 2, 1))


def found_label(model: FoundModel) -> str:
    """name · architecture · parameters · main type · size · fits (a ⚠ where it does not)."""
    parts = [model.name, model.architecture or "–", parameters(model.parameters),
             model.main_type or "–", size(model.file_bytes), fit_label(model)]
    return ("" if model.fits else "⚠ ") + " · ".join(parts)


def _folders() -> list[str]:
    text = str(st.session_state.get(MODEL_FOLDERS) or "")
    return [f.strip() for f in text.split(os.pathsep) if f.strip()]


def _choose() -> None:
    """The picked file becomes the model box's source, as if its path had been typed."""
    st.session_state[MODEL_SOURCE] = st.session_state.get(FOUND_MODEL) or ""


def sidebar_found_models() -> None:
    """The list and the folder field under the model box, on this machine's own server only."""
    if shared():
        return
    side = st.sidebar
    with side, st.spinner(_("Reading the GGUF files on this machine…")):
        found = find_models(_folders())
    usable = {m.path: m for m in found if m.error is None}
    broken = [m for m in found if m.error is not None]
    typed = str(st.session_state.get(MODEL_SOURCE) or "").strip()
    st.session_state[FOUND_MODEL] = typed if typed in usable else None  # follows the box
    side.selectbox(
        _("Models on this machine"), list(usable), key=FOUND_MODEL,
        format_func=lambda path: found_label(usable[path]), on_change=_choose,
        placeholder=(_("Pick a GGUF file found here") if usable else
                     _("No GGUF files found here")), disabled=not usable,
        help=_("GGUF files already on this machine: Ollama's models, LM Studio's folders, the "
               "Hugging Face cache, the folders below and `$INFERENCE_EXPLORER_MODELS`. Each shows "
               "its architecture, parameters, main weight type, file size, and whether it fits "
               "in the memory available at the default context (⚠: how much more it needs). "
               "Picking one puts its path in the box above."))
    chosen = usable.get(typed)
    if chosen is not None:  # the whole line again: the box is too narrow to show its size and fit
        side.caption(message(found_label(chosen)) + "  \n" + _("{source}: {types}").format(
            source=_(SOURCE_LABELS[chosen.source]), types=message(chosen.type_mix)))
    with side.expander(_("Folders to search")):
        st.text_input(_("Also search these folders"), key=MODEL_FOLDERS,
                      placeholder="~/models",
                      help=_("Folders holding .gguf files (searched a few levels down), separated "
                             "by {sep}.").format(sep=os.pathsep))
        if broken:
            st.caption(ngettext("{n} GGUF file could not be read:",
                                "{n} GGUF files could not be read:", len(broken))
                       .format(n=len(broken)))
            for model in broken:
                st.caption(message(_("{name}: {reason}").format(name=model.name,
                                                                reason=model.error)))
