"""Tabs that open where the user left them. A plain `st.tabs` is reset to its first tab whenever
the page is drawn differently above it (presentation mode on or off) or its labels change (another
language); here the tab's English name is kept in the session, and the tabs of each language are
a widget of their own that opens on it."""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from i18n import _, language


def kept_tabs(names: Sequence[str], key: str) -> Sequence:
    """`st.tabs` of `names` (English msgids, shown translated); the one chosen is kept under
    `key` in the session. Every tab's content is still drawn, as with a plain `st.tabs`."""
    labels = [_(name) for name in names]
    widget = f"{key}_{language()}"
    chosen = st.session_state.get(key)

    def remember() -> None:
        label = st.session_state.get(widget)
        if label in labels:
            st.session_state[key] = names[labels.index(label)]

    return st.tabs(labels, key=widget, on_change=remember,
                   default=labels[list(names).index(chosen)] if chosen in names else None)
