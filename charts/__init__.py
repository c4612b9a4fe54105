"""Pure functions from a Trace to figures and HTML fragments; no Streamlit here."""

from .live import step_chart, topk_chart
from .tokens import piece_text, token_chips_html

__all__ = ["piece_text", "step_chart", "token_chips_html", "topk_chart"]
