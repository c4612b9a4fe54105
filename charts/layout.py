"""Layout fixes every chart gets on screen (ui/common.py `show_chart`), whatever the page.

A horizontal legend placed above the plot (`y` > 1) is anchored by its top by default: on a
narrow screen (a phone) its entries wrap onto more rows, which grow downwards over the plot.
Anchored by its bottom, the rows grow upwards into the top margin, which plotly enlarges for
them."""

from __future__ import annotations

import plotly.graph_objects as go

from i18n import language

LEGEND_GAP = 0.02  # of the plot's height, between the legend's last row and the plot


def legend_above(fig: go.Figure) -> go.Figure:
    """`fig` with a top legend anchored by its bottom, as a copy (pages keep their figures in
    memos); `fig` itself when there is nothing to change."""
    legend = fig.layout.legend
    if legend.orientation != "h" or legend.y is None or legend.y <= 1 or legend.yanchor not in (None, "auto"):
        return fig
    out = go.Figure(fig)
    out.layout.legend.update(y=1 + LEGEND_GAP, yanchor="bottom")
    return out


# Streamlit's Latin font first, then Chinese: Noto CJK (Debian's fonts-noto-cjk, which the Docker
# image and CI install), PingFang (macOS), Microsoft's (Windows); the variant's own glyph forms
# first (the same code point is drawn differently in Traditional and Simplified fonts).
_LATIN = '"Source Sans", "Source Sans Pro"'
CJK_FONTS = {
    "zh-Hans": '"Noto Sans CJK SC", "PingFang SC", "Microsoft YaHei", "Noto Sans CJK TC"',
    "zh-Hant": '"Noto Sans CJK TC", "PingFang TC", "Microsoft JhengHei", "Noto Sans CJK SC"',
}


def font_stack(lang: str | None = None) -> str:
    """The font-family list for `lang` (default: this session's): Latin, then CJK, then sans-serif."""
    cjk = CJK_FONTS.get(lang or language(), CJK_FONTS["zh-Hant"])
    return f"{_LATIN}, {cjk}, sans-serif"


def with_fonts(fig: go.Figure) -> go.Figure:
    """`fig` naming the CJK fonts in its font stack, as a copy (the figure may be kept in a memo)."""
    stack = font_stack()
    if fig.layout.font.family == stack:
        return fig
    out = go.Figure(fig)
    out.layout.font.family = stack
    return out
