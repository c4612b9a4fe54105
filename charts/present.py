"""Presentation mode's chart theme: a figure restyled for a projector at the back of a room.

`presentation(fig)` returns a restyled copy and never touches `fig` (pages keep figures in
session memos and draw them again in normal mode). It is a pure function of the figure, not a
plotly template: `pio.templates.default` is process-wide, and one visitor presenting must not
restyle every other visitor's charts.

What changes, and why:
- every font ≥ MIN_FONT px (ticks, axis and colorbar titles, legend, annotations, hover labels,
  sliders and buttons, text traces), set explicitly on each part: the Streamlit theme sets its own
  sizes on axes and legends, so a larger `layout.font` alone would not reach them;
- black text, darker gridlines, lines LINE_SCALE× thicker (at least MIN_LINE px) and markers
  MARKER_SCALE× larger;
- every colour of the app's palette swapped for a darker, more saturated one of the same hue
  (PROJECTOR): a washed-out projector loses light tints first. The map is one-to-one, so a colour
  still means one thing (prefill stays red, decode blue, the KV cache green, head 3 its colour);
- margins and title standoffs grown with the fonts, so axis titles clear the larger tick labels;
  a y title longer than its plot's height goes on several lines.
"""

from __future__ import annotations

import re
import textwrap
import unicodedata
from typing import Any

import plotly.graph_objects as go

MIN_FONT = 22  # px: the smallest text presentation mode draws in a chart (assets/present.css: the page's)
BASE_FONT = 22  # px: text with no size of its own (annotations, legend entries, labels)
TICK_FONT = 22
TITLE_FONT = 22  # axis and colorbar titles
CHART_TITLE_FONT = 24
LINE_SCALE, MIN_LINE = 1.5, 3.0
MARKER_SCALE = 1.4
TEXT = "#000000"
GRID = "#b0b0b0"
SLIDER_SHIFT = 0.1  # of the plot's width: room for larger Play/Pause buttons left of a slider
EXTRA_HEIGHT = 60  # px: room for the larger tick labels, so the plot area itself does not shrink
DEFAULT_HEIGHT = 450  # px: plotly's height for a figure that sets none
X_AXIS_ROOM = 2.5 * TICK_FONT + TITLE_FONT  # px under the plot: x tick labels and title
CHAR_WIDTH = 0.55  # of the font size: a generous mean width of a character (proportional font)
WIDE_CHAR_WIDTH = 1.0  # of the font size: a full-width character (Chinese, full-width punctuation)
# Chinese line breaking: a line never starts with closing punctuation, nor ends with an opening one
NO_LINE_START = frozenset("，。、；：！？）」』》〉…％")
NO_LINE_END = frozenset("（「『《〈")

# The app's palette (charts/live.py, timing.py, kvcache.py, attention.py, embeddings.py) and its
# projector equivalent: same hue, contrast against white ≥ 4.5:1 for every colour that marks a
# line, a bar or a point (tests/test_present_chart.py checks), fills and backgrounds a little
# darker so they stay visible.
PROJECTOR = {
    "#1f77b4": "#0050b5",  # decode, GQA, neighbours, head 0
    "#ff7f0e": "#b35000",  # int8 cache, head 1
    "#e6550d": "#a63603",  # run B on Compare runs
    "#2ca02c": "#1a7a1a",  # KV cache, MLA, window + sinks, head 2
    "#d62728": "#c0001a",  # prefill, MHA, int4, prompt tokens, head 3
    "#9467bd": "#6a3d9a",  # compiled, window, head 4
    "#8c564b": "#6b3a2e",
    "#e377c2": "#b0006e",
    "#7f7f7f": "#555555",  # delayed steps
    "#bcbd22": "#6b6d00",
    "#17becf": "#00737f",
    "#637939": "#4e6124",
    "#8c6d31": "#6f5416",
    "#444444": "#222222",  # the full cache
    "#999999": "#666666",  # tokenize, slot borders
    "#808080": "#5a5a5a",  # "grey": the memory-bound line
    "#9ecae1": "#5a8fc2",  # top-k tokens not chosen
    "#c7c7c7": "#9c9c9c",  # vocabulary sample (background points)
    "#d9d9d9": "#c4c4c4",  # masked (future) cells
    "#e6e6e6": "#d0d0d0",  # unused cache slots
    "#7b4173": "#5c2a56",  # native kernel; a request on the Serving page (REQUEST_COLORS)
    "#6b6ecf": "#3b3eac",  # batch size (Serving)
    "#bdbdbd": "#8f8f8f",  # waiting in the queue (Serving's Gantt)
}
_NAMED = {"grey": "#808080", "gray": "#808080"}


