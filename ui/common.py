"""Page parts several pages share: the no-trace notice, charts, and the disturbance warning."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import streamlit as st

from charts.layout import legend_above, with_fonts
from charts.present import presentation
from engine import Trace
from engine.timing.disturbance import RULE, assess
from i18n import _, chinese
from ui.config import config
from ui.present import chart_config, chart_format, figure_title, presenting
from ui.state import app_state, current_trace


def no_trace_notice(then: str = "") -> None:
    """Say how to get a trace, instead of an empty screen."""
    notice = _("No trace yet. Generate one, open an example run (no model needed) or upload a "
               "trace file, on the Generate page.")
    st.info(notice + (("" if chinese() else " ") + then if then else ""))
    st.page_link("pages/generate.py", label=_("Go to Generate"), icon=":material/play_arrow:")


def require_trace() -> Trace:
    """The session's trace; without one, the notice and the end of this page's run."""
    trace = current_trace()
    if trace is None:
        no_trace_notice()
        st.stop()
    return trace


def disturbance_warning(trace: Trace) -> None:
    """A plain warning when other work on the machine delayed this run's steps, with the rule."""
    result = assess(trace)
    warning = result.warning(shared=config().hosted)
    if warning is None:
        return
    st.warning(warning, icon=":material/speed:")
    with st.expander(_("How a step is marked delayed")):
        st.markdown(_(RULE))


def show_chart(figure: go.Figure, *, where: Any = None, name: str = "",
               config: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """Draw a plotly chart; every page's charts go through here. In presentation mode the figure
    is drawn restyled for a projector (charts/present.py; the caller's figure is unchanged), a top
    legend grows upwards, never over the plot (charts/layout.py), and
    the toolbar's camera downloads the session's chosen format (png or svg) under a file name
    from the page and `name` (default: the chart's title, else its key). `where`: a placeholder
    or container to draw into (default: here). Other arguments go to `st.plotly_chart`."""
    kwargs.setdefault("width", "stretch")
    label = name or figure_title(figure) or str(kwargs.get("key") or "")
    shown = legend_above(presentation(figure) if presenting() else figure)
    if chinese():  # the figure names the variant's CJK font after the Latin one
        shown = with_fonts(shown)
    target = st if where is None else where
    return target.plotly_chart(shown, config=chart_config(
        chart_format(), app_state().view.page_title, label, config), **kwargs)
