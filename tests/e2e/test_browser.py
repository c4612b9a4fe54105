"""End to end: a real `streamlit run` server and real headless Chromium (never skipped)."""

from __future__ import annotations

from playwright.sync_api import expect

from engine.files import read_trace_file
from ui.replay import trace_waits

from .browser import (
    WATCH_RUN,
    check_run,
    generate_and_wait,
    go_to,
    no_exception,
    open_app,
    start_generation,
    wait_for_app,
)

LONG_PROMPT = "Write a long story about a dragon who learns to bake bread."
GEN = ".ie-chips .ie-gen"
OVERLAP_MS = 500  # the longest a busy browser may show a new run's prompt beside the last run
# At every change of the page: [the chips show "planets" (the new prompt), how many of the `old`
# texts the page holds, generated-token chips, the page clock in ms]
WATCH_OLD = """(old) => {
  window.__old = [];
  new MutationObserver(() => {
    const chips = document.querySelector('.ie-chips');
    const text = document.querySelector('[data-testid="stMain"]').textContent;
    window.__old.push([!!chips && chips.textContent.includes('planets'),
                       old.filter(o => text.includes(o)).length,
                       document.querySelectorAll('.ie-chips .ie-gen').length,
                       performance.now()]);
  }).observe(document.body, {childList: true, subtree: true, characterData: true});
}"""
# How many times the page fetched each preloaded front-end file (ui/preload.py CHUNKS).
CHUNK_LOADS = ("['/PlotlyChart.', '/StreamlitSyntaxHighlighter.'].map((name) => performance"
               ".getEntriesByType('resource').filter((r) => r.name.includes(name)).length)")


def test_tokens_stream_while_generating(browser, url):
    page = open_app(browser, url)
    # the chart's and the code block's browser code, loaded once the page is usable (ui/preload.py)
    page.wait_for_function(f"{CHUNK_LOADS}.every((n) => n === 1)", timeout=60_000)
    # the KV cache off: every step recomputes the sequence, so the run lasts seconds, not the
    # half second of the native step, and a CPU-starved browser (CI starts vLLM meanwhile) still
    # renders frames of it instead of only its end
    page.get_by_test_id("stSidebarUserContent").get_by_text("KV cache", exact=True).click()
    wait_for_app(page)
    start_generation(page, LONG_PROMPT)
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
    assert page.evaluate(CHUNK_LOADS) == [1, 1]  # the run's chart and answer used that code
    no_exception(page)
    # the share panel is drawn after the page: the session's first run can be published at once
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_text("Share this view").click()
    expect(sidebar.get_by_role("button", name="Publish a link to this run")).to_be_enabled()

    # A second run: once it shows its prompt, nothing of the first run is on screen (its summary
    # line, its answer), and it shows its prompt before its first token (no stale page meanwhile)
    main = page.get_by_test_id("stMain")
    old = [main.get_by_text("stopped because").inner_text()[:60],
           main.get_by_test_id("stCode").first.inner_text()[:40]]
    page.evaluate(WATCH_OLD, old)
    start_generation(page, "Name three planets.")
    page.wait_for_function("() => (document.querySelector('.ie-chips')?.textContent ?? '')"
                           ".includes('planets') && document.body.innerText.includes('stopped "
                           "because')", timeout=180_000)  # the chips are redrawn: null between
    wait_for_app(page)
    log = page.evaluate("window.__old")  # [new prompt, old texts shown, generated chips, ms]
    shown = [r for r in log if r[0]]
    # the previous run's answer and summary go as the new prompt comes: a busy browser may paint
    # the new chips a few frames before it removes them, never for long (the flash this guards
    # against lasted 1.5 s)
    assert shown and not [r for r in shown if r[1] and r[3] > shown[0][3] + OVERLAP_MS], log
    # the prompt no later than the first token: a busy server may send both in one message
    assert shown[0][2] <= 1, "the prompt is shown before the tokens"
    no_exception(page)
    page.close()


def test_stop_keeps_partial_output(browser, url):
    # room for 200 tokens: the run is still going when the click lands, however busy the machine
    page = open_app(browser, f"{url}/?new_tokens=200")
    start_generation(page, LONG_PROMPT)
    page.wait_for_function(f"document.querySelectorAll('{GEN}').length >= 4", timeout=120_000)
    page.get_by_test_id("stMain").get_by_role("button", name="Stop").click()  # not the header's
    # the Stop click reruns the script: wait for that rerun's summary, not a gap between runs
    page.get_by_text("you pressed Stop").wait_for(timeout=60_000)
    wait_for_app(page)
    kept = page.locator(GEN).count()
    assert 4 <= kept < 200
    assert page.get_by_text("you pressed Stop").count() == 1
    no_exception(page)
    page.close()


