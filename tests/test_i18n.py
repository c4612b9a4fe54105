"""The catalogs: in step with the source, complete, faithful to each message's fields and markup,
Simplified generated from Traditional; every string drawn by a Streamlit call is marked; the
language comes from the address, the browser or the switch."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from babel.messages.pofile import read_po

from i18n import _, from_accept_language, language, ngettext, using
from scripts import catalogs
from tests.english import english_sentences

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py")), *sorted((ROOT / "ui").rglob("*.py")),
           *sorted((ROOT / "charts").glob("*.py"))]


def catalog(lang: str):
    with catalogs.po(lang).open("rb") as f:
        return [m for m in read_po(f) if m.id]


def test_catalogs_are_in_step_with_the_source_and_complete():
    assert catalogs.stale() == [], "run: python scripts/catalogs.py update"
    for lang in ("zh_Hant", "zh_Hans"):
        messages = catalog(lang)
        assert len(messages) > 500
        assert [m.id for m in messages if not catalogs._translated(m.string)] == [], lang
        assert not [m.id for m in messages if m.fuzzy], lang


FIELDS = re.compile(r"\{[a-z_0-9]*(?:[:!][^{}]*)?\}|%\{[^}]*\}")


def _markup(text: str) -> tuple:
    return (sorted(FIELDS.findall(text)), text.count("**"), text.count("`"), text.count("\n"),
            sorted(re.findall(r"</?[a-z]+", text)))


@pytest.mark.parametrize("lang", ["zh_Hant", "zh_Hans"])
def test_each_translation_keeps_its_fields_and_markup(lang):
    wrong = []
    for m in catalog(lang):
        ids = m.id if isinstance(m.id, tuple) else (m.id,)
        strings = m.string if isinstance(m.string, tuple) else (m.string,)
        for string in strings:
            if string and _markup(ids[-1]) != _markup(string):
                wrong.append((ids[-1][:80], string[:80]))
    assert wrong == []


def test_translations_follow_the_articles_terms():
    """Where the article has its own word, a translation of a message that names the concept
    uses it (inference → 推論, quantization → 量化, streaming → 串流, vocabulary → 詞彙表)."""
    terms = {"inference": "推論", "quantiz": "量化", "streaming": "串流", "vocabulary": "詞彙表"}
    def prose(text: str) -> str:  # without code, calls, the app's name and a method's name
        return re.sub(r"`[^`]*`|\w+\(|Inference Explorer|StreamingLLM", " ", text).lower()

    off = [(en, m.string[:60]) for m in catalog("zh_Hant") if isinstance(m.id, str)
           for en, zh in terms.items() if en in prose(m.id) and zh not in m.string]
    assert off == []


def test_simplified_is_generated_by_opencc_then_reviewed():
    simplify = catalogs.simplifier()
    assert simplify("記憶體與程式的資料") == "内存与程序的数据"  # OpenCC tw2sp: phrases, not only characters
    assert simplify("推論") == "推理"  # the reviewed fix
    hant = {m.id: m.string for m in catalog("zh_Hant")}
    hans = catalog("zh_Hans")
    assert all(m.string == (tuple(map(simplify, hant[m.id])) if isinstance(m.id, tuple)
                            else simplify(hant[m.id])) for m in hans)


# Words OpenCC's Taiwan → Mainland conversion leaves that a Mainland reader would not write here,
# each with the word the review puts instead (assets/locale/zh_Hans/review.json).
NOT_MAINLAND = {"计算机": "计算器 (a calculator; 计算机 is a computer)", "矢量": "向量",
                "内核": "核心 (CPU cores)", "橘色": "橙色", "纯文字": "纯文本", "重播": "回放",
                "造访": "访问", "档案": "文件", "伺服器": "服务器", "预设": "默认", "品质": "质量"}


def test_simplified_chinese_reads_mainland():
    import json

    texts = [m.string for m in catalog("zh_Hans")]
    texts = [t for s in texts for t in ((s,) if isinstance(s, str) else s)]
    glossary = json.loads(catalogs.GLOSSARY.read_text("utf-8"))["terms"]
    texts += [t.get(k, "") for t in glossary for k in ("zh-Hans", "note-zh-Hans")]
    found = {word: why for word, why in NOT_MAINLAND.items() if any(word in t for t in texts)}
    assert found == {}
    assert not any("目前" in t and "到目前为止" not in t for t in texts)  # 当前, as a UI says


def test_labels_a_reader_meets_first_are_chinese():
    """A toggle's and the Attention tabs' names were left English in both Chinese catalogs (the
    English term may follow in brackets, as the prose keeps it)."""
    for lang in ("zh_Hant", "zh_Hans"):
        strings = {m.id: m.string for m in catalog(lang)}
        left = [k for k in ("Chat template", "Head view", "Model view")
                if not re.search(r"[\u4e00-\u9fff]", strings[k])]
        assert left == [], lang


def test_the_language_reaches_every_call():
    with using("zh-Hant"):
        assert language() == "zh-Hant"
        assert _("Glossary") == "術語表"
        assert ngettext("{n} token", "{n} tokens", 2) in ("{n} 個 token", "{n} tokens")
    with using("zh-Hans"):
        assert _("Glossary") == "术语表"
    assert language() == "en" and _("Glossary") == "Glossary"


@pytest.mark.parametrize("header, lang", [
    ("zh-TW,zh;q=0.9,en;q=0.8", "zh-Hant"), ("zh-HK", "zh-Hant"), ("zh-Hant-TW", "zh-Hant"),
    ("zh-CN,zh;q=0.9", "zh-Hans"), ("zh", "zh-Hans"), ("en-US,en;q=0.9", "en"), ("fr-FR", "en"),
    ("fr;q=0.9,zh-TW;q=0.8", "zh-Hant"), ("en;q=0.5,zh-CN;q=0.9", "zh-Hans"), ("", "en"), (None, "en"),
    ("zh-TW;q=oops", "zh-Hant")])
def test_the_browsers_language_picks_the_first_visit(header, lang):
    assert from_accept_language(header) == lang


STREAMLIT_TEXT = {"markdown", "caption", "write", "title", "header", "subheader", "info", "warning",
                  "error", "success", "toast", "button", "toggle", "checkbox", "radio", "selectbox",
                  "slider", "text_input", "text_area", "number_input", "metric", "expander", "tabs",
                  "multiselect", "select_slider", "download_button", "popover", "page_link",
                  "status", "spinner", "form_submit_button", "segmented_control", "pills",
                  "file_uploader", "link_button", "text", "exception", "Page", "help"}
TEXT_KEYWORDS = {"label", "help", "placeholder", "caption", "title", "body", "text", "value"}
MARKERS = {"_", "N_", "ngettext"}


def _prose(node: ast.AST) -> bool:
    """A literal with words: at least two Latin words, or an f-string with one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if re.fullmatch(r"[\w/.-]+\.py|:material/\w+:", node.value):  # a page's file, an icon
            return False
        return len(re.findall(r"[A-Za-z]{2,}", node.value)) >= 2
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.Constant) and re.search(r"[A-Za-z]{2,}", v.value)
                   for v in node.values)
    return False


def unmarked(tree: ast.AST) -> list[int]:
    """Lines where a Streamlit call gets words not passed through `_`."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name not in STREAMLIT_TEXT:
            continue
        args = list(node.args[:1]) + [k.value for k in node.keywords if k.arg in TEXT_KEYWORDS]
        lines += [a.lineno for a in args if _prose(a)]
    return lines


def test_every_string_a_streamlit_call_draws_is_marked():
    found = {p.relative_to(ROOT).as_posix(): unmarked(ast.parse(p.read_text())) for p in SOURCES}
    assert {p: lines for p, lines in found.items() if lines} == {}


def test_the_checks_can_fail():
    assert unmarked(ast.parse('st.caption("Two words here")')) == [1]
    assert unmarked(ast.parse('st.caption(_("Two words here"))')) == []
    assert unmarked(ast.parse('x.button(f"Run {n} steps", help=_("ok"))')) == [1]
    assert unmarked(ast.parse('st.Page("pages/a_b.py", icon=":material/grid_on:")')) == []
    assert _markup("{n} tokens in **{ms}**") != _markup("{n} 個 token，耗時 {ms}")
    assert english_sentences("這裡 the cache grows with every token") != []
