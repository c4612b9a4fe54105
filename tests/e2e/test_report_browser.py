"""The HTML report in real Chromium: opened from file:// with every network request refused, its
plotly charts draw, a hostile prompt stays text, every axis label lies inside its figure (on screen,
on an A4-wide print layout, and while Chromium prints to PDF), and the Generate page's button
downloads it.

Screenshots (1440×900 and 1920×1080, top of the page and the whole page) go to the test's
tmp_path, or to REPORT_SHOTS when set, to be looked at."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import plotly.io as pio
import pytest
from streamlit.elements.lib.streamlit_plotly_theme import configure_streamlit_plotly_theme

from charts.report import attention_focus, report_html
from engine.experiments import Experiments
from engine.files import load_trace
from engine.kv.cachelab import VariantRun
from engine.kv.kvcache import CacheConfig
from engine.records.examples import EXAMPLES_DIR
from engine.timing.dtype_compare import DtypeComparison, DtypeRun
from engine.timing.sweeps import SweepPoint

from .browser import open_app, wait_for_app

VIEWPORTS = ((1440, 900), (1920, 1080))
A4_WIDTH = 794  # CSS px: 210 mm at 96 px per inch
A4_PRINTABLE = 703  # CSS px: 186 mm, A4 less assets/report.css's 12 mm @page margins
A4_PRINTABLE_HEIGHT = 1032  # CSS px: 273 mm; a taller figure could not be kept on one page
# Every text plotly writes on an axis (tick labels of every axis, secondary y included; axis
# titles), the figure's title, the legend and the colour bar.
LABELS = (".xaxislayer-above text, .yaxislayer-above text, .g-xtitle text, .g-ytitle text, "
          ".g-y2title text, .g-gtitle text, .legend text, .colorbar text")
# the ids of the figures whose legend overlaps one of their plot areas (plotly's drag rectangles)
LEGEND_ON_PLOT = """Array.from(document.querySelectorAll('.js-plotly-plot')).filter(plot => {
  const legend = plot.querySelector('.legend');
  if (!legend) return false;
  const l = legend.getBoundingClientRect();
  return Array.from(plot.querySelectorAll('.nsewdrag'), d => d.getBoundingClientRect()).some(
    r => l.left < r.right - 1 && r.left < l.right - 1 && l.top < r.bottom - 1 && r.top < l.bottom - 1);
}).map(plot => plot.id)"""
# [figure id, text, inside its figure's box (its SVG's)?] for every drawn, non-empty label
MEASURE = """(selector) => Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(plot => {
  const box = plot.querySelector('.main-svg').getBoundingClientRect();
  return Array.from(plot.querySelectorAll(selector)).map(label => [label, label.getBoundingClientRect()])
    .filter(([label, r]) => label.textContent.trim() && (r.width > 0 || r.height > 0))
    .map(([label, r]) => [plot.id, label.textContent, r.left >= box.left - 0.5
      && r.right <= box.right + 0.5 && r.top >= box.top - 0.5 && r.bottom <= box.bottom + 0.5]);
})"""
HOSTILE = '</style></script><script>alert("x")</script><img src=x onerror=alert(1)> & "q"'


def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("REPORT_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def open_offline(browser, path: Path, width: int, height: int):
    """The file in a new page whose every request but file:// is aborted; returns (page, what
    was refused, dialogs opened, script errors)."""
    page = browser.new_page(viewport={"width": width, "height": height})
    refused, dialogs, errors = [], [], []

    def route(request_route):
        if request_route.request.url.startswith("file:"):
            request_route.continue_()
        else:
            refused.append(request_route.request.url)
            request_route.abort()

    page.route("**/*", route)
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(path.as_uri())
    page.wait_for_selector(".main-svg", timeout=60_000)
    page.wait_for_load_state("load")
    return page, refused, dialogs, errors


@pytest.mark.parametrize("name", ["qa", "story"])
def test_report_opens_offline_and_draws_every_chart(browser, tmp_path, name):
    trace = load_trace(EXAMPLES_DIR / f"{name}.npz")
    path = tmp_path / f"{name}.html"
    path.write_text(report_html(trace), encoding="utf-8")
    figures = 4 if attention_focus(trace) is not None else 3
    for width, height in VIEWPORTS:
        page, refused, dialogs, errors = open_offline(browser, path, width, height)
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length "
                               f">= {figures}")
        assert page.locator(".js-plotly-plot").count() == figures
        assert refused == [] and dialogs == [] and errors == []
        # the step chart drew one bar per step, the heatmap its image
        first = page.locator(".js-plotly-plot").first
        assert first.locator(".bars .point").count() == len(trace.steps)
        assert page.locator(".js-plotly-plot .heatmaplayer image").count() == 1
        assert page.locator("#prompt").inner_text() == trace.prompt
        assert page.locator(".ie-chips .ie-gen").count() == len(trace.steps)
        # nothing wider than the window: no horizontal scrollbar
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        folder = shots(tmp_path)
        page.screenshot(path=folder / f"report-{name}-{width}.png")
        page.screenshot(path=folder / f"report-{name}-{width}-full.png", full_page=True)
        page.close()


def test_hostile_prompt_stays_text_in_the_browser(browser, tmp_path):
    trace = load_trace(EXAMPLES_DIR / "qa.npz")
    steps = list(trace.steps)
    steps[1] = replace(steps[1], piece="<img src=y onerror=alert(2)>")
    hostile = replace(trace, prompt=HOSTILE, steps=tuple(steps),
                      model=replace(trace.model, name="<script>alert(3)</script>"))
    path = tmp_path / "hostile.html"
    path.write_text(report_html(hostile), encoding="utf-8")
    page, refused, dialogs, errors = open_offline(browser, path, 1440, 900)
    assert dialogs == [] and errors == [] and refused == []
    assert page.locator("#prompt").inner_text() == HOSTILE
    assert page.locator("main img").count() == 0
    assert page.locator(".js-plotly-plot").count() == 4  # the charts after it still draw
    page.close()


def test_generate_page_downloads_the_report(browser, url, tmp_path):
    page = open_app(browser, url)
    page.get_by_role("button", name="Short Q&A").click()
    page.get_by_text("stopped because").wait_for(timeout=120_000)
    wait_for_app(page)
    with page.expect_download() as info:
        page.get_by_role("button", name="Download report (HTML)").click()
    download = info.value
    assert download.suggested_filename.endswith(".html")
    path = tmp_path / download.suggested_filename
    download.save_as(path)
    page.screenshot(path=shots(tmp_path) / "generate-buttons.png")
    page.close()
    text = path.read_text(encoding="utf-8")
    trace = load_trace(EXAMPLES_DIR / "qa.npz")
    assert text.startswith("<!DOCTYPE html>") and trace.output_text.split()[0] in text
    report, refused, dialogs, errors = open_offline(browser, path, 1440, 900)
    assert report.locator("#prompt").inner_text() == trace.prompt
    assert report.locator(".js-plotly-plot").count() == 4 and not (refused or errors)
    report.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 8")
    found = measured(report)  # made in the app's process, under Streamlit's plotly template
    assert len(found) >= 8 * 4 and outside(found) == []
    report.close()


@pytest.fixture(scope="module")
def every_chart(tmp_path_factory) -> tuple[Path, int]:
    """A saved report with every kind of figure (the run's charts, the attention heatmap, and
    experiment results of each kind), made as the app's process makes it: Streamlit's plotly
    template is then the process-wide default, and it has no automargin. (path, figures)."""
    trace = load_trace(EXAMPLES_DIR / "qa.npz")
    points = (SweepPoint(16, 30.0, 33.3, (29.0, 30.0, 31.0)),
              SweepPoint(1024, 1250.5, 0.8, (1200.0, 1250.5, 1300.0)))
    found = Experiments(
        sweeps={key: points for key in ("prompt_length", "context", "batch")},
        cache_variants=(VariantRun(CacheConfig("window", 32, 4), np.array([0.0, 0.25]),
                                   np.array([True, False]), np.array([2048.0, 1_048_576.0])),),
        dtype_comparison=DtypeComparison(64, 16, 2, "float32", (
            DtypeRun("float32", 80.0, (81.0, 79.0), 1.0, True, (5, 6)),
            DtypeRun("bfloat16", 40.0, (41.0, 39.0), 0.5, False, (5, 7)))))
    default = pio.templates.default
    configure_streamlit_plotly_theme()  # what importing Streamlit's plotly_chart does
    assert pio.templates.default == "streamlit"
    try:
        text = report_html(trace, found)
    finally:
        pio.templates.default = default
    path = tmp_path_factory.mktemp("report") / "every-chart.html"
    path.write_text(text, encoding="utf-8")
    return path, text.count("Plotly.newPlot(")


def measured(page) -> list:
    return page.evaluate(MEASURE, LABELS)


def outside(found: list) -> list:
    return [(figure, text) for figure, text, inside in found if not inside]


@pytest.mark.parametrize("media, width", [("screen", 1440), ("screen", 390), ("print", A4_WIDTH)])
def test_every_axis_label_lies_inside_its_figure(browser, every_chart, tmp_path, media, width):
    """On screen (desktop and phone widths), and in the print layout at an A4 page's width: every
    tick label, axis title, title and legend entry of every figure lies inside the figure's box,
    and no legend sits on a plot (measured from the SVG)."""
    path, figures = every_chart
    page = browser.new_page(viewport={"width": width, "height": 1000})
    page.emulate_media(media=media)
    page.goto(path.as_uri())
    page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length "
                           f">= {2 * figures}", timeout=60_000)
    found = measured(page)
    print(f"\nreport label clipping count ({media}, {width} px wide): {len(outside(found))} of "
          f"{len(found)} labels outside their figure")
    assert figures == 9 and len({f for f, _, _ in found}) == figures  # every figure measured
    assert len(found) >= 8 * figures
    assert outside(found) == []
    assert page.evaluate(LEGEND_ON_PLOT) == []
    boxes = page.evaluate("Array.from(document.querySelectorAll('figure'), f => "
                          "f.getBoundingClientRect().toJSON())")
    assert all(b["right"] <= width + 0.5 for b in boxes)
    if media == "print":  # each figure can be kept whole on a page, and is
        assert all(b["height"] <= A4_PRINTABLE_HEIGHT for b in boxes)
        assert page.evaluate("getComputedStyle(document.querySelector('figure')).breakInside") \
            == "avoid"
        assert page.locator(".modebar-container").first.is_hidden()
    page.screenshot(path=shots(tmp_path) / f"report-labels-{media}-{width}.png", full_page=True)
    page.close()


def test_printing_to_pdf_draws_each_chart_at_the_a4_width(browser, every_chart):
    """Chromium's print (page.pdf, as the browser's Print → Save as PDF) lays the page out at the
    paper's width: at that moment every chart is drawn at the printable width with every label
    inside it, and afterwards the charts follow the window again."""
    path, figures = every_chart
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length "
                           f">= {2 * figures}", timeout=60_000)
    widths = ("Array.from(document.querySelectorAll('.js-plotly-plot'), "
              "p => p.querySelector('.main-svg').getBoundingClientRect().width)")
    screen = page.evaluate(widths)
    assert min(screen) > A4_PRINTABLE
    page.evaluate(f"""(selector) => addEventListener('beforeprint', () => {{
        window.printed = {{widths: {widths}, labels: ({MEASURE})(selector)}};
    }})""", LABELS)
    pdf = page.pdf(format="A4")
    assert pdf.startswith(b"%PDF")
    printed = page.evaluate("window.printed")
    assert printed["widths"] == [A4_PRINTABLE] * figures
    assert len(printed["labels"]) >= 8 * figures and outside(printed["labels"]) == []
    page.wait_for_function(f"{widths}.every((w, i) => Math.abs(w - {screen}[i]) < 1)",
                           timeout=30_000)
    page.close()
