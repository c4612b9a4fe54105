"""The texts a weights variant is scored and calibrated on, read and tokenized with one-line
errors: the evaluation text (the Gettysburg Address) and AWQ's calibration text ship in
assets/texts/ (sources in its README). Below both `quality` and `awq`, which read them.
"""

from __future__ import annotations

from pathlib import Path

from i18n import _

from ..assets import asset
from ..errors import InputError
from ..kv.cachelab import check_sequence
from ..loader import LoadedModel

TEXTS_DIR = asset("texts")
DEFAULT_TEXT = TEXTS_DIR / "gettysburg.txt"
MAX_TEXT_BYTES = 64 * 1024
MAX_TOKENS = 2048  # each variant reads the whole text in one forward


def read_text(path: str | Path | None = None) -> str:
    """The text to score (default: the Gettysburg Address), refused in one line if unreadable."""
    path = Path(path) if path is not None else DEFAULT_TEXT
    try:
        if path.stat().st_size > MAX_TEXT_BYTES:
            raise InputError(_("the text file is larger than {limit} KB: {path}").format(
                limit=MAX_TEXT_BYTES // 1024, path=str(path)[:200]))
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(_("cannot read the text file {path}: {error}").format(
            path=str(path)[:200], error=err.strerror or err)) from err
    except UnicodeDecodeError as err:
        raise InputError(_("the text file is not UTF-8 text: {path}").format(
            path=str(path)[:200])) from err
    if not text.strip():
        raise InputError(_("the text file is empty: {path}").format(path=str(path)[:200]))
    return text


def text_ids(lm: LoadedModel, text: str, max_tokens: int = MAX_TOKENS) -> list[int]:
    """The text's token ids as the tokenizer gives them (no chat template)."""
    ids = list(lm.tokenizer(text)["input_ids"])
    if len(ids) < 2:
        raise InputError(_("the text needs at least 2 tokens: one to read, one to predict"))
    check_sequence(lm, ids, max_tokens)
    return ids
