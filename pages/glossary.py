"""Glossary: every technical term in English, 繁體中文 and 简体中文, as the app writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import streamlit as st

from i18n import _, language
from ui.tables import show_table

GLOSSARY = json.loads((Path(__file__).parents[1] / "assets" / "glossary.json").read_text())
NOTE = {"en": "note-en", "zh-Hant": "note-zh-Hant", "zh-Hans": "note-zh-Hans"}


def terms(query: str) -> pd.DataFrame:
    """The glossary's rows that mention `query` in any of its columns (all rows for none)."""
    note = NOTE[language()]
    rows = [{_("English"): t["en"], "繁體中文": t["zh-Hant"], "简体中文": t["zh-Hans"],
             _("Meaning"): t[note], _("Page"): _(t["page"])} for t in GLOSSARY["terms"]]
    frame = pd.DataFrame(rows)
    if query.strip():
        wanted = query.strip().lower()
        frame = frame[frame.apply(lambda row: any(wanted in str(v).lower() for v in row), axis=1)]
    return frame


def page() -> None:
    st.title(_("Glossary"))
    st.caption(_("Every technical term of this app in its three forms. The Chinese follows the "
                 "article this app is built around: its own word where it has one (推論, 量化, 串流, "
                 "詞彙表), the English word where it keeps it (token, Prefill, Decode, KV cache). "
                 "Simplified is generated from Traditional with OpenCC's Taiwan → Mainland "
                 "phrase conversion, then reviewed."))
    query = st.text_input(_("Find a term"), key="glossary_query", max_chars=60,
                          placeholder=_("e.g. cache, 量化, 推理"))
    frame = terms(query)
    show_table(frame, hide_index=True, width="stretch")
    st.caption(_("{shown} of {total} terms.").format(shown=len(frame), total=len(GLOSSARY["terms"])))


page()
