"""The guided story in real Chromium at 1920×1080, on an example trace with no model loaded (the
fallback when the model fails in front of a class): → / PageDown through every stage to the end,
← / PageUp back, as a presentation clicker sends them."""

from __future__ import annotations

import re

from playwright.sync_api import expect, sync_playwright

from ui.keys import STORY_FIGURE

from .browser import go_to, launch_chromium, wait_for_app
from .measure import CHART_OVERLAPS, FIGURE_BOX, SELECT_CUT, TEXT_OUTSIDE, TEXT_SIZES

# The stage headings, in order (pages/story.py STAGES; that module draws a page when imported)
STAGES = ["Text → tokens (BPE)", "Tokens → vectors: embeddings and RoPE",
          "Attention: Q·Kᵀ/√d, softmax, ·V", "Feed-forward network and the residual stream",
          "The next token: a distribution, then a choice", "Prefill vs decode", "The KV cache",
          "Weights in fewer bits"]


def open_example_without_model(browser, url: str, width: int, height: int, example: str = "Short Q&A"):
    """A page whose model failed to load ("/nonexistent") and whose trace is a shipped example,
    on the Step by step page."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(url)
    wait_for_app(page)
    source = page.get_by_role("textbox", name="Hugging Face id or local folder")
    source.fill("/nonexistent", timeout=120_000)
    source.press("Enter")
    page.get_by_text("Model not loaded").first.wait_for(timeout=60_000)
    wait_for_app(page)
    page.get_by_role("button", name=example, exact=True).click(timeout=120_000)
    page.get_by_text("stopped because").wait_for(timeout=60_000)  # the replay has ended
    wait_for_app(page)
    go_to(page, "Step by step")
    return page


def at_stage(page, k: int) -> None:
    """Stage k (0-based) is shown: its heading, the progress text, and no error."""
    expect(page.get_by_role("heading", name=STAGES[k], exact=True)).to_be_visible(timeout=30_000)
    expect(page.get_by_text(f"Stage {k + 1} of {len(STAGES)}", exact=True)).to_be_visible()
    wait_for_app(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    expect(page.get_by_text(re.compile("^What to notice"))).to_have_count(1)  # retries: a later delta


def test_keyboard_walks_the_whole_story_with_no_model(url):
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        page = open_example_without_model(browser, url, 1920, 1080)
        at_stage(page, 0)
        page.keyboard.press("ArrowLeft")  # nothing before the first stage
        at_stage(page, 0)
        for k in range(1, len(STAGES)):
            page.keyboard.press("ArrowRight" if k % 2 else "PageDown")
            at_stage(page, k)
        page.keyboard.press("PageDown")  # nothing after the last
        at_stage(page, len(STAGES) - 1)
        for k in range(len(STAGES) - 2, -1, -1):
            page.keyboard.press("ArrowLeft" if k % 2 else "PageUp")
            at_stage(page, k)
        # typing in a field never moves the story
        source = page.get_by_role("textbox", name="Hugging Face id or local folder")
        source.click()
        source.press("ArrowRight")
        source.press("PageDown")
        page.wait_for_timeout(500)
        at_stage(page, 0)
        browser.close()


def test_a_clicker_brings_each_figure_into_view_in_presentation_mode(browser, url):
    """Presenting at 1280×720 (and 1920×1080 for the first step): → / PageDown shows the next
    stage with its figure's top on screen, every text ≥ 22 px, no axis title cut and the stage's
    name whole in the picker."""
    for width, height, stages in ((1280, 720, len(STAGES)), (1920, 1080, 2)):
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(f"{url}/story?example=qa&present=1")
        wait_for_app(page)
        at_stage(page, 0)
        for k in range(1, stages):
            page.keyboard.press("ArrowRight" if k % 2 else "PageDown")
            at_stage(page, k)
            page.wait_for_function(f"""() => {{ const b = ({FIGURE_BOX})("{STORY_FIGURE}");
                return b && b[0] >= 0 && b[0] < b[2] - 100; }}""", timeout=30_000)
            top, _, _ = page.evaluate(FIGURE_BOX, STORY_FIGURE)
            header = page.get_by_test_id("stHeader").bounding_box()
            assert top >= (header["height"] if header else 0) - 1, (k, top, header)
            sizes = page.evaluate(TEXT_SIZES)
            assert sizes[0][0] >= 22, (width, k, [s for s in sizes if s[0] < 22][:10])
            assert not page.evaluate(TEXT_OUTSIDE), (width, k)
            assert not page.evaluate(SELECT_CUT), (width, k)  # the stage's name is whole
        page.close()


def test_on_a_phone_no_legend_title_or_toolbar_covers_a_chart(browser, url):
    """At 390×844 on Generate, KV cache and every stage of Step by step: no legend on a plot, no
    chart text outside its figure, the chart toolbar over no text (its box, shown or not), no
    chart running past its box under the next element."""
    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.goto(f"{url}/?example=qa")
    wait_for_app(page)
    page.get_by_text("stopped because").wait_for(timeout=60_000)
    token = page.evaluate("new URLSearchParams(location.search).get('s')")

    def clear(where: str) -> None:
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length > 0",
                               timeout=30_000)
        page.wait_for_timeout(500)  # plotly lays a chart out again once its width is known
        assert not page.evaluate(TEXT_OUTSIDE), where
        assert not page.evaluate(CHART_OVERLAPS), where

    clear("Generate")
    page.goto(f"{url}/kvcache?s={token}")
    wait_for_app(page)
    clear("KV cache")
    page.goto(f"{url}/story?s={token}")
    wait_for_app(page)
    at_stage(page, 0)
    for k in range(1, len(STAGES)):
        page.keyboard.press("ArrowRight")
        at_stage(page, k)
        clear(STAGES[k])
    page.close()
