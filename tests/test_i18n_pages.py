"""Every page in 繁體中文 and 简体中文 shows no English sentence (tests/english.py), with a run of
the Chinese example open; and switching the language keeps the session's run without running the
model again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.kv.shrink.needle import NEEDLE
from i18n import set_language
from tests.english import element_words, english_sentences
from ui.state import state_of

pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
PAGES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pages").glob("*.py"))
EXAMPLE = "zh-hant-qa"


def data_strings(trace) -> set[str]:
    """What the pages show that is the run's or a sample's, not the app's words."""
    found = {trace.prompt, trace.output_text, *trace.prompt_pieces}
    for step in trace.steps:
        found |= {step.piece, step.text, *step.top_pieces}
    found.add("".join(trace.prompt_pieces).replace("Ġ", " ").replace("Ċ", "\n"))
    assets = ROOT / "assets"
    found |= {p["prompt"] for p in json.loads((assets / "sample_prompts.json").read_text())}
    found |= {p["prompt"] for p in json.loads((assets / "examples" / "examples.json").read_text())}
    multilingual = json.loads((assets / "multilingual.json").read_text())
    found |= {s["text"] for s in multilingual["sentences"]} | {multilingual["article"]["en"]}
    for text in (assets / "texts").glob("*.txt"):
        found |= {line.strip() for line in text.read_text().splitlines() if line.strip()}
    return found | {NEEDLE}  # the sentence the KV page hides in those texts, quoted as the model reads it


@pytest.fixture(scope="module")
def walk() -> dict[tuple[str, str], list[str]]:
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["lang"] = "zh-Hant"
    # AppTest formats the last run's widget values in this thread when it runs again: this
    # thread speaks the language that run was drawn in, and the new one once it has run
    set_language("zh-Hant")
    try:
        return _walk_pages(at)
    finally:
        set_language(None)  # a failing page must not leave this worker speaking Chinese


def _walk_pages(at: AppTest) -> dict[tuple[str, str], list[str]]:
    at.session_state["replay_speed"] = "instant"
    at.run()
    next(b for b in at.button if b.key == f"example_{EXAMPLE}").click().run()
    trace = state_of(at.session_state).run.trace
    data = data_strings(trace)
    found = {}
    for page in PAGES:
        for lang in ("zh-Hant", "zh-Hans"):
            at.session_state["lang"] = lang
            at.switch_page(page).run()
            set_language(lang)
            assert not at.exception, (page, lang, at.exception)
            words = [w for root in (at.main, at.sidebar) for w in element_words(root)]
            found[(page, lang)] = [s for w in words for s in english_sentences(w, data)]
    assert state_of(at.session_state).run.trace is trace  # the run stayed, never ran again
    return found


@pytest.mark.parametrize("lang", ["zh-Hant", "zh-Hans"])
@pytest.mark.parametrize("page", PAGES)
def test_a_page_in_chinese_shows_no_english_sentence(walk, page, lang):
    assert walk[(page, lang)] == []
