"""The KV cache page's "Shrink the cache itself" in real Chromium at 1920×1080 and on a phone
(390×844): a visitor measures methods on their own run and sees one chart of quality against
bytes (a point per method and budget, labelled), the table, the heatmap of kept keys and the
command line; a long context's growth and the needle probe. Nothing drawn is cut at a figure's
edge, no text is smaller than 12 px, and the page raises nothing."""

from __future__ import annotations

import re

import pytest

from .browser import generate_and_wait, no_exception, wait_for_app
from .measure import CHART_OVERLAPS, TEXT_OUTSIDE, TEXT_SIZES
from .test_i18n_browser import words

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


# pairs of point labels of one chart drawn over each other: [chart, label, label]
LABELS_MEET = """() => {
  const out = [];
  document.querySelectorAll('.js-plotly-plot').forEach((plot, i) => {
    const boxes = [...plot.querySelectorAll('.textpoint text')]
      .map(t => [t.textContent, t.getBoundingClientRect()]).filter(([, r]) => r.width > 0);
    boxes.forEach(([a, r], j) => boxes.slice(j + 1).forEach(([b, s]) => {
      if (r.left < s.right - 1 && s.left < r.right - 1 && r.top < s.bottom - 1 && s.top < r.bottom - 1)
        out.push([i, a, b]);
    }));
  });
  return out;
}"""


def test_the_tab_and_the_methods_stay_through_presentation_mode_and_another_language(browser, url):
    """Presentation mode on and off redraws the page above the tabs, and another language
    renames the tabs and the methods: the tab and the methods chosen stay, and measuring
    works in the new language."""
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(url)
    wait_for_app(page)
    generate_and_wait(page, "Write a short story about a fox.")
    token = page.evaluate("new URLSearchParams(location.search).get('s')")
    page.goto(f"{url}/kvcache?s={token}")
    wait_for_app(page)
    page.get_by_role("tab", name="Shrink the cache itself").click()
    wait_for_app(page)
    chips = page.locator('[class*="st-key-kv_shrink_methods_"] [data-tag]').filter(visible=True)
    chosen = chips.count()
    assert chosen == 5
    page.get_by_test_id("stSidebar").get_by_text("Presentation mode").click()
    page.wait_for_function("location.search.includes('present=1')", timeout=60_000)
    wait_for_app(page)
    assert selected(page, "Shrink the cache itself")
    page.get_by_role("button", name="Exit presentation").click()
    page.wait_for_function("!location.search.includes('present=')", timeout=60_000)
    wait_for_app(page)
    assert selected(page, "Shrink the cache itself")
    page.get_by_test_id("stSidebar").get_by_text("繁體中文", exact=True).click()
    page.wait_for_url(re.compile(r"lang=zh-Hant"), timeout=60_000)
    wait_for_app(page)
    assert selected(page, words("zh-Hant", "Shrink the cache itself"))
    assert chips.count() == chosen
    assert checked(page, "kv_shrink_source") == 1
    page.get_by_label(words("zh-Hant", "Budgets (comma-separated)"), exact=True).fill("50%")
    page.get_by_role("button", name=words("zh-Hant", "Measure each method")).click()
    page.get_by_text(words("zh-Hant", "The same numbers from the shell (the run is generated "
                                      "again, greedily):")).wait_for(timeout=240_000)
    no_exception(page)
    assert checked(page, "kv_shrink_axis") == 1 and checked(page, "kv_shrink_metric") == 1
    page.get_by_test_id("stSidebar").get_by_text("English", exact=True).click()
    page.get_by_role("tab", name="Shrink the cache itself").wait_for(timeout=60_000)
    wait_for_app(page)
    assert selected(page, "Shrink the cache itself")
    assert checked(page, "kv_shrink_axis") == 1 and checked(page, "kv_shrink_metric") == 1
    picker = page.locator('[class*="st-key-kv_shrink_pick_"]').filter(visible=True)
    shown = picker.evaluate("e => e.textContent + ' ' + [...e.querySelectorAll('input')]"
                            ".map(i => i.value).join(' ')")
    assert "sparse attention, exact top-k" in shown, shown  # not the Chinese label kept
    page.close()


def checked(page, key: str) -> int:
    """How many options of the radio kept under `key` are shown chosen."""
    return page.locator(f'[class*="st-key-{key}_"] input[type="radio"]:checked').count()


def selected(page, tab: str) -> bool:
    return page.get_by_role("tab", name=tab).get_attribute("aria-selected") == "true"


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
    # each point says what its budget came to: a rank, keys per head, tokens held (on a phone,
    # in its hover: the labels of neighbouring points would meet)
    assert any(t.startswith("r=") for t in labels) and any(t.startswith("k=") for t in labels)
    assert any(t.endswith(" tok") for t in labels)
    assert page.evaluate(LABELS_MEET) == []
    shown = page.locator(".st-key-kv_shrink_chart .textpoint").filter(visible=True).count()
    assert (shown > 0) == (page.viewport_size["width"] > 640)
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