def _hex(value: str) -> str:
    """'#999' → '#999999', 'grey' → '#808080'; lower case; anything else unchanged."""
    v = _NAMED.get(value.strip().lower(), value.strip().lower())
    if len(v) == 4 and v.startswith("#"):
        v = "#" + "".join(c * 2 for c in v[1:])
    return v


def projector_color(value: Any) -> Any:
    """The projector equivalent of one colour value; colours outside the palette stay as they are."""
    if isinstance(value, str):
        return PROJECTOR.get(_hex(value), value)
    return value


def _recolor(node: Any, colour_key: bool = False) -> Any:
    """The palette colours in a figure's JSON, swapped, as a sparse update: only what changes
    (values under a key naming a colour: `color`, `bgcolor`, `plot_bgcolor`, …; colorscales
    excepted), `None` where nothing does. Arrays stay untouched in the figure it is applied to."""
    if isinstance(node, dict):
        changed = {k: _recolor(v, "color" in k.lower()) for k, v in node.items() if k != "colorscale"}
        changed = {k: v for k, v in changed.items() if v is not None}
        return changed or None
    if isinstance(node, (list, tuple)):
        if any(isinstance(v, dict) for v in node):  # traces, annotations, frames: one update each
            updates = [_recolor(v, colour_key) or {} for v in node]
            return updates if any(updates) else None
        if colour_key:
            swapped = [projector_color(v) for v in node]
            return swapped if swapped != list(node) else None
        return None
    if colour_key and isinstance(node, str) and projector_color(node) != node:
        return projector_color(node)
    return None


def _apply_colours(fig: go.Figure, source: go.Figure) -> None:
    update = _recolor(source.to_plotly_json()) or {}
    for trace, change in zip(fig.data, update.get("data") or []):
        trace.update(change)
    fig.layout.update(update.get("layout") or {})
    for frame, change in zip(fig.frames, update.get("frames") or []):
        for trace, data_change in zip(frame.data, change.get("data") or []):
            trace.update(data_change)
        frame.layout.update(change.get("layout") or {})


def _larger(size: Any, floor: float) -> float:
    return max(float(size) * 1.3, floor) if isinstance(size, (int, float)) else floor


def _font(font: Any, size: float) -> dict[str, Any]:
    """A font at least `size` px (a size already larger is kept), in black unless it has a colour."""
    own = font.to_plotly_json() if hasattr(font, "to_plotly_json") else dict(font or {})
    return {**own, "size": max(float(own.get("size") or 0), size), "color": own.get("color") or TEXT}


def _char_width(char: str) -> float:
    return WIDE_CHAR_WIDTH if unicodedata.east_asian_width(char) in ("W", "F") else CHAR_WIDTH


def _title_width(text: str) -> float:
    """`text`'s width in px at TITLE_FONT, a Chinese character counting as a whole em."""
    return sum(_char_width(c) for c in text) * TITLE_FONT


def _wide_lines(text: str, room_px: float) -> list[str]:
    """`text` holding full-width characters, on lines of at most `room_px` (a word longer than
    that on a line of its own): a line may break at a space or between two Chinese characters,
    never inside a Latin word or a number, nor before closing punctuation or after opening."""
    pieces: list[tuple[str, bool]] = []  # (piece, a space before it)
    for found in re.finditer(r"(\s*)(\S)", text):
        space, char = bool(found.group(1)), found.group(2)
        wide = _char_width(char) == WIDE_CHAR_WIDTH
        if pieces and not space and (char in NO_LINE_START or pieces[-1][0][-1] in NO_LINE_END
                                     or not (wide or _char_width(pieces[-1][0][-1]) == WIDE_CHAR_WIDTH)):
            pieces[-1] = (pieces[-1][0] + char, pieces[-1][1])  # no break here
        else:
            pieces.append((char, space))
    lines: list[str] = []
    line = ""
    for piece, space in pieces:
        longer = line + (" " if space and line else "") + piece
        if line and _title_width(longer) > room_px:
            lines.append(line)
            line = piece
        else:
            line = longer
    return [*lines, line] if line else lines


def _wrapped(text: str, room_px: float) -> str:
    """An axis title on as many lines as it needs (split at spaces; a Chinese one also between
    its characters) when one line at TITLE_FONT would be longer than `room_px`: plotly draws a
    too-long title past the figure's edge."""
    if not text or "<br>" in text or _title_width(text) <= room_px:
        return text
    if all(_char_width(c) == CHAR_WIDTH for c in text):
        return "<br>".join(textwrap.wrap(text, width=max(int(room_px / (CHAR_WIDTH * TITLE_FONT)), 8)))
    return "<br>".join(_wide_lines(text, max(room_px, 8 * CHAR_WIDTH * TITLE_FONT)))


