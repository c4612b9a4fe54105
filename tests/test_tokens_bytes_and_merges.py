"""Tokens page: pieces holding part of a UTF-8 character show their bytes, and the BPE merge
table shows every step with the slider's step highlighted (engine, chips and the page)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import streamlit
from streamlit.testing.v1 import AppTest

from charts.tokens import WHITESPACE_NOTE, chips_html, merge_table, piece_text, shown_piece, table_height
from engine.lens.tokens import (
    bpe_steps,
    byte_label,
    piece_label,
    pre_tokens,
    split_characters,
    splits_character,
    tokenize,
)

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def test_byte_label_shows_the_bytes_of_a_split_character():
    assert byte_label(b"\xe6\x9d") == "<E6 9D>"  # 2 of the 3 bytes of 東
    assert byte_label(b" \xf0\x9f\x98") == " <F0 9F 98>"  # a space, then 3 of 😀's 4 bytes
    assert byte_label(b"\xc3\xafve") == "ïve"  # whole characters stay text
    assert byte_label(b"ab\x80cd") == "ab<80>cd"
    assert splits_character(b"\xe6\x9d") and not splits_character("東".encode())


def test_pieces_of_east_asian_text_and_emoji_show_bytes_not_replacement_characters(lm):
    tokens = tokenize(lm.tokenizer, "東京 😀")
    labels = [piece_text(t.piece) for t in tokens]
    assert not any("\ufffd" in label for label in labels)
    assert labels[:2] == ["<E6 9D>", "<B1>"]  # 東 = E6 9D B1, cut after its second byte
    assert piece_label("æĿ") == "<E6 9D>"
    # which character each piece holds part of, found from the joined bytes
    assert split_characters(tokens)[:4] == ["東", "東", "京", "京"]
    assert split_characters(tokens)[-1] == "😀"


def test_chips_show_bytes_and_say_why_on_hover(lm):
    html = chips_html(tokenize(lm.tokenizer, "東京, 😀 ok"))
    assert "\ufffd" not in html
    assert "&lt;E6 9D&gt;" in html  # the chip's text, escaped
    assert "UTF-8 bytes of 東: a character split across tokens" in html
    assert "UTF-8 bytes of 😀" in html
    assert html.count("border-style: dashed") == 6  # 東 ×2, 京 ×2, 😀 ×2; not ',', ' ok'


@pytest.mark.parametrize("word", [" unhappiness", " antidisestablishmentarianism"])
def test_merge_table_has_every_step_and_highlights_the_selected_one(lm, word):
    steps = bpe_steps(lm.tokenizer, pre_tokens(lm.tokenizer, word)[0])
    styler = merge_table(steps, 3)
    frame = styler.data
    assert len(frame) == len(steps) > 10  # more rows than st.dataframe shows by default
    assert frame["pieces"].iloc[-1] == " | ".join(shown_piece(p) for p in lm.tokenizer.tokenize(word))
    assert frame["pieces"].iloc[-1].startswith("·")  # the word's space, in the chips' notation
    assert not any("Ġ" in str(v) for v in frame.to_numpy().ravel())
    styles = styler._compute().ctx  # {(row, col): [(property, value)]}
    highlighted = {row for (row, _), props in styles.items() if props}
    assert highlighted == {3}
    assert table_height(len(steps)) >= 35 * (len(steps) + 1)  # header + every row


def test_tokens_page_shows_bytes_and_the_whole_merge_table(monkeypatch):
    shown: list[tuple[object, dict]] = []
    real = streamlit.dataframe

    def record(data, **kwargs):  # the page's own st.dataframe call, with its height
        shown.append((data, kwargs))
        return real(data, **kwargs)

    monkeypatch.setattr(streamlit, "dataframe", record)
    at = AppTest.from_file(APP, default_timeout=180).run()
    at.switch_page("pages/tokens.py").run()
    assert not at.exception
    chips = [m.value for m in at.markdown if "ie-chips" in m.value]
    assert chips and "\ufffd" not in chips[-1]  # " 東京" here: <E6> <9D B1> …, after a space
    assert "·&lt;E6&gt;</span>" in chips[-1] and "UTF-8 bytes of 東" in chips[-1]
    assert any("\\<E6\\>" in c.value and "split across" in c.value  # the key, as Markdown text
               for c in at.caption)
    at.text_input[0].set_value(" antidisestablishmentarianism").run()
    at.select_slider[0].set_value(2).run()
    merges = [(d, kw) for d, kw in shown if hasattr(d, "data") and "merge rank" in d.data][-1]
    styler, kwargs = merges
    rows = len(styler.data)
    assert rows == 25 and kwargs["height"] >= 35 * (rows + 1)
    assert {row for (row, _), p in styler._compute().ctx.items() if p} == {2}
    # one notation for a space, explained once: no Ġ in any text, table or label on the page
    texts = [*(m.value for m in at.markdown), *(c.value for c in at.caption),
             *(s.label for s in at.select_slider), *(t.help or "" for t in at.text_input)]
    assert texts and not any("Ġ" in t for t in texts)
    cells = [v for d, _ in shown for v in pd.DataFrame(getattr(d, "data", d)).to_numpy().ravel()]
    assert cells and not any("Ġ" in str(v) for v in cells)
    assert [c.value for c in at.caption].count(WHITESPACE_NOTE) == 1
    assert at.select_slider[0].label == "Merge step for “·antidisestablishmentarianism”"
