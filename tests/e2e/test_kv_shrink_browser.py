"""The KV cache page's "Shrink the cache itself" in real Chromium at 1920×1080 and on a phone
(390×844): a visitor measures methods on their own run and sees one chart of quality against
bytes (a point per method and budget, labelled), the table, the heatmap of kept keys and the
command line; a long context's growth and the needle probe. Nothing drawn is cut at a figure's
edge, no text is smaller than 12 px, and the page raises nothing."""

from __future__ import annotations

import pytest

from .browser import generate_and_wait, no_exception, wait_for_app
from .measure import CHART_OVERLAPS, TEXT_OUTSIDE, TEXT_SIZES

SIZES = {"desktop": (1920, 1080), "phone": (390, 844)}


@pytest.fixture(scope="module", params=list(SIZES))
def page(request, browser, url):
    width, height = SIZES[request.param]
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(url)
    wait_for_app(page)
    generate_and_wait(page, "Write a short story about a fox.")
    token = page.evaluate("new URLSearchParams(location.search).get('s')")
    page.goto(f"{url}/kvcache?s={token}")  # the session's own link: its run comes along
    wait_for_app(page)
    page.get_by_role("tab", name="Shrink the cache itself").click()
    wait_for_app(page)
    yield page
    page.close()


def shown_charts(page) -> int:
    return page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')]"
                         ".filter(g => g.getBoundingClientRect().width > 0).length")


def test_methods_measured_on_the_run_draw_one_chart_and_the_kept_keys(page):
    page.get_by_role("button", name="Measure each method").click()
    page.get_by_text("The same numbers from the shell").wait_for(timeout=240_000)
    wait_for_app(page)
    no_exception(page)
    assert shown_charts(page) >= 2  # quality against bytes, and the kept keys' heatmap
    labels = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot .textpoint text')]"
                           ".map(t => t.textContent)")
    assert {"25%", "50%"} <= set(labels)
    assert page.locator("code").filter(has_text="kv-shrink").count() >= 1
    page.wait_for_timeout(500)  # plotly lays a chart out again once its width is known
    assert page.evaluate(TEXT_OUTSIDE) == []
    assert page.evaluate(CHART_OVERLAPS) == []
    small = [t for t in page.evaluate(TEXT_SIZES) if t[0] < 12]
    assert small == [], small[:5]


def test_a_long_context_and_the_needle(page):
    page.get_by_role("button", name="Measure each length").click()
    page.get_by_text("the cache grows by").wait_for(timeout=240_000)
    page.get_by_role("button", name="Hide the needle and ask").click()
    page.get_by_text("finds the needle").wait_for(timeout=240_000)
    wait_for_app(page)
    no_exception(page)
    page.wait_for_timeout(500)
    assert page.evaluate(TEXT_OUTSIDE) == [] and page.evaluate(CHART_OVERLAPS) == []
