"""Embeddings page: which token a typed word probes (and its word-initial form), a picker that
follows the trace, and a PCA map whose text labels never sit on top of each other."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from charts.embeddings import embedding_map
from engine.lens.embeddings import EmbeddingIndex
from engine.lens.tokens import probe_token, prompt_word
from ui.state import state_of

APP = str(Path(__file__).resolve().parents[1] / "app.py")
# Independent of the chart's own constants: the map's plot area measured in Chromium is 896 ×
# 424 px at 1440 × 900 (1376 × 424 at 1920 × 1080); a narrower 640 × 420 is assumed. A 12 px
# label is ~7 px per character wide and 16 px tall, drawn above its marker.
PLOT_W, PLOT_H, CHAR_W, LINE_H = 640.0, 420.0, 7.0, 16.0


def test_a_word_without_its_space_probes_the_word_ending_and_says_so(lm):
    probed = probe_token(lm.tokenizer, "king")
    assert probed.piece == "king" and not probed.split
    text, tid, piece = probed.word_initial
    assert (text, piece) == (" king", "Ġking")
    assert tid == lm.tokenizer(" king", add_special_tokens=False).input_ids[0] != probed.token_id
    words = probed.description()
    assert f"the piece king (id {probed.token_id})" in words and f"·king (id {tid})" in words
    assert "Ġ" not in words  # one notation for a space: ·
    assert "no space before it" in words

    spaced = probe_token(lm.tokenizer, " king")
    assert spaced.piece == "Ġking" and spaced.word_initial is None
    assert "word-initial" in spaced.description()


def test_a_word_cut_into_pieces_names_all_of_them(lm):
    probed = probe_token(lm.tokenizer, "unhappiness")
    assert probed.split and probed.pieces == ("un", "h", "appiness")
    assert "splits into 3 pieces: un | h | appiness" in probed.description()
    emoji = probe_token(lm.tokenizer, "😀")
    assert "<F0 9F>" in emoji.description() and "split across tokens" in emoji.description()
    assert emoji.word_initial is None  # " 😀" starts with bytes, not a word: nothing to offer
    assert probe_token(lm.tokenizer, "") is None


@pytest.mark.parametrize("prompt, piece", [("The king met the queen.", "Ġking"),
                                           ("Name a colour.", "Ġcolour"),
                                           ("東京", None)])
def test_the_picker_starts_on_a_word_of_the_users_prompt(lm, prompt, piece):
    tid = prompt_word(lm.tokenizer, prompt)
    assert (None if tid is None else lm.tokenizer.convert_ids_to_tokens(tid)) == piece


def to_pixels(fig, x, y) -> tuple[np.ndarray, np.ndarray]:
    """Data → plot pixels through the figure's axis ranges (the extent of all its points where
    the figure leaves the range to autorange)."""
    allx = [v for t in fig.data for v in t.x]
    ally = [v for t in fig.data for v in t.y]
    xr = fig.layout.xaxis.range or (min(allx), max(allx))
    yr = fig.layout.yaxis.range or (min(ally), max(ally))
    return ((np.asarray(x, dtype=float) - xr[0]) / (xr[1] - xr[0]) * PLOT_W,
            (np.asarray(y, dtype=float) - yr[0]) / (yr[1] - yr[0]) * PLOT_H)


def text_box(x: float, y: float, text: str, position: str) -> tuple[float, float, float, float]:
    """(left, right, bottom, top) px of a label at a plotly textposition, 4 px off its marker."""
    w, h = CHAR_W * len(text), LINE_H
    vertical, horizontal = position.split()
    left = {"center": x - w / 2, "right": x + 4, "left": x - 4 - w}[horizontal]
    bottom = {"top": y + 4, "middle": y - h / 2, "bottom": y - 4 - h}[vertical]
    return left, left + w, bottom, bottom + h


def assert_labels_apart(fig) -> list[str]:
    """No two text labels closer than a line height or with overlapping boxes, and no label
    drawn over another coloured (prompt, neighbour, probed) marker."""
    xs, ys, texts, where, mx, my = [], [], [], [], [], []
    for trace in fig.data:
        if trace.name != "vocabulary sample":
            mx += list(trace.x)
            my += list(trace.y)
        positions = trace.textposition
        if positions is None or isinstance(positions, str):
            positions = [positions or "middle center"] * len(trace.x)
        for x, y, text, position in zip(trace.x, trace.y, trace.text or (), positions):
            if text:
                xs.append(x)
                ys.append(y)
                texts.append(text)
                where.append(position)
    px, py = to_pixels(fig, xs, ys)
    markers = np.column_stack(to_pixels(fig, mx, my))
    boxes = [text_box(px[i], py[i], texts[i], where[i]) for i in range(len(texts))]
    for i, j in combinations(range(len(texts)), 2):
        a, b = boxes[i], boxes[j]
        apart = a[1] <= b[0] or b[1] <= a[0] or a[3] <= b[2] or b[3] <= a[2]
        assert apart and np.hypot(px[i] - px[j], py[i] - py[j]) >= LINE_H, (texts[i], texts[j])
    for (left, right, bottom, top), text in zip(boxes, texts):
        inside = ((markers[:, 0] > left) & (markers[:, 0] < right) & (markers[:, 1] > bottom)
                  & (markers[:, 1] < top))
        assert not inside.any(), (text, markers[inside])
    return texts


def test_map_labels_never_overlap_and_every_point_keeps_its_hover(lm):
    index = EmbeddingIndex(lm)
    tok = lm.tokenizer
    ids = list(dict.fromkeys(tok(" The king and the queen walked to Paris.",
                                 add_special_tokens=False).input_ids))
    king = tok(" king", add_special_tokens=False).input_ids[0]
    near = [int(i) for i in index.neighbours(king).ids]
    coords, sample, background = index.pca_map([king, *near, *ids], background=1500)
    label = tok.convert_ids_to_tokens
    fig = embedding_map({"probed token": (coords[:1], ["Ġking"]),
                         "neighbour": (coords[1:11], label(near)),
                         "prompt token": (coords[11:], label(ids)),
                         "vocabulary sample": (background, label([int(i) for i in sample]))})
    texts = assert_labels_apart(fig)
    assert texts.count("Ġking") == 1 and len(texts) >= 6  # the probed token, and room for more
    assert len(set(texts) & set(label(near))) >= 3  # its neighbours come before the prompt
    for trace in fig.data:  # no point loses its name: hover has all of them
        assert len(trace.hovertext) == len(trace.x) and all(trace.hovertext)


def test_points_on_one_spot_get_one_label():
    stack = np.zeros((6, 2)) + [[0.0, 0.0]]
    fig = embedding_map({"prompt token": (stack, [f"w{i}" for i in range(6)]),
                         "vocabulary sample": (np.array([[-1.0, -1.0], [1.0, 1.0]]), ["a", "b"])})
    assert assert_labels_apart(fig) == ["w0"]


def shown(at: AppTest) -> list[str]:
    """The captions as read on screen (markdown escapes removed)."""
    return [c.value.replace("\\", "") for c in at.caption]


def generate(at: AppTest, prompt: str) -> AppTest:
    state_of(at.session_state).settings = replace(state_of(at.session_state).settings,
                                                      max_new_tokens=2)
    at.text_area(key="prompt").set_value(prompt)
    at.button[0].click()
    return at.run()


def test_embeddings_page_follows_the_trace_and_names_the_probed_piece(lm):
    at = generate(AppTest.from_file(APP, default_timeout=180).run(), "The king met the queen.")
    at.switch_page("pages/embeddings.py").run()
    assert not at.exception
    king = lm.tokenizer(" king", add_special_tokens=False).input_ids[0]
    assert at.selectbox(key="emb_pick").value == king  # a word of the prompt, not "system"
    assert any(f"·king (id {king})" in c for c in shown(at))

    at.text_input(key="emb_probe").set_value("king").run()
    bare = lm.tokenizer("king", add_special_tokens=False).input_ids[0]
    assert any(f"the piece king (id {bare})" in c for c in shown(at))
    bare_near = list(at.dataframe[0].value["id"])
    offer = next(b for b in at.button if "·king" in b.label)
    offer.click().run()
    assert at.text_input(key="emb_probe").value == " king"
    assert any("word-initial" in c for c in shown(at))
    assert list(at.dataframe[0].value["id"]) != bare_near
    assert not any("·king" in b.label for b in at.button)  # nothing left to offer
    assert not any("Ġ" in text for text in [*shown(at), *(b.label for b in at.button)])

    at.switch_page("pages/generate.py").run()
    at = generate(at, "Describe a dragon.")
    at.switch_page("pages/embeddings.py").run()
    dragon = lm.tokenizer(" dragon", add_special_tokens=False).input_ids[0]
    assert at.selectbox(key="emb_pick").value == dragon and at.text_input(key="emb_probe").value == ""
