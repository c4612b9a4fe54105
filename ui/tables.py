"""Tables: a data grid on screen, an HTML table in presentation mode.

Streamlit's data grid draws its cells on a canvas in a font of 0.875 rem (19 px at presentation
mode's 22 px root) that no style sheet reaches; an HTML table's cells are text that
assets/present.css sets to 22 px like every other text, and that wraps instead of being cut. So
every page's table goes through `show_table`: the grid (sortable, scrollable) normally, and when
presenting the same values, formatted as the grid's column configuration says, as `st.table`.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import pandas as pd
import streamlit as st
from pandas.io.formats.style import Styler

from i18n import _
from ui.present import presenting
from ui.text import plain

ROW_PX = 48  # an HTML table row at 22 px
MAX_ROWS = 14  # a longer table scrolls (its header stays), as the grid does


def cell_text(value: Any, fmt: str | None = None, kind: str | None = None,
              link_text: str | None = None) -> str:
    """One cell as the grid would show it (`fmt`: a column's printf format, "percent" or
    "localized"), as markdown that shows the text as itself."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if kind == "link":
        return f"[{plain(link_text or str(value))}]({value})"
    if isinstance(value, bool):
        return _("yes") if value else _("no")
    if isinstance(value, numbers.Number):
        if fmt == "percent":  # as the grid: at most two decimals, no trailing zero
            text = f"{value * 100:.2f}".rstrip("0").rstrip(".") + "%"
        elif fmt == "localized":
            text = f"{value:,}"
        elif fmt:
            text = fmt % value
        elif isinstance(value, numbers.Integral):
            text = str(value)
        else:
            text = f"{value:.4f}".rstrip("0").rstrip(".")
        return plain(text)
    return plain(str(value))


def html_table(data: Any, column_config: dict[str, Any] | None = None,
               hide_index: bool | None = None, height: int | None = None) -> Any:
    """`data` as an HTML table: each column's label and format from `column_config` (what
    st.dataframe takes); the values kept as they are (a test reads them), the text each cell
    shows set through a Styler (Streamlit shows a table's header names and cells as markdown).
    `data` may be a Styler already (its colours are kept; its columns keep their names)."""
    given = data if isinstance(data, Styler) else None
    data = given.data if given is not None else pd.DataFrame(data)
    config = column_config or {}
    labels, formats = {}, {}
    for name in data.columns:
        spec = config.get(name)
        if isinstance(spec, str):
            spec = {"label": spec}
        spec = spec or {}
        kind = (spec.get("type_config") or {}).get("type")
        fmt = (spec.get("type_config") or {}).get("format")
        link = (spec.get("type_config") or {}).get("display_text")
        formats[name] = (lambda v, f=fmt, k=kind, t=link: cell_text(v, f, k, t))
        if spec.get("label"):
            labels[name] = spec["label"]
    if given is not None:
        styler = given.format(formats)
    else:  # the header shows the column's name (Streamlit reads no Styler's labels)
        data = data.rename(columns=labels)
        styler = data.style.format({labels.get(n, n): f for n, f in formats.items()})
    rows = len(data)
    tall = height or (ROW_PX * (MAX_ROWS + 1) if rows > MAX_ROWS else None)
    return st.table(styler, hide_index=hide_index, height=tall or "content")


def show_table(data: Any, *, column_config: dict[str, Any] | None = None,
               hide_index: bool | None = None, height: int | None = None,
               html: bool = False, **kwargs: Any) -> Any:
    """A table: `st.dataframe(data, ...)`, or presenting (or `html`: a table meant to be read
    whole, whose columns wrap) an HTML table of the same values and formats."""
    if presenting() or html:
        return html_table(data, column_config, hide_index, height)
    extra = {"height": height} if height is not None else {}
    return st.dataframe(data, column_config=column_config, hide_index=hide_index, **extra,
                        **kwargs)
