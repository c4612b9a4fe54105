"""The What if page in real Chromium (1440×900, then a phone's 390×844): branch the run at a
token, see the tree and both runs side by side; switch a head off; patch activations between
two prompts — each drawn with no exception, no chart text outside its figure, and the tree's
boxes inside the page."""

from __future__ import annotations

import pytest

from .browser import no_exception, run_then_open, wait_for_app
from .measure import TEXT_OUTSIDE, TEXT_SIZES


@pytest.fixture(scope="module")
def page(browser, url):
    """One session with a generated run, on the What if page (one generation for all tests)."""
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    run_then_open(page, url, "Name three fruits.", "What if")
    yield page
    page.close()


def tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()
    wait_for_app(page)


# The branch tree's SVG boxes: [left, right] of each, and the width of the page's main column.
TREE_BOXES = """() => {
  const svg = document.querySelector('[data-testid="stGraphVizChart"] svg');
  const main = document.querySelector('[data-testid="stMain"]').getBoundingClientRect();
  if (!svg) return null;
  return {boxes: [...svg.querySelectorAll('g.node')].map(g => {
    const r = g.getBoundingClientRect(); return [r.left, r.right]; }), main: [main.left, main.right],
    texts: [...svg.querySelectorAll('g.node text')].map(t => t.textContent)};
}"""


def test_branching_draws_the_tree_and_both_runs(page):
    page.get_by_role("button", name="Branch here").click()
    page.get_by_text("Reused from the KV cache").wait_for(timeout=180_000)
    wait_for_app(page)
    no_exception(page)
    tree = page.evaluate(TREE_BOXES)
    assert tree and len(tree["boxes"]) == 2, tree
    assert any(t.startswith("branch 1 · at 2:") for t in tree["texts"]), tree["texts"]
    assert page.get_by_text("The answers first differ at answer token 2").count() == 1
    page.get_by_role("heading", name="The same attention head in both").wait_for()
    page.wait_for_timeout(800)  # plotly draws after the script run
    assert not page.evaluate(TEXT_OUTSIDE)


def test_switching_a_head_off_and_the_sweep(page):
    tab(page, "Switch heads off")
    page.get_by_role("button", name="Switch off and re-run").click()
    page.get_by_text("Top-1 token").wait_for(timeout=180_000)
    page.get_by_role("button", name="Which heads matter?").click()
    page.get_by_text("The heads that move it most").wait_for(timeout=180_000)
    wait_for_app(page)
    no_exception(page)
    page.wait_for_timeout(800)
    assert not page.evaluate(TEXT_OUTSIDE)


def test_patching_draws_its_grid_with_token_labels_at_1440_and_390(page):
    tab(page, "Patch activations")
    page.get_by_role("button", name="Patch every layer and position").click()
    page.get_by_text("Cell (l, p)").wait_for(timeout=180_000)  # the result's caption
    wait_for_app(page)
    no_exception(page)
    page.wait_for_timeout(800)
    ticks = page.locator(".main-svg .xtick text").all_text_contents()
    differ = [t for t in ticks if ":" in t and "/" in t]  # "2:·Col/·Eiff": corrupt/clean token
    assert differ and any("Col" in t for t in differ), ticks
    assert not page.evaluate(TEXT_OUTSIDE)
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(1200)
    assert not page.evaluate(TEXT_OUTSIDE)
    tab(page, "Branch at a token")
    tree = page.evaluate(TREE_BOXES)
    assert tree and all(left >= tree["main"][0] - 1 for left, _ in tree["boxes"]), tree


def test_presenting_every_tab_is_22px_with_no_chart_text_outside(page):
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.get_by_test_id("stSidebar").get_by_text("Presentation mode").click()
    page.locator(".st-key-present_nav").first.wait_for(timeout=60_000)
    wait_for_app(page)
    for name in ("Branch at a token", "Switch heads off", "Patch activations"):
        tab(page, name)
        page.wait_for_timeout(1000)  # plotly draws after the script run
        sizes = page.evaluate(TEXT_SIZES)
        assert sizes[0][0] >= 22, (name, [s for s in sizes if s[0] < 22][:10])
        assert not page.evaluate(TEXT_OUTSIDE), name
