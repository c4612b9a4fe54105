"""The app's words in English, 繁體中文 and 简体中文: GNU gettext catalogs under assets/locale
(`.po` sources, compiled `.mo`), one language per Streamlit session.

The source is written in English and every user-visible string goes through `_` (or `ngettext`,
or `N_` where a constant is defined before a language is known and translated where it is shown).
`scripts/catalogs.py` extracts them with Babel, keeps the catalogs in step (Simplified generated from
Traditional with OpenCC's Taiwan → Mainland phrase conversion, then reviewed) and compiles them.

The language is the session's: the app registers a resolver that reads it (`set_resolver`), and
figures drawn in a run (charts/, which imports no Streamlit) read the same one; `using` sets one
for a block of the current thread. Outside a run — tests, the CLI — it is English.
A leaf module: it imports no other module of the project.
"""

from __future__ import annotations

import functools
import gettext
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LANGUAGES = {"en": "English", "zh-Hant": "繁體中文", "zh-Hans": "简体中文"}
DEFAULT = "en"
DOMAIN = "messages"
LOCALE_DIR = Path(__file__).resolve().parents[1] / "assets" / "locale"
# Babel's locale for numbers and dates; the catalogs' folder names (gettext's own form).
BABEL_LOCALES = {"en": "en_US", "zh-Hant": "zh_Hant_TW", "zh-Hans": "zh_Hans_CN"}
CATALOG_NAMES = {"zh-Hant": "zh_Hant", "zh-Hans": "zh_Hans"}
# The browser's first-visit pick: Accept-Language tags that mean each variant.
_HANT_TAGS = ("zh-hant", "zh-tw", "zh-hk", "zh-mo")
_HANS_TAGS = ("zh-hans", "zh-cn", "zh-sg", "zh-my", "zh")

_state = threading.local()


def catalog_path(lang: str, suffix: str = ".mo") -> Path:
    return LOCALE_DIR / CATALOG_NAMES[lang] / "LC_MESSAGES" / f"{DOMAIN}{suffix}"


@functools.cache
def translations(lang: str) -> gettext.NullTranslations:
    """The compiled catalog of `lang` (English: the source's own words)."""
    if lang not in CATALOG_NAMES:
        return gettext.NullTranslations()
    with catalog_path(lang).open("rb") as f:
        return gettext.GNUTranslations(f)


_resolver: Callable[[], str | None] | None = None


def set_resolver(resolver: Callable[[], str | None]) -> None:
    """Where the language comes from when this thread set none: the app's session (Streamlit
    runs a session's reruns, fragments included, in threads of their own)."""
    global _resolver
    _resolver = resolver


def language() -> str:
    """This thread's language (`using`), else the resolver's (the session's in a Streamlit run),
    else English."""
    lang = getattr(_state, "lang", None)
    if lang is None and _resolver is not None:
        lang = _resolver()
    return lang if lang in LANGUAGES else DEFAULT


def set_language(lang: str | None) -> str | None:
    """Make `lang` this thread's language, over the resolver's (None: the resolver's again)."""
    _state.lang = lang if lang in LANGUAGES else None
    return _state.lang


@contextmanager
def using(lang: str) -> Iterator[None]:
    """`lang` within the block (tests, and work done for another language's file)."""
    before = getattr(_state, "lang", None)
    set_language(lang)
    try:
        yield
    finally:
        _state.lang = before


def _(message: str) -> str:
    """`message` in this thread's language."""
    return translations(language()).gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    """The form of `singular` / `plural` for `n` in this thread's language (Chinese has one)."""
    return translations(language()).ngettext(singular, plural, n)


def N_(message: str) -> str:
    """Marks `message` for the catalogs where it is defined; `_` translates it where it is shown."""
    return message


def chinese() -> bool:
    return language() != "en"


def from_accept_language(header: str | None) -> str:
    """The first language of an Accept-Language header this app speaks ("zh-TW,zh;q=0.9" →
    "zh-Hant"); English when none is."""
    weighted = []
    for i, part in enumerate((header or "").split(",")):
        tag, _sep, params = part.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                q = 0.0
        weighted.append((-q, i, tag.strip().lower()))
    for _q, _i, tag in sorted(weighted):
        if tag.startswith(_HANT_TAGS):
            return "zh-Hant"
        if tag.startswith(_HANS_TAGS):
            return "zh-Hans"
        if tag.startswith("en"):
            return "en"
    return DEFAULT


def babel_locale() -> str:
    return BABEL_LOCALES[language()]
