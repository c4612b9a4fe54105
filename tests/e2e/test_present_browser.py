"""Presentation mode and chart downloads in Chromium, on an example trace (no model run)."""

from __future__ import annotations

import re

from .browser import WATCH_RUN, check_run, wait_for_app
from .measure import TEXT_OUTSIDE, TEXT_SIZES

# Effective font sizes in CSS px: an SVG text's size times the scale of its transforms (plotly
# shrinks text that does not fit inside a bar with a transform, not with font-size).
SIZES = """() => {
  const css = e => parseFloat(getComputedStyle(e).fontSize);
  const shown = e => e.getClientRects().length > 0 && e.textContent.trim();
  const svg = [...document.querySelectorAll('.main-svg text')].filter(shown).map(e => {
    const m = e.getCTM(); return [e.textContent, css(e) * (m ? Math.hypot(m.a, m.b) : 1)]; });
  const all = s => [...document.querySelectorAll(s)].filter(shown).map(css);
  return {
    body: [...document.querySelectorAll('[data-testid="stMarkdownContainer"] p')].filter(shown)
      .filter(e => !e.closest('[data-testid="stCaptionContainer"], label, button, [data-testid="stMetric"]'))
      .map(css),
    captions: all('[data-testid="stCaptionContainer"]'),
    metrics: all('[data-testid="stMetricLabel"] p, [data-testid="stMetricValue"]'),
    buttons: all('[data-testid="stMain"] button p'),
    svg,
  };
}"""


def open_example(page) -> None:
    """The Short Q&A example from Generate's expander (opened on a first visit): its replay
    shows Streamlit's running indicator while it runs, and one button to open it."""
    summary = page.get_by_text("Open an example run —")
    summary.wait_for()
    if not summary.locator("xpath=ancestor::details[1]").evaluate("d => d.open"):
        summary.click()
    page.evaluate(WATCH_RUN, "Short Q&A")
    page.locator(".st-key-example_qa button").first.click()
    page.get_by_text("stopped because").wait_for(timeout=60_000)
    wait_for_app(page)
    check_run(page)
    page.wait_for_timeout(1000)  # plotly draws after the script run has ended


def test_present_param_hides_the_sidebar_and_enlarges_text_and_charts(browser, url):
    page = browser.new_page(viewport={"width": 1920, "height": 1080})
    page.goto(f"{url}/?present=1")
    wait_for_app(page)
    open_example(page)
    assert not page.get_by_test_id("stSidebar").is_visible()
    assert not page.get_by_test_id("stToolbarActions").is_visible()
    assert not page.get_by_test_id("stMainMenu").is_visible()
    sizes = page.evaluate(SIZES)
    assert sizes["body"] and min(sizes["body"]) >= 22, sizes["body"]
    assert min(sizes["captions"]) >= 22 and min(sizes["metrics"]) >= 22 and min(sizes["buttons"]) >= 22
    assert len(sizes["svg"]) > 20  # the step chart and the top-k chart
    small = [t for t in sizes["svg"] if t[1] < 22]
    assert not small, small
    token = page.evaluate("new URLSearchParams(location.search).get('s')")
    assert token and "present=1" in page.url

    page.get_by_role("button", name="Exit presentation").click()
    page.wait_for_function("!location.search.includes('present=')", timeout=60_000)
    page.get_by_test_id("stSidebar").wait_for(state="visible", timeout=60_000)
    wait_for_app(page)
    page.wait_for_timeout(1000)
    assert "present=" not in page.url and f"s={token}" in page.url
    sizes = page.evaluate(SIZES)
    assert max(sizes["body"]) < 22 and min(t[1] for t in sizes["svg"]) < 16  # normal mode as before

    page.get_by_test_id("stSidebar").get_by_text("Presentation mode").click()  # and on again
    # the rerun that presents, not the idle page before it (a loaded CI run read it too early)
    page.wait_for_function("location.search.includes('present=1')", timeout=60_000)
    page.get_by_test_id("stSidebar").wait_for(state="hidden", timeout=60_000)
    page.close()


def test_svg_download_from_a_chart_that_is_not_attention(browser, url, tmp_path):
    page = browser.new_page(viewport={"width": 1440, "height": 900}, accept_downloads=True)
    page.goto(url)
    wait_for_app(page)
    open_example(page)
    page.get_by_test_id("stSidebar").get_by_text("svg", exact=True).click()
    wait_for_app(page)
    page.wait_for_timeout(1000)
    chart = page.locator(".js-plotly-plot").first  # Generate's step chart
    chart.hover()
    with page.expect_download() as info:
        chart.locator('.modebar-btn[data-title*="Download"]').click()
    assert info.value.suggested_filename == "generate-steps.svg"
    path = tmp_path / "chart.svg"
    info.value.save_as(path)
    assert path.read_text().startswith("<svg")
    assert page.locator('.modebar-btn[data-title*="plotly"], a.modebar-btn--logo').count() == 0
    page.close()