def _axes(fig: go.Figure) -> None:
    def restyle(axis: Any) -> None:
        axis.update(tickfont=_font(axis.tickfont, TICK_FONT), automargin=True,
                    gridcolor=GRID, linecolor=TEXT, zerolinecolor=GRID)
        axis.title.update(font=_font(axis.title.font, TITLE_FONT), standoff=14)

    def fit(axis: Any) -> None:  # a y title runs along the plot's height: room for it
        margin = fig.layout.margin
        plot = ((fig.layout.height or DEFAULT_HEIGHT) - (margin.t or 0) - (margin.b or 0)
                - X_AXIS_ROOM)
        low, high = axis.domain or (0, 1)
        axis.title.text = _wrapped(axis.title.text or "", plot * (high - low))

    fig.for_each_xaxis(restyle)
    fig.for_each_yaxis(restyle)
    fig.for_each_yaxis(fit)


def _colorbar(bar: Any) -> None:
    bar.update(tickfont=_font(bar.tickfont, TICK_FONT))
    bar.title.update(font=_font(bar.title.font, TITLE_FONT))


def _traces(fig: go.Figure) -> None:
    for trace in fig.data:
        if "line" in trace and trace.line is not None and "width" in trace.line:
            trace.line.width = max((trace.line.width or 2.0) * LINE_SCALE, MIN_LINE)
        marker = getattr(trace, "marker", None)
        if marker is not None and "size" in marker and trace.type in ("scatter", "scattergl"):
            size = marker.size
            marker.size = ([s * MARKER_SCALE for s in size] if isinstance(size, (list, tuple))
                           else (size or 6) * MARKER_SCALE)
        if marker is not None and "line" in marker and marker.line.width:
            marker.line.width = marker.line.width * LINE_SCALE
        if "textfont" in trace:
            trace.textfont = _font(trace.textfont, _larger(trace.textfont.size, MIN_FONT))
        if "colorbar" in trace:
            _colorbar(trace.colorbar)
        if marker is not None and "colorbar" in marker and (marker.colorscale or marker.showscale):
            _colorbar(marker.colorbar)  # (a colorbar set on any other marker would appear)
        if (trace.type == "bar" and trace.text is not None and fig.layout.barmode not in ("stack", "relative")
                and trace.textposition in (None, "auto", "inside")):
            # inside a bar plotly shrinks the text to fit it; outside, it keeps its size (a stacked
            # bar's text stays inside its part: outside, it would lie on the next part or past the edge)
            trace.update(textposition="outside", cliponaxis=False)
        if "hoverlabel" in trace and trace.hoverlabel.font.size:
            trace.hoverlabel.font.size = max(trace.hoverlabel.font.size, TICK_FONT)


def _layout(fig: go.Figure) -> None:
    layout = fig.layout
    layout.font = _font(layout.font, BASE_FONT)
    layout.title.font = _font(layout.title.font, CHART_TITLE_FONT)
    layout.legend.font = _font(layout.legend.font, TICK_FONT)
    layout.legend.title.font = _font(layout.legend.title.font, TICK_FONT)
    layout.hoverlabel.font = _font(layout.hoverlabel.font, TICK_FONT)
    layout.hoverlabel.font.color = None  # plotly picks a readable colour for each hover box
    layout.uniformtext = {"minsize": MIN_FONT, "mode": "show"}  # bar text never shrunk below it
    for note in layout.annotations:
        note.font = _font(note.font, _larger(note.font.size, TICK_FONT))
    for slider in layout.sliders:
        slider.font = _font(slider.font, TICK_FONT)
        if layout.updatemenus and slider.x:  # Play/Pause at its left grew with their font
            shift = min(SLIDER_SHIFT, 1 - slider.x - (slider.len or 1) + SLIDER_SHIFT)
            slider.update(x=slider.x + shift, len=(slider.len or 1) - shift)
        slider.currentvalue.font = _font(slider.currentvalue.font, TITLE_FONT)
    for menu in layout.updatemenus:
        menu.font = _font(menu.font, TICK_FONT)
    if "coloraxis" in layout:
        _colorbar(layout.coloraxis.colorbar)
    margin = layout.margin
    layout.margin.update(l=max(margin.l or 0, 20), r=max(margin.r or 0, 20), b=max(margin.b or 0, 20),
                         t=max(round((margin.t or 0) * 1.3), 70 if layout.title.text else 40))
    if layout.height:
        layout.height = layout.height + EXTRA_HEIGHT


def presentation(fig: go.Figure) -> go.Figure:
    """A copy of `fig` styled for a projector (see the module docstring); `fig` is unchanged."""
    out = go.Figure(fig)  # a deep copy
    _apply_colours(out, fig)
    _traces(out)
    _axes(out)
    _layout(out)
    return out
