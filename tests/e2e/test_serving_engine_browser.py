"""The Serving engine page in real Chromium against the real vLLM server: a 4-request × 16-token
load runs live, its Gantt, tokens/s, server gauges and client-vs-server table are drawn, the
load survives a reload, and presentation mode draws it. SERVING_ENGINE_SHOTS=folder saves
screenshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from .browser import go_to, launch_chromium, wait_for_app

pytestmark = pytest.mark.vllm
SHOTS = os.environ.get("SERVING_ENGINE_SHOTS")
PAGE = "Serving engine"
PLOTS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(g => ({
  title: (g._fullLayout.title.text || '').replace(/<[^>]+>/g, ''),
  names: g.data.map(d => d.name), xtitle: g._fullLayout.xaxis.title.text,
  xs: g.data.map(d => d.x ? [...d.x] : []), ys: g.data.map(d => d.y ? [...d.y] : []),
  width: g.getBoundingClientRect().width}))"""
GANTT = "Every request over time, as the client saw it"
DRAWN = """(titles) => titles.every(t => [...document.querySelectorAll('.js-plotly-plot')].some(
  g => g._fullLayout && (g._fullLayout.title.text || '').replace(/<[^>]+>/g, '') === t
       && g.getBoundingClientRect().width > 0))"""
CHARTS = [GANTT, "The server's own gauges (/metrics, about every 0.5 s)", "Tokens per second"]


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def page(vllm_url, url):  # vLLM first: the page asks for its models on load
    with sync_playwright() as pw:
        chromium = launch_chromium(pw)
        page = chromium.new_page(viewport={"width": 1440, "height": 900})
        page.goto(url)
        wait_for_app(page)
        go_to(page, PAGE)
        yield page
        chromium.close()


def test_a_real_load_runs_live_and_is_drawn(page):
    vllm = os.environ.get("INFERENCE_EXPLORER_VLLM_URL", "http://127.0.0.1:8011/v1")
    box = page.get_by_role("textbox", name="OpenAI-compatible base URL")
    if box.input_value() != vllm:
        box.fill(vllm)
        box.press("Enter")
        wait_for_app(page)
    expect(page.get_by_text("serves:").first).to_be_visible(timeout=30_000)
    requests = page.get_by_role("spinbutton", name="Requests", exact=True)
    requests.fill("4")
    tokens = page.get_by_role("spinbutton", name="Max new tokens", exact=True)
    tokens.fill("16")
    tokens.press("Enter")  # the form submits from the keyboard
    expect(page.get_by_text("Showing your load")).to_be_visible(timeout=180_000)
    wait_for_app(page)
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    # Plotly draws after the script has finished (the final charts replace the live ones under
    # new keys): wait for all three, drawn, before reading them.
    page.wait_for_function(DRAWN, arg=CHARTS, timeout=60_000)
    plots = {p["title"]: p for p in page.evaluate(PLOTS)}
    gantt = plots[GANTT]
    assert gantt["xtitle"] == "time since the load started (s)"
    assert sorted(set(gantt["ys"][2])) == [f"request {i}" for i in range(4)]  # decode bars
    assert gantt["width"] > 900
    samples = plots["The server's own gauges (/metrics, about every 0.5 s)"]["xs"][0]
    assert len(samples) >= 2
    # The server's own count of what it generated, summed from its tokens/s between samples: at
    # least a token per request (one may stop early at its end-of-text). A short load can fall
    # between two gauge samples, so its running gauge may never show it; the counter cannot.
    rate = plots["Tokens per second"]
    counted = sum(y * (x - max(s for s in samples if s < x))
                  for x, y in zip(rate["xs"][1], rate["ys"][1]))
    assert counted >= 4
    expect(page.get_by_text("client − server (ms)")).to_be_visible()
    shot(page, "serving-engine-1440")
    page.set_viewport_size({"width": 1920, "height": 1080})
    shot(page, "serving-engine-1920")


def test_the_load_survives_a_reload(page):
    page.reload()
    wait_for_app(page)
    expect(page.get_by_text("Showing your load")).to_be_visible(timeout=60_000)
    page.wait_for_function(DRAWN, arg=CHARTS, timeout=60_000)
    expect(page.get_by_text(GANTT).first).to_be_visible(timeout=30_000)
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)


def test_presentation_mode_draws_the_page(page):
    page.goto(page.url + ("&" if "?" in page.url else "?") + "present=1")  # same session token
    wait_for_app(page)
    expect(page.get_by_role("heading", name=PAGE, exact=True).first).to_be_visible(timeout=60_000)
    expect(page.get_by_text("Showing your load")).to_be_visible(timeout=60_000)
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    shot(page, "serving-engine-present-1920")


def _start_load(page, requests: str, tokens: str, concurrency: str) -> None:
    page.goto(page.url.split("?")[0])  # a new session, out of presentation mode
    wait_for_app(page)
    page.get_by_role("spinbutton", name="Requests", exact=True).fill(requests)
    page.get_by_role("spinbutton", name="Concurrency", exact=True).fill(concurrency)
    box = page.get_by_role("spinbutton", name="Max new tokens", exact=True)
    box.fill(tokens)
    box.press("Enter")
    expect(page.get_by_text("streaming")).to_be_visible(timeout=60_000)  # the progress line


def test_stop_keeps_the_partial_load(page):
    _start_load(page, "8", "32", "2")
    page.get_by_test_id("stMain").get_by_role("button", name="Stop").click()  # not the header's
    expect(page.get_by_text("stopped before the end: the partial load")).to_be_visible(
        timeout=60_000)
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    page.wait_for_function(DRAWN, arg=[GANTT], timeout=60_000)


def test_a_reload_mid_load_keeps_what_came(page):
    _start_load(page, "8", "32", "2")
    page.wait_for_timeout(1500)  # a redraw or two: the load is kept at each
    page.reload()
    wait_for_app(page)
    expect(page.get_by_text("stopped before the end: the partial load")).to_be_visible(
        timeout=60_000)
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)


def test_a_load_file_opens_and_replays_and_a_crafted_one_is_one_message(page, tmp_path):
    from engine.remote.loadfile import load_to_bytes

    from ..test_charts_remote import make_run

    page.goto(page.url.split("?")[0])
    wait_for_app(page)
    good = tmp_path / "four.loadtest.json"
    good.write_bytes(load_to_bytes(make_run()))
    upload = page.locator('[data-testid="stFileUploader"] input[type=file]')
    upload.set_input_files(str(good))
    expect(page.get_by_text("Showing file four.loadtest.json")).to_be_visible(timeout=60_000)
    page.wait_for_function(DRAWN, arg=[GANTT], timeout=60_000)
    bad = tmp_path / "crafted.json"
    bad.write_text(good.read_text().replace('"max_new_tokens":8', '"max_new_tokens":1'))
    upload.set_input_files(str(bad))
    expect(page.get_by_text("more tokens than it was allowed")).to_be_visible(timeout=60_000)
    expect(page.locator('[data-testid="stException"]')).to_have_count(0)
    expect(page.get_by_text("Showing file four.loadtest.json")).to_be_visible()  # still kept
