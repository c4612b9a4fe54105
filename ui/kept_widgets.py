"""Choices that stay where the user left them. A plain `st.tabs` is reset to its first tab
whenever the page is drawn differently above it (presentation mode on or off), and a widget whose
options are shown translated loses its choice in another language (the browser keeps the label
shown, which the new language does not have: a radio then shows nothing chosen). Here the choice
is kept in the session by id, and each language has a widget of its own that opens on it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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


def kept_radio(label: str, options: Sequence[Any], *, key: str,
               format_func: Callable[[Any], str], **kwargs: Any) -> Any:
    """`st.radio` of `options` shown through `format_func`; the option chosen is kept under `key`
    (by value: the same in every language). In a form, the value kept is the one submitted."""
    return _kept(st.radio, label, options, key, format_func, kwargs)


def kept_selectbox(label: str, options: Sequence[Any], *, key: str,
                   format_func: Callable[[Any], str], **kwargs: Any) -> Any:
    """`st.selectbox`, as `kept_radio`."""
    return _kept(st.selectbox, label, options, key, format_func, kwargs)


def _kept(widget: Callable[..., Any], label: str, options: Sequence[Any], key: str,
          format_func: Callable[[Any], str], kwargs: dict[str, Any]) -> Any:
    kept = st.session_state.get(key)
    value = widget(label, options, index=list(options).index(kept) if kept in options else 0,
                   format_func=format_func, key=f"{key}_{language()}", **kwargs)
    st.session_state[key] = value
    return value
