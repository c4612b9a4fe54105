"""The Compare page in real Chromium at 1920×1080, on two shipped examples (no model run): the
first differing token is the one outlined chip in each run, both runs' maps of the same layer and
head are drawn side by side on one colour scale, and run B survives a reload."""

from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from charts.tokens import piece_text, visible
from engine.files import load_trace
from engine.lens.compare import token_diff
from engine.records.examples import examples

from .browser import go_to, launch_chromium, wait_for_app

TRACES = {e.title: load_trace(e.path) for e in examples()}
A, B = "Short Q&A", "Five scripts"


@pytest.fixture(scope="module")
def page(url):
    with sync_playwright() as pw:
        chromium = launch_chromium(pw)
        page = chromium.new_page(viewport={"width": 1920, "height": 1080})
        page.goto(url)
        wait_for_app(page)
        go_to(page, "Compare runs")
        yield page
        chromium.close()


PLOTS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(g => ({
  title: (g._fullLayout.title.text || '').replace(/<[^>]+>/g, ''), type: g.data[0].type, zmax: g.data[0].zmax,
  width: g.getBoundingClientRect().width, left: g.getBoundingClientRect().left,
  ytitle: g._fullLayout.yaxis.title.text, xtitle: g._fullLayout.xaxis.title.text,
  yticks: g._fullLayout.yaxis.ticktext || null}))"""


def test_two_examples_compared_with_the_first_difference_marked(page):
    assert page.get_by_role("combobox", name="Run A", exact=True).input_value() == A
    page.get_by_role("combobox", name="Example", exact=True).click()
    page.get_by_role("option", name=B).click()
    wait_for_app(page)
    page.get_by_role("button", name="Compare with this example").click()
    wait_for_app(page)
    a, b = TRACES[A], TRACES[B]
    diff = token_diff(a, b)
    page.get_by_text(f"first differ at answer token {diff.answer}").wait_for()
    assert page.locator('[data-testid="stException"]').count() == 0
    # the warning and the chips below it arrive as separate deltas: wait for the chips themselves
    page.wait_for_function("() => document.querySelectorAll('.ie-first-diff').length >= 4")
    marked = page.locator(".ie-first-diff")
    assert marked.count() == 4  # the answer and the prompt, in each run
    texts = [marked.nth(i).inner_text() for i in range(4)]
    assert texts[0] == visible(piece_text(a.steps[diff.answer].piece))
    assert texts[1] == visible(piece_text(b.steps[diff.answer].piece))
    assert texts[2] == visible(piece_text(a.prompt_pieces[diff.prompt]))
    outline = marked.first.evaluate("e => getComputedStyle(e).outlineColor")
    assert outline == "rgb(214, 39, 40)"

    page.get_by_role("heading", name="The same attention head in both").scroll_into_view_if_needed()
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 4")
    plots = page.evaluate(PLOTS)
    maps = [p for p in plots if p["type"] == "heatmap"]
    assert [m["title"] for m in maps] == ["run A · layer 0, head 0", "run B · layer 0, head 0"]
    assert maps[0]["zmax"] == maps[1]["zmax"]
    assert maps[0]["left"] + maps[0]["width"] <= maps[1]["left"]  # side by side, not stacked
    assert all(m["width"] > 600 for m in maps)
    latency = next(p for p in plots if p["title"] == "Latency of every step")
    assert latency["ytitle"] == "step latency (ms, log scale)" and len(latency["yticks"]) >= 3
    kv = next(p for p in plots if p["title"] == "KV cache after every step")
    assert kv["ytitle"] == "KV cache (MiB)" and kv["xtitle"].startswith("step")


def test_run_b_survives_a_reload(page):
    page.reload()
    wait_for_app(page)
    page.get_by_text(f"first differ at answer token {token_diff(TRACES[A], TRACES[B]).answer}"
                     ).wait_for()
    page.get_by_text(f"example “{B}”").first.wait_for()


def test_a_trace_file_as_run_b_and_one_message_for_a_bad_one(page, tmp_path):
    page.get_by_text("A trace file", exact=True).click()
    wait_for_app(page)
    bad = tmp_path / "notes.npz"
    bad.write_bytes(b"not a zip at all")
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(bad))
    error = page.locator('[data-testid="stAlertContentError"]')
    error.wait_for()
    wait_for_app(page)
    assert error.count() == 1 and error.inner_text().startswith("file notes.npz:")
    assert page.locator('[data-testid="stException"]').count() == 0
    story = next(e for e in examples() if e.name == "story")
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(story.path))
    page.get_by_text("Run B: file story.npz").wait_for()
    wait_for_app(page)
    assert error.count() == 0
    diff = token_diff(TRACES[A], TRACES[story.title])
    page.get_by_text(f"first differ at answer token {diff.answer}").wait_for()