def test_download_then_upload_replays(browser, url, tmp_path):
    page = open_app(browser, url)
    generate_and_wait(page, "What is the capital of France?")
    generated = page.locator(GEN).count()
    go_to(page, "KV cache")
    page.get_by_role("tab", name="Shrinking it").click()
    page.evaluate(WATCH_RUN, "Measure memory")
    page.get_by_role("button", name="Measure memory and quality").click()
    page.get_by_text("KL(full ‖ variant), nats").wait_for(timeout=120_000)  # an experiment result
    wait_for_app(page)
    check_run(page)  # one button, one tab bar, the running indicator
    go_to(page, "Generate")
    with page.expect_download() as info:
        page.get_by_role("button", name="Download trace").click()
    path = tmp_path / "run.npz"
    info.value.save_as(path)
    opened = read_trace_file(path)
    assert len(opened.trace.steps) == generated
    assert len(opened.experiments.cache_variants) == 5  # the lecture pack carries the result
    page.close()

    fresh = open_app(browser, url)  # a new session: no trace, no model needed to replay
    # At half the recorded pace the frames lie twice as far apart, so that a busy test machine's
    # server, which merges the updates it has not yet sent, still sends some one by one.
    fresh.get_by_text("0.5×", exact=True).click()
    wait_for_app(fresh)
    fresh.evaluate("() => { window.__seen = []; new MutationObserver(() => window.__seen.push("
                   f"[performance.now(), document.querySelectorAll('{GEN}').length])).observe("
                   "document.body, {childList: true, subtree: true}); }")
    t0 = fresh.evaluate("performance.now()")
    fresh.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))
    fresh.wait_for_function(f"document.querySelectorAll('{GEN}').length === {generated}",
                            timeout=60_000)
    wait_for_app(fresh)
    assert fresh.get_by_text("at 0.5× its recorded pace").count() == 1
    # The replay keeps the recorded pace: the server waits before each frame, so the last token
    # cannot be on screen before the sum of those waits has passed (a busy server may merge the
    # frames it has not sent yet, never send them sooner)
    done_ms = next(t for t, n in fresh.evaluate("window.__seen") if n == generated)
    assert done_ms - t0 >= 0.9 * 1000 * sum(trace_waits(opened.trace, 0.5)), "the replay is paced"
    no_exception(fresh)
    for name in ("Tokens", "Embeddings", "Attention", "KV cache"):  # views of the replayed trace
        go_to(fresh, name)
        assert fresh.locator(".js-plotly-plot").count() >= 1
        no_exception(fresh)
    fresh.get_by_role("tab", name="Shrinking it").click()  # the file's experiment, not rerun
    assert fresh.get_by_text("KL(full ‖ variant), nats").count() >= 1
    go_to(fresh, "Generate")

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
        go_to(page, name)
        no_exception(page)
        assert page.get_by_role("heading", name=name).count() >= 1
    page.close()


def test_attention_chart_downloads_as_svg(browser, url, tmp_path):
    page = open_app(browser, url)
    generate_and_wait(page, "Name a colour.")
    go_to(page, "Attention")
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


def test_a_reload_keeps_the_trace_and_the_prompt(browser, url):
    page = open_app(browser, url)
    generate_and_wait(page, "Name three colours.")
    generated = page.locator(GEN).count()
    go_to(page, "Steps")
    assert "s=" in page.url  # the session's token survives page changes
    page.reload()
    # the restored table, not "No trace yet" (right after a reload the page can read idle before
    # its first script run has drawn anything, so wait for the element itself)
    page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=60_000)
    wait_for_app(page)
    assert page.get_by_role("heading", name="Steps").count() >= 1
    assert page.get_by_text("No trace yet").count() == 0
    go_to(page, "Generate")  # restored widgets may fill in after the page reads idle: retry
    expect(page.locator(GEN)).to_have_count(generated, timeout=30_000)
    expect(page.get_by_role("textbox", name="Prompt", exact=True)).to_have_value(
        "Name three colours.", timeout=30_000)
    no_exception(page)
    page.close()


def test_the_prompt_box_keeps_its_text_across_pages(browser, url):
    """Streamlit drops a widget's value on a run whose page does not draw it: the Prompt box was
    empty on coming back to Generate from any other page, its run still shown."""
    page = open_app(browser, url)
    generate_and_wait(page, "Why is the sky blue?")
    go_to(page, "Tokens")
    go_to(page, "Generate")
    expect(page.get_by_role("textbox", name="Prompt", exact=True)).to_have_value(
        "Why is the sky blue?", timeout=30_000)
    no_exception(page)
    page.close()


def test_crafted_uploads_get_one_message(browser, url, tmp_path, lm):
    from engine import GenerationSettings, Run
    from engine.records.tracefile import trace_to_bytes
    from tests.test_hostile_files import CASES

    base = trace_to_bytes(Run(lm, "Hi", GenerationSettings(max_new_tokens=3)).run_all())
    page = open_app(browser, url)
    for i, (case, expected) in enumerate((
            ("10^9 ms latency", "latency must be a time"),
            ("layers 10^9", "layers must be a whole number"),
            ("attention inflating to 1.5 GB", "the limit here is 512 MB"))):
        path = tmp_path / f"crafted{i}.npz"  # a new name: the same one would not fire a change
        path.write_bytes(CASES[case](base))
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))
        page.get_by_text(expected).wait_for(timeout=60_000)
        wait_for_app(page)
        assert page.locator('[data-testid="stAlertContentError"]').count() == 1, case
        no_exception(page)
    page.close()
