"""The Attention page in real Chromium, at the screen sizes a user reported from: a click on a
model-view tile opens that layer and head; Play moves the step slider with the chart it shows."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import sync_playwright

from .browser import generate_and_wait, go_to, launch_chromium, streamlit_server, wait_for_app


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with streamlit_server(tmp_path_factory.mktemp("server") / "streamlit.log") as address:
        yield address


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        chromium = launch_chromium(pw)
        yield chromium
        chromium.close()


def attention_page(browser, url, width: int, height: int, prompt: str):
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(url)
    wait_for_app(page)
    generate_and_wait(page, prompt)
    go_to(page, "Attention")
    return page


def no_exception(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0


def chosen(page, label: str) -> str:
    """The value a selectbox above the tabs shows."""
    return page.get_by_role("combobox", name=label, exact=True).input_value()


# The model view is the chart with the WebGL overlay; its tick values are the tile centres.
TILE_CENTRE = """([column, row]) => {
  const gd = [...document.querySelectorAll('.js-plotly-plot')]
    .find(g => (g.data || []).some(t => t.type === 'scattergl'));
  gd.scrollIntoView({block: 'center'});
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
  return {x: box.left + xa._offset + xa.d2p(xa.tickvals[column]),
          y: box.top + ya._offset + ya.d2p(ya.tickvals[row]),
          layer: xa.ticktext[column], columns: xa.tickvals.length, rows: ya.tickvals.length};
}"""


@pytest.mark.parametrize("width,height", [(1440, 900), (1920, 1080)])
def test_clicking_a_model_view_tile_opens_that_layer_and_head(browser, url, width, height):
    page = attention_page(browser, url, width, height, "Name three colours.")
    assert (chosen(page, "Layer"), chosen(page, "Head")) == ("0", "0")
    page.get_by_role("tab", name="Model view").click()
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')]"
                           ".some(g => (g.data || []).some(t => t.type === 'scattergl')"
                           " && g.getBoundingClientRect().width > 0)", timeout=30_000)
    layout = page.evaluate(TILE_CENTRE, [0, 0])
    column, row = layout["columns"] - 1, 2  # the last recorded layer, head 2
    centre = page.evaluate(TILE_CENTRE, [column, row])
    layer = centre["layer"].removeprefix("L")
    page.mouse.move(centre["x"], centre["y"])
    hover = page.locator(".hoverlayer .hovertext")
    hover.first.wait_for(timeout=10_000)
    assert re.search(rf"layer {layer}, head 2, weight \d\.\d{{3}}", hover.first.text_content())
    page.mouse.click(centre["x"], centre["y"])
    page.wait_for_function("layer => document.querySelector('input[aria-label=\"Layer\"]').value === layer",
                           arg=layer, timeout=30_000)
    wait_for_app(page)
    assert (chosen(page, "Layer"), chosen(page, "Head")) == (layer, "2")
    assert page.get_by_text(f"now: layer {layer}, head 2").count() == 1
    no_exception(page)
    page.close()


# Every change to the step slider or the decode chart: (slider value, step in the chart title,
# chart zmax, whether the chart holds a drawn heatmap).
WATCH_PLAY = """() => {
  window.__frames = [];
  const read = () => {
    const slider = document.querySelector('[data-testid="stSlider"] [role="slider"]');
    const gd = [...document.querySelectorAll('.js-plotly-plot')]
      .find(g => (g.layout?.title?.text || '').startsWith('step '));
    if (!slider || !gd) return null;
    return [Number(slider.getAttribute('aria-valuenow')),
            Number(gd.layout.title.text.match(/^step (\\d+)/)[1]), gd.data[0].zmax,
            gd.querySelectorAll('.heatmaplayer image').length > 0];
  };
  let last = '';
  new MutationObserver(() => {
    const now = read();
    if (now && JSON.stringify(now) !== last) { last = JSON.stringify(now); window.__frames.push(now); }
  }).observe(document.body, {childList: true, subtree: true, attributes: true});
}"""


def test_play_moves_the_slider_with_the_chart(browser, url):
    page = attention_page(browser, url, 1440, 900, "Count from one to twelve in words.")
    page.get_by_role("tab", name="Decode steps").click()
    slider = page.get_by_test_id("stSlider").filter(has_text="Decode step")
    last = int(slider.get_by_role("slider").get_attribute("aria-valuemax"))
    assert last >= 5
    page.evaluate(WATCH_PLAY)
    page.get_by_role("button", name="Play all steps").click()
    page.get_by_role("button", name="Pause").wait_for(timeout=30_000)
    deadline = time.time() + 60
    while page.get_by_role("button", name="Play all steps").count() == 0 and time.time() < deadline:
        page.wait_for_timeout(200)
    wait_for_app(page)
    frames = page.evaluate("window.__frames")
    settled = [(s, c) for s, c, _, _ in frames]
    steps = sorted({c for _, c in settled})
    assert steps == list(range(1, last + 1)), f"every step drawn once in turn: {settled}"
    assert settled[-1] == (last, last)
    # the slider follows the chart: each shown step also stood on the slider
    assert {s for s, _ in settled} >= set(steps)
    assert len({z for _, _, z, _ in frames}) == 1, "one colour scale for every step"
    assert all(drawn for *_, drawn in frames), "the chart is never blank"
    no_exception(page)
    page.close()
