"""Text that came from a file, a model or a visitor (token pieces, prompts, names), made safe to
put inside HTML, a plotly figure's text or Streamlit Markdown: it is shown as itself, never as a
tag, a link, an image or formatting.

Every character any of those three would act on inside a line becomes a character reference
(`<` → `&lt;`, `[` → `&#91;`, `.` so that `www.x.com` is no autolink, `:` so that `:red[x]` is no
directive): HTML, plotly's text (which draws `<b>`, `<a href>` and decodes references) and
Markdown (where a reference is literal text) all show the original character; a bare address
gets an invisible word joiner, as GFM links those after undoing references. Markers that act
only at the start of a line (`#`, `-`, `1.`) are left: these strings are labels inside a line, a
chip or a figure. ui/text.py `plain` is the Markdown-only form (backslashes) for Streamlit strings
that never hold HTML.
"""

from __future__ import annotations

import re

_ACTIVE = re.compile(r"[\\`*_\[\]!|~<>$:.&\"']")
_NAMED = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}  # the named ones plotly decodes; others by number


# GFM finds bare links (`http://…`, `www.…`, `a@b.c`) in the text once escapes and references are
# undone, so neither stops them: a word joiner (U+2060, invisible) before the `:`, `.` or `@` does
_AUTOLINK = re.compile(r"(?i)(?<=\bhttps)(?=:)|(?<=\bhttp)(?=:)|(?<=\bftp)(?=:)"
                       r"|(?<=\bwww)(?=\.)|(?=@)")
JOINER = "\u2060"


def break_autolinks(text: str) -> str:
    """`text` with an invisible word joiner where GFM would start a bare link."""
    return _AUTOLINK.sub(JOINER, text)


def as_text(text: str) -> str:
    """`text` for HTML, plotly or Markdown, shown exactly as it is (see the module's note)."""
    return _ACTIVE.sub(lambda m: _NAMED.get(m[0], f"&#{ord(m[0])};"), break_autolinks(text))
