"""End to end: a real `streamlit run` server and real headless Chromium (never skipped)."""

from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from engine import load_trace

from .browser import (generate_and_wait, launch_chromium, open_app, start_generation,
                      streamlit_server, wait_for_app)

LONG_PROMPT = "Write a long story about a dragon who learns to bake bread."
GEN = ".ie-chips .ie-gen"


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


def no_exception(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0


def test_tokens_stream_while_generating(browser, url):
    page = open_app(browser, url)
    start_generation(page, "Count from one to twenty in words.")
    # the run's own summary line, not just "idle": right after the keypress the page can still
    # read idle before the rerun starts (a clean-clone CI run failed on exactly that)
    page.get_by_text("stopped because").wait_for(timeout=180_000)
    wait_for_app(page)
    log = page.evaluate("window.__chips")
    counts = [n for _, n in log]
    final = page.locator(GEN).count()
    assert final > 3
    assert len({n for n in counts if 0 < n < final}) >= 2, f"tokens arrived all at once: {counts}"
    for label in ("TTFT", "Last ITL", "Mean ITL", "Decode rate", "KV cache"):
        assert page.get_by_test_id("stMetricLabel").filter(has_text=label).count() >= 1
    assert page.locator(".js-plotly-plot").count() >= 2  # step chart and top-k chart
    no_exception(page)
    page.close()


def test_stop_keeps_partial_output(browser, url):
    page = open_app(browser, url)
    start_generation(page, LONG_PROMPT)
    page.wait_for_function(f"document.querySelectorAll('{GEN}').length >= 4", timeout=120_000)
    page.get_by_role("button", name="Stop").click()
    # the Stop click reruns the script: wait for that rerun's summary, not a gap between runs
    page.get_by_text("you pressed Stop").wait_for(timeout=60_000)
    wait_for_app(page)
    kept = page.locator(GEN).count()
    assert 4 <= kept < 48
    assert page.get_by_text("you pressed Stop").count() == 1
    no_exception(page)
    page.close()


def test_download_then_upload_replays(browser, url, tmp_path):
    page = open_app(browser, url)
    generate_and_wait(page, "What is the capital of France?")
    generated = page.locator(GEN).count()
    with page.expect_download() as info:
        page.get_by_role("button", name="Download trace").click()
    path = tmp_path / "run.npz"
    info.value.save_as(path)
    trace = load_trace(path)
    assert len(trace.steps) == generated
    page.close()

    fresh = open_app(browser, url)  # a new session: no trace, no model needed to replay
    fresh.evaluate("() => { window.__seen = []; new MutationObserver(() => window.__seen.push("
                   f"document.querySelectorAll('{GEN}').length)).observe(document.body, "
                   "{childList: true, subtree: true}); }")
    fresh.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))
    fresh.wait_for_function(f"document.querySelectorAll('{GEN}').length === {generated}",
                            timeout=60_000)
    wait_for_app(fresh)
    seen = fresh.evaluate("window.__seen")
    assert any(0 < n < generated for n in seen), "the replay streams at the recorded pace"
    no_exception(fresh)
    for name in ("Tokens", "Embeddings", "Attention", "KV cache"):  # views of the replayed trace
        fresh.get_by_test_id("stSidebarNav").get_by_text(name, exact=True).click()
        wait_for_app(fresh)
        assert fresh.locator(".js-plotly-plot").count() >= 1
        no_exception(fresh)
    fresh.get_by_test_id("stSidebarNav").get_by_text("Generate", exact=True).click()
    wait_for_app(fresh)

    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a trace at all")
    fresh.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(bad))
    fresh.get_by_text("not a valid trace file").wait_for(timeout=30_000)
    no_exception(fresh)
    fresh.close()


def test_every_page_renders(browser, url):
    page = open_app(browser, url)
    generate_and_wait(page, "Name a colour.")
    for name in ("Tokens", "Embeddings", "Attention", "Prefill vs decode", "KV cache", "Steps",
                 "Generate"):
        page.get_by_test_id("stSidebarNav").get_by_text(name, exact=True).click()
        wait_for_app(page)
        no_exception(page)
        assert page.get_by_role("heading", name=name).count() >= 1
    page.close()


def test_two_sessions_generate_at_once(browser, url):
    pages = [open_app(browser, url), open_app(browser, url)]
    prompts = ["Name three fruits.", "Name three planets."]
    for page, prompt in zip(pages, prompts):
        start_generation(page, prompt)
    for page in pages:
        page.get_by_text("stopped because").wait_for(timeout=180_000)
        wait_for_app(page)
        no_exception(page)
    texts = [p.locator(".ie-chips").inner_text() for p in pages]
    assert "fruits" in texts[0] and "planets" in texts[1]
    assert "planets" not in texts[0] and "fruits" not in texts[1]
    for page in pages:
        page.close()


def test_attention_chart_downloads_as_svg(browser, url, tmp_path):
    page = open_app(browser, url)
    generate_and_wait(page, "Name a colour.")
    page.get_by_test_id("stSidebarNav").get_by_text("Attention", exact=True).click()
    wait_for_app(page)
    page.get_by_text("svg", exact=True).click()
    wait_for_app(page)
    page.wait_for_timeout(1000)
    page.locator(".js-plotly-plot").first.hover()
    with page.expect_download() as info:
        page.locator('.modebar-btn[data-title*="Download"]').first.click()
    assert info.value.suggested_filename.endswith(".svg")
    path = tmp_path / "chart.svg"
    info.value.save_as(path)
    assert path.read_text().startswith("<svg")
    page.close()


def test_eager_vs_native_decode_on_the_real_model(browser, url):
    """The Prefill vs decode page's kernel table, driven by clicks: real model, real C build."""
    page = open_app(browser, url)
    generate_and_wait(page, "Name a colour.")
    page.get_by_test_id("stSidebarNav").get_by_text("Prefill vs decode", exact=True).click()
    wait_for_app(page)
    page.get_by_role("button", name="Measure this machine's ceilings").click()
    wait_for_app(page)
    page.get_by_role("button", name="Compare eager and native C").click()
    page.get_by_text("Greedy tokens identical").wait_for(timeout=180_000)
    wait_for_app(page)
    summary = page.get_by_text("Per token vs eager").inner_text()
    assert "native C" in summary and "compiled" not in summary  # nothing compiled on this path
    no_exception(page)
    page.close()
