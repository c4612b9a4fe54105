"""Presentation mode and the chart-download format: per-session view preferences.

Presentation mode is this session's `present` toggle, mirrored in the URL as `?present=1` so a
teacher can open a link straight into it. Nothing here is process-wide: the chart theme is applied
per figure (charts/present.py) and the CSS is sent to this session only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import streamlit as st

from i18n import _
from ui.keys import CHART_FORMAT, PRESENT
from ui.language import language_switch
from ui.state import app_state

FORMATS = ("png", "svg")
CSS = Path(__file__).resolve().parents[1] / "assets" / "present.css"
MAX_NAME = 60

ChartFormat = Literal["png", "svg"]


def presenting() -> bool:
    return bool(st.session_state.get(PRESENT, False))


def chart_format() -> ChartFormat:
    fmt = st.session_state.get(CHART_FORMAT)
    return fmt if fmt in FORMATS else "png"


def set_page_title(title: str) -> None:
    app_state().view.page_title = title


def _slug(text: str) -> str:
    text = re.sub(r"<[^>]+>", " ", text)  # plotly titles may hold <b>, <br>
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:MAX_NAME].strip("-")


def figure_title(figure: Any) -> str:
    title = getattr(getattr(figure, "layout", None), "title", None)
    return (getattr(title, "text", None) or "") if title is not None else ""


def chart_config(fmt: ChartFormat, page: str, name: str = "",
                 config: dict[str, Any] | None = None) -> dict[str, Any]:
    """plotly's config for one chart: the toolbar's camera downloads `fmt` (PNG at twice the
    size on screen, so it stays sharp on a slide) under a file name made of the page and `name`
    (the chart's title or key); no plotly logo. `config` (the caller's own) is kept."""
    stem = "-".join(part for part in (_slug(page), _slug(name)) if part) or "chart"
    options = {"format": fmt, "filename": stem, "scale": 2 if fmt == "png" else 1}
    own = dict(config or {})
    return {**own, "displaylogo": False,
            "toImageButtonOptions": {**options, **own.get("toImageButtonOptions", {})}}


def _follow_url() -> None:
    """Opening (or editing) the URL with ?present=1 turns the mode on. Leaving it out later does
    not turn it off: switching pages can drop query parameters; the toggle and the Exit button do."""
    param, view = st.query_params.get(PRESENT) == "1", app_state().view
    if param and view.present_param is not True:
        st.session_state[PRESENT] = True
    view.present_param = param


def _exit() -> None:
    st.session_state[PRESENT] = False


def start_presentation() -> None:
    """Before anything else is drawn: follow the URL and, when presenting, send the projector CSS
    (no sidebar, no Streamlit chrome, large type)."""
    _follow_url()
    if presenting():
        st.html(f"<style>{CSS.read_text()}</style>")


def navigation_position() -> Literal["sidebar", "hidden"]:
    """Where st.navigation draws the page list: presenting, nowhere (present_navigation draws it)."""
    return "hidden" if presenting() else "sidebar"


def present_navigation(pages: list[Any]) -> None:
    """Presenting: every page as a link in one row at the top of the page, wrapping onto a
    second line on a narrow screen, then the language switch and the Exit button. Streamlit's
    own top bar would hide the pages that do not fit one line behind a "N more" menu (at 22 px,
    1 of 12 at 1920 px wide)."""
    if not presenting():
        return
    with st.container(horizontal=True, key="present_nav", vertical_alignment="center"):
        for entry in pages:
            st.page_link(entry, label=entry.title, icon=entry.icon)
        language_switch(st)
        st.button(_("Exit presentation"), key="present_exit", icon=":material/close_fullscreen:",
                  on_click=_exit, help=_("Back to the normal view, with the sidebar (also: remove "
                                         "?present=1 from the address and reload)."))


def sidebar_presentation() -> None:
    """The sidebar's View section; keeps ?present=1 in the URL in step with the toggle (other
    query parameters, like the session token `s`, are left as they are)."""
    side = st.sidebar
    side.header(_("View"))
    side.toggle(_("Presentation mode"), key=PRESENT, help=_(
        "For a projector: hides this sidebar and "
        "Streamlit's menus, enlarges the text and the charts' fonts, thickens lines and "
        "darkens colours. A link from “Share this view” opens in this mode (the address "
        "bar's own link carries your session: share that one only with yourself)."))
    side.radio(_("Chart downloads"), FORMATS, key=CHART_FORMAT, horizontal=True,
               help=_("What the camera icon in every chart's toolbar saves: png (at twice the size "
                      "on screen) or svg (vector, for slides)."))
    if presenting():
        if st.query_params.get(PRESENT) != "1":
            st.query_params[PRESENT] = "1"
    elif PRESENT in st.query_params:
        del st.query_params[PRESENT]
    app_state().view.present_param = presenting()