# Pages with charts, tables and text from an example run alone (presenting, a table is HTML:
# ui/tables.py)
PRESENTED = ["Generate", "Step by step", "Attention", "Prefill vs decode", "KV cache", "Steps"]


def test_every_text_is_22px_and_no_page_is_hidden_at_1920_and_1280(browser, url):
    """At a projector's 1920×1080: on every page with content, the smallest text on screen
    (HTML and the charts' SVG) is ≥ 22 px and no chart text (axis title, tick, bar text,
    legend) lies outside its figure; at 1920×1080 and 1280×720 every page's link is in the top
    row, none behind a "more" menu."""
    page = browser.new_page(viewport={"width": 1920, "height": 1080})
    page.goto(f"{url}/?example=qa&present=1")
    wait_for_app(page)
    page.get_by_text("stopped because").wait_for(timeout=60_000)
    # the run that presents, not one before it (a busy server can read idle between the two)
    page.locator(".st-key-present_nav").first.wait_for(timeout=60_000)
    page.get_by_test_id("stSidebar").wait_for(state="hidden", timeout=60_000)
    wait_for_app(page)
    for name in PRESENTED:
        if name != "Generate":
            page.locator(".st-key-present_nav").get_by_text(name, exact=True).click()
            heading = "Inference, step by step" if name == "Step by step" else name
            page.get_by_role("heading", name=heading).first.wait_for(timeout=60_000)
            wait_for_app(page)
            page.wait_for_timeout(1000)  # plotly draws after the script run has ended
        sizes = page.evaluate(TEXT_SIZES)
        assert len(sizes) > 40 and sizes[0][0] >= 22, (name, [s for s in sizes if s[0] < 22][:10])
        assert not page.evaluate(TEXT_OUTSIDE), name
    for width, height in ((1920, 1080), (1280, 720)):
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(300)
        links = page.locator(".st-key-present_nav").get_by_test_id("stPageLink")
        assert links.count() == 14
        for i in range(14):
            box = links.nth(i).bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= width, (width, i, box)
        assert page.get_by_test_id("stTopNav").count() == 0  # Streamlit's bar and its "N more"
        assert page.get_by_text(re.compile(r"^\d+ more$")).count() == 0
    page.close()


# Every cell of the HTML table whose header holds `header`: [text, cut (wider than its cell),
# right edge past the table's visible box], and the table's font sizes (smallest first)
TABLE_CELLS = """(header) => {
  const table = [...document.querySelectorAll('[data-testid="stTable"]')]
    .find(t => [...t.querySelectorAll('th')].some(th => th.textContent.trim() === header));
  if (!table) return null;
  const box = table.getBoundingClientRect();
  const cells = [...table.querySelectorAll('th, td')].map(c => [c.textContent.trim(),
    c.scrollWidth > c.clientWidth + 1, c.getBoundingClientRect().right > box.right + 1]);
  const sizes = [...table.querySelectorAll('th, td')].flatMap(c => [c, ...c.querySelectorAll('*')])
    .filter(e => e.textContent.trim()).map(e => parseFloat(getComputedStyle(e).fontSize));
  return {cells, sizes: sizes.sort((a, b) => a - b)};
}"""


def test_the_quantization_table_is_whole_at_1440_and_22px_presenting(browser, url, tmp_path):
    """A trace file carrying a Quantization study (made-up numbers, no model run): at 1440×900
    beside the sidebar every cell of the results table, "decoder" included, is whole; presenting,
    its cells are ≥ 22 px."""
    from dataclasses import replace

    from engine.experiments import Experiments
    from engine.files import load_trace
    from engine.records.examples import EXAMPLES_DIR
    from engine.records.tracefile import trace_to_bytes
    from tests.test_quant_study import fake_study

    study = fake_study()
    slow = replace(study.variants[2], speed=replace(study.variants[2].speed, others_share=0.7))
    study = replace(study, variants=(*study.variants[:2], slow))  # "torch eager (delayed)"
    path = tmp_path / "study.npz"
    path.write_bytes(trace_to_bytes(load_trace(EXAMPLES_DIR / "qa.npz"), Experiments(quant_study=study)))
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(url)
    wait_for_app(page)
    page.get_by_text("instant", exact=True).click()
    wait_for_app(page)
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))
    page.get_by_text("stopped because").wait_for(timeout=60_000)
    wait_for_app(page)
    token = page.evaluate("new URLSearchParams(location.search).get('s')")
    for present in ("", "&present=1"):
        page.goto(f"{url}/quantization?s={token}{present}")
        wait_for_app(page)
        page.get_by_text("torch eager (delayed)").first.wait_for(timeout=60_000)
        found = page.evaluate(TABLE_CELLS, "decoder")
        assert found and len(found["cells"]) == 12 * 4, found  # 12 columns: header + 3 variants
        assert not [c for c in found["cells"] if c[1] or c[2]], found["cells"]
        if present:
            assert found["sizes"][0] >= 22, found["sizes"][:5]
            sizes = page.evaluate(TEXT_SIZES)
            assert sizes[0][0] >= 22, [s for s in sizes if s[0] < 22][:10]
    page.close()
