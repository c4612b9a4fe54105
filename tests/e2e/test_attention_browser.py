"""The Attention page in real Chromium, at the screen sizes a user reported from (1440×900 and
1920×1080): a click on a model-view tile opens that layer and head, and its hover names them;
Play runs every decode step with the slider on the step shown, on one colour scale, never blank."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import sync_playwright

from .browser import launch_chromium, no_exception, run_then_open, wait_for_app


@pytest.fixture(scope="module")
def page(url):
    """One session with a generated trace, on the Attention page (one generation for all tests)."""
    with sync_playwright() as pw:
        chromium = launch_chromium(pw)
        page = chromium.new_page(viewport={"width": 1440, "height": 900})
        run_then_open(page, url, "Name three colours.", "Attention")
        yield page
        chromium.close()


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


def click_tile(page, column: int | None, row: int) -> str:
    """Hover, then click the model-view tile of recorded layer `column` (None: the last) and head
    `row`; returns the layer number its axis names. Asserts the hover names layer and head."""
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')]"
                           ".some(g => (g.data || []).some(t => t.type === 'scattergl')"
                           " && g.getBoundingClientRect().width > 0)", timeout=30_000)
    columns = page.evaluate(TILE_CENTRE, [0, 0])["columns"]
    page.wait_for_timeout(300)  # after the scroll
    centre = page.evaluate(TILE_CENTRE, [columns - 1 if column is None else column, row])
    layer = centre["layer"].removeprefix("L")
    page.mouse.move(centre["x"], centre["y"])
    hover = page.locator(".hoverlayer .hovertext").first
    hover.wait_for(timeout=10_000)
    assert re.search(rf"layer {layer}, head {row}, weight \d\.\d{{3}}", hover.text_content())
    page.mouse.click(centre["x"], centre["y"])
    page.wait_for_function("([layer, head]) => document.querySelector('input[aria-label=\"Layer\"]')"
                           ".value === layer && document.querySelector('input[aria-label=\"Head\"]')"
                           ".value === head", arg=[layer, str(row)], timeout=30_000)
    wait_for_app(page)
    return layer


# The model view's outline, in screen pixels: (left, top, right, bottom).
OUTLINE = """() => {
  const gd = [...document.querySelectorAll('.js-plotly-plot')]
    .find(g => (g.data || []).some(t => t.type === 'scattergl'));
  const [box] = gd.layout.shapes || [{}];
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.getBoundingClientRect();
  const x = v => r.left + xa._offset + xa.d2p(v), y = v => r.top + ya._offset + ya.d2p(v);
  return [x(box.x0), y(box.y0), x(box.x1), y(box.y1)];
}"""


def test_clicking_a_model_view_tile_opens_that_layer_and_head(page):
    assert (chosen(page, "Layer"), chosen(page, "Head")) == ("0", "0")
    page.get_by_role("tab", name="Model view").click()
    layer = click_tile(page, None, 2)  # the last recorded layer, head 2
    assert (chosen(page, "Layer"), chosen(page, "Head")) == (layer, "2")
    assert page.get_by_text(f"now: layer {layer}, head 2, outlined").count() == 1
    centre = page.evaluate(TILE_CENTRE, [page.evaluate(TILE_CENTRE, [0, 0])["columns"] - 1, 2])
    left, top, right, bottom = page.evaluate(OUTLINE)
    assert left < centre["x"] < right and top < centre["y"] < bottom, "the clicked tile is outlined"
    page.get_by_role("tab", name="Head view").click()
    legend = page.locator(".js-plotly-plot .legendtext").filter(visible=True)
    legend.first.wait_for(timeout=10_000)
    assert legend.all_text_contents() == ["head 2"]  # the clicked head, not heads 0–2
    page.get_by_role("tab", name="Model view").click()
    page.set_viewport_size({"width": 1920, "height": 1080})
    page.wait_for_timeout(1000)  # the chart resizes
    layer = click_tile(page, 1, 1)
    assert (chosen(page, "Layer"), chosen(page, "Head")) == (layer, "1")
    page.set_viewport_size({"width": 1440, "height": 900})
    no_exception(page)


# Every change of the decode chart: (the step its slider shows, the step in its title, its zmax,
# whether it is drawn). A missing chart, or one without its heatmap image, counts as not drawn.
WATCH_PLAY = """() => {
  window.__frames = [];
  const read = () => {
    const gd = [...document.querySelectorAll('.js-plotly-plot')]
      .find(g => /step \\d+:/.test(g.layout?.title?.text || ''));
    if (!gd) return [null, null, null, false];
    const current = [...gd.querySelectorAll('text.slider-label')]
      .find(e => e.textContent.startsWith('decode step'));
    return [current ? Number(current.textContent.match(/\\d+/)[0]) : null,
            Number(gd.layout.title.text.match(/step (\\d+):/)[1]), gd.data[0].zmax,
            !!gd.querySelector('.heatmaplayer image')];
  };
  let last = '';
  new MutationObserver(() => {
    const now = read();
    if (JSON.stringify(now) !== last) { last = JSON.stringify(now); window.__frames.push(now); }
  }).observe(document.body, {childList: true, subtree: true, attributes: true, characterData: true});
}"""


def test_play_moves_the_slider_with_the_chart(page):
    page.get_by_role("tab", name="Decode steps").click()
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')]"
                           ".some(g => /step 1:/.test(g.layout?.title?.text || '')"
                           " && g.querySelector('.heatmaplayer image'))", timeout=30_000)
    last = page.evaluate("() => Number([...document.querySelectorAll('.js-plotly-plot')]"
                         ".find(g => g.layout?.sliders?.length).layout.sliders[0].steps.at(-1).label)")
    assert last >= 5
    page.evaluate(WATCH_PLAY)
    page.locator(".updatemenu-item-text", has_text="Play").click()
    deadline = time.time() + 60  # ≤ 100 frames at 0.3 s
    while not page.evaluate("window.__frames.length && window.__frames.at(-1)[1]") == last:
        assert time.time() < deadline, "Play did not reach the last step"
        page.wait_for_timeout(200)
    page.wait_for_timeout(500)
    frames = page.evaluate("window.__frames")
    assert all(drawn for *_, drawn in frames), f"the chart was blank at times: {frames}"
    shown = [step for _, step, _, _ in frames]
    assert shown == sorted(shown) and set(shown) == set(range(1, last + 1)), f"every step in turn: {shown}"
    assert all(s == c for s, c, _, _ in frames), f"the slider names the step shown: {frames}"
    assert len({z for _, _, z, _ in frames}) == 1, "one colour scale for every step"
    assert page.get_by_role("tab", name="Decode steps").get_attribute("aria-selected") == "true"
    no_exception(page)
