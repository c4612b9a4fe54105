"""The session's language: ?lang= in the address, else the browser's Accept-Language on the first
visit; the sidebar's (and, presenting, the top row's) switch changes it at any moment. Switching
reruns the page's script, never the model: every run, record and widget value stays (widgets
keep their keys; only their words change).

The address carries `lang` whenever it is not what the browser would pick by itself, so a reload,
a copied address and a share link open in the language they were sent in.
"""

from __future__ import annotations

import streamlit as st
from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

from charts.layout import font_stack
from i18n import DEFAULT, LANGUAGES, _, from_accept_language, set_resolver
from ui.keys import LANG
from ui.state import app_state

PARAM = "lang"


def browser_language() -> str:
    try:
        return from_accept_language(st.context.headers.get("Accept-Language"))
    except Exception:  # no browser (AppTest): English  # noqa: BLE001
        return DEFAULT


def start_language() -> str:
    """Before anything is drawn: the address's language when it names one that changed (a link,
    an edited address), else the session's, else the browser's; made this run's language."""
    view = app_state().view
    param = st.query_params.get(PARAM)
    if param in LANGUAGES and param != view.lang_param:
        st.session_state[LANG] = param
    view.lang_param = param
    if st.session_state.get(LANG) not in LANGUAGES:
        st.session_state[LANG] = browser_language()
    lang = st.session_state[LANG]
    if lang != DEFAULT:
        st.html(f"<style>{text_fonts(lang)}</style>")
    return lang


# Streamlit draws its text in "Source Sans", which has no Chinese; the containers of the page's
# words name the variant's CJK font after it, over Streamlit's own rules for those elements (icons
# and code inside them keep their own fonts: they set one).
TEXT = ('[data-testid="stApp"], [data-testid="stMarkdownContainer"], [data-testid="stCaptionContainer"], '
        '[data-testid="stWidgetLabel"], [data-testid="stSidebarNav"], [data-testid="stTooltipContent"], '
        '[data-testid="stMetricLabel"], [data-testid="stExpander"] summary, [data-testid="stTab"], '
        'h1, h2, h3, button, input, textarea, [data-baseweb="select"], [data-baseweb="popover"]')


def text_fonts(lang: str) -> str:
    return f"{TEXT} {{ font-family: {font_stack(lang)} !important; }}"


def session_language() -> str | None:
    """This script run's session's language (None outside a run: a background thread)."""
    if get_script_run_ctx(suppress_warning=True) is None:
        return None
    return st.session_state.get(LANG)


set_resolver(session_language)

PICK = "lang_pick"  # the switch's own key: a segmented control can be cleared, the language not


def _picked() -> None:
    if st.session_state.get(PICK) in LANGUAGES:
        st.session_state[LANG] = st.session_state[PICK]


def language_switch(where: st.delta_generator.DeltaGenerator | None = None) -> None:
    """The switch: each language named in its own words (a reader of only one of them finds it)."""
    st.session_state[PICK] = st.session_state[LANG]
    (where or st.sidebar).segmented_control(
        "Language · 語言 · 语言", list(LANGUAGES), key=PICK, format_func=LANGUAGES.get,
        on_change=_picked, label_visibility="collapsed",
        help=_("The whole app in this language; the model and your runs stay as they are."))


def address_language() -> dict[str, str]:
    """What the address and a share link carry: `lang` unless the browser picks it by itself."""
    lang = st.session_state.get(LANG, DEFAULT)
    return {} if lang == browser_language() and lang == DEFAULT else {PARAM: lang}


def write_language() -> None:
    """At the end of a run: the address names the session's language (or nothing, for English
    on an English browser)."""
    wanted = address_language().get(PARAM)
    if st.query_params.get(PARAM) != wanted:
        if wanted is None:
            del st.query_params[PARAM]
        else:
            st.query_params[PARAM] = wanted
    app_state().view.lang_param = wanted
