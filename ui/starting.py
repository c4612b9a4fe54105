"""The page a visitor gets while the server starts: at once, never blank.

A server that has just started (a Space waking from sleep) spends its first seconds importing
torch, transformers and the pages' modules, then loading and warming the model, in its start-up
thread (ui/startup.py); a visitor's script run may not import meanwhile (two threads importing
one module can hand one of them a half-made module). So this page imports nothing of the app but
Streamlit, the standard library and the word catalogs: it draws the app's name, what the server
is doing and for how long, and — on the Generate page — the prompt box and its Generate button,
so the visitor can type and press while the server works. Then this same script run waits for
the work to end and returns, the page is cleared and app.py draws the real one; a prompt pressed
here is handed to the Generate page (`PENDING`), which runs it at once.

A click while this page waits (typing, Generate) starts a new script run, as any click does: it
finds the server still starting and draws this page again, with what was pressed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urlsplit

import streamlit as st

from i18n import LANGUAGES, from_accept_language, translations
from ui.config import MAX_PROMPT_CHARS
from ui.keys import PROMPT

APP_NAME = "Inference Explorer"  # a name, the same in every language
PENDING = "starting_pending"  # a prompt pressed while the server started: Generate runs it
TYPED = "starting_prompt"  # the prompt box of this page (its own key: both pages draw in one run)
POLL_S = 0.5
GENERATE_PATHS = ("", "generate")  # the Generate page's address: the app's default page


def _words() -> Callable[[str], str]:
    """This visitor's language (the address's, else the browser's) without the app's session
    state, which the start-up thread may be importing."""
    lang = st.query_params.get("lang")
    if lang not in LANGUAGES:
        try:
            lang = from_accept_language(st.context.headers.get("Accept-Language"))
        except Exception:  # no browser behind this run  # noqa: BLE001
            lang = "en"
    return translations(lang).gettext


def _on_generate_page() -> bool:
    try:
        path = urlsplit(st.context.url or "").path
    except Exception:  # noqa: BLE001 — no browser behind this run: the default page
        path = ""
    return path.strip("/").rsplit("/", 1)[-1] in GENERATE_PATHS


def draw() -> tuple:
    """The page (its app name, an empty status line, on Generate the prompt box): (the page's
    placeholder, the status line's, the words' function)."""
    _ = _words()
    st.set_page_config(page_title=APP_NAME, page_icon="🔎", layout="wide")
    page = st.empty()
    with page.container():
        st.title(APP_NAME)
        status = st.empty()
        if _on_generate_page():
            with st.form("starting_form", border=False):
                st.text_area(_("Prompt"), key=TYPED, height=100, max_chars=MAX_PROMPT_CHARS,
                             placeholder=_("Ask the model something… (Ctrl+Enter to generate)"))
                pressed = st.form_submit_button(_("Generate"), type="primary",
                                                icon=":material/play_arrow:")
            if pressed and (st.session_state.get(TYPED) or "").strip():
                st.session_state[PENDING] = st.session_state[TYPED]
            if st.session_state.get(PENDING):
                st.info(_("Your prompt runs as soon as the model is ready; this page fills in "
                          "by itself."), icon=":material/schedule:")
    return page, status, _


def starting_page(starting: Callable[[], bool], progress: Callable[[], tuple[str, float]]) -> None:
    """Draw the starting page, wait while `starting()` (`progress()`: what the start-up work
    does, seconds since it began), then clear it and hand a pressed prompt to the Generate
    page."""
    page, status, _ = draw()
    doing = {"code": _("loading the app's code (torch, transformers)"),
             "model": _("loading the model"),
             "warm-up": _("warming the model up with one short run")}
    while starting():
        phase, seconds = progress()
        status.info(_("The server is starting (a hosted demo wakes up this way): {doing} — {s} s "
                      "so far. The page fills in by itself; you can type your prompt meanwhile.")
                    .format(doing=doing.get(phase, phase), s=f"{seconds:.0f}"),
                    icon=":material/hourglass:")
        time.sleep(POLL_S)
    page.empty()
    if st.session_state.get(PENDING):
        st.session_state[PROMPT] = st.session_state[PENDING]
