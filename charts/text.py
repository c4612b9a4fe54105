"""Text that came from a file, a model or a visitor (token pieces, prompts, names), made safe to
put inside HTML, a plotly figure's text or Streamlit Markdown: it is shown as itself, never as a
tag, a link, an image or formatting.

Every character any of those three would act on inside a line becomes a character reference
(`<` → `&lt;`, `[` → `&#91;`, `.` so that `www.x.com` is no autolink, `:` so that `:red[x]` is no
directive): HTML, plotly's text (which draws `<b>`, `<a href>` and decodes references) and
Markdown (where a reference is literal text) all show the original character. Markers that act
only at the start of a line (`#`, `-`, `1.`) are left: these strings are labels inside a line, a
chip or a figure. ui/text.py `plain` is the Markdown-only form (backslashes) for Streamlit strings
that never hold HTML.
"""

from __future__ import annotations

import re

_ACTIVE = re.compile(r"[\\`*_\[\]!|~<>$:.&\"']")
_NAMED = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}


def as_text(text: str) -> str:
    """`text` for HTML, plotly or Markdown, shown exactly as it is (see the module's note)."""
    return _ACTIVE.sub(lambda m: _NAMED.get(m[0], f"&#{ord(m[0])};"), text)
