"""The HTML report in real Chromium: opened from file:// with every network request refused, its
plotly charts draw, a hostile prompt stays text, and the Generate page's button downloads it.

Screenshots (1440×900 and 1920×1080, top of the page and the whole page) go to the test's
tmp_path, or to REPORT_SHOTS when set, to be looked at."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from charts.report import attention_focus, report_html
from engine.files import load_trace
from engine.records.examples import EXAMPLES_DIR

from .browser import open_app, wait_for_app

VIEWPORTS = ((1440, 900), (1920, 1080))
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
    report.close()
