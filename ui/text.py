"""User text on a page: errors without the server's paths (hosted), and text shown as itself in
Streamlit markdown."""

from __future__ import annotations

import re

from charts.text import break_autolinks
from i18n import chinese
from ui.config import config

_PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+[\w.+-]*")
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~<>$:=&])")


def message(err: BaseException | str) -> str:
    """An error for the page: plain text (see `plain`), and on a hosted demo without filesystem
    paths (a visitor has no use for the server's layout)."""
    text = str(err)
    if config().hosted:
        text = _PATH.sub("…", text)
    return plain(text)


def plain(text: str) -> str:
    """User text (a file name, a model id, an error echoing them) safe to show in Streamlit
    markdown: every markdown punctuation character escaped, so `~x~` is not strikethrough and
    `[a](b)` is not a link, and no bare address becomes a link."""
    return _MARKDOWN.sub(r"\\\1", break_autolinks(text))


def code_span(text: str) -> str:
    """User text as a Markdown code span, whatever backticks it holds: fenced by one backtick
    more than its longest run (CommonMark), padded where it starts or ends with one."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def listed(items: list[str]) -> str:
    """Items in a sentence: "a, b, c", in Chinese "a、b、c"."""
    return ("、" if chinese() else ", ").join(items)
