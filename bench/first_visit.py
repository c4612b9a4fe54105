"""First impressions, in real Chromium: what a visitor waits for on a server that has started.

Each round starts a new server (the entrypoint's own script), waits until it answers its health
check and then until its start-up work is over (its processes idle for a second), and measures:

- local mode (`make run`): the first visit until the Generate page is usable (the prompt box and
  the Generate button there, the app connected and idle: what tests/e2e/browser.py waits for), a
  second visitor's the same, and a link to a published run (`?view=…`) opened by another visitor
  until its run is on screen (its token chips, its step chart drawn, the note that it is the
  shared run; by the page's own clock, and as the test driver's waits see it) and until the app
  is idle (the rest of the page drawn);
- hosted mode (scripts/serve.sh with a Space's environment, a model cache holding the converted
  model and no compiled native step, as a Space's first start has): the first visit until usable,
  until the sidebar shows the model loaded, and its first generation from Ctrl+Enter to the first
  token on screen (pressed once the page's preloaded code is in and the browser idle: a visitor
  types a prompt first), with the engine's own TTFT of that run.

From the repository root:

    python -m bench.first_visit [--rounds 3] [--out bench/out/first_visit.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import psutil
from playwright.sync_api import sync_playwright

from tests.e2e.browser import (
    APP_CONNECTED,
    APP_IDLE,
    ROOT,
    free_port,
    generate_and_wait,
    launch_chromium,
    served,
    start_generation,
    wait_for_app,
)
from tests.e2e.test_space import seed_model_cache

PROMPT = "Name three fruits."
LOADED = "SmolLM2-135M-Instruct · cpu"  # the sidebar's label once the model is in
IDLE_CPU = 0.1  # of one core: the server has finished its start-up work
VIEWPORT = {"width": 1440, "height": 900}
# The page's preloaded front-end code (ui/preload.py) is in, or the page does not preload.
PRELOADED = ("!window.__iePreload || ['/PlotlyChart.', '/StreamlitSyntaxHighlighter.'].every("
             "(name) => performance.getEntriesByType('resource').some((r) => r.name.includes(name)))")


def idle_after(proc, longest_s: float = 180.0) -> float:
    """Seconds until the server and its children use under IDLE_CPU of a core for a second."""
    start = time.monotonic()
    root = psutil.Process(proc.pid)
    while time.monotonic() - start < longest_s:
        tree = [root, *root.children(recursive=True)]
        before = sum(p.cpu_times().user + p.cpu_times().system for p in tree)
        time.sleep(1.0)
        after = sum(p.cpu_times().user + p.cpu_times().system for p in tree if p.is_running())
        if after - before < IDLE_CPU:
            return time.monotonic() - start - 1.0
    raise RuntimeError("the server never went idle")


def usable_ms(page, url: str) -> float:
    """goto → the Generate page usable: connected, prompt box and Generate button, idle."""
    t0 = time.monotonic()
    page.goto(url)
    page.wait_for_selector(APP_CONNECTED, timeout=180_000)
    page.get_by_role("textbox", name="Prompt", exact=True).wait_for(timeout=180_000)
    button = page.get_by_role("button", name="Generate", exact=True)
    button.wait_for(timeout=180_000)
    page.wait_for_selector(APP_IDLE, timeout=180_000)
    assert button.is_enabled()
    return (time.monotonic() - t0) * 1000


def publish(page) -> str:
    """Publish the page's run; its link. (The sidebar drew before the run: a reload draws it with
    the run, restored.)"""
    page.reload()
    wait_for_app(page)
    page.locator(".ie-chips .ie-gen").first.wait_for(timeout=60_000)
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_text("Share this view").click()
    sidebar.get_by_role("button", name="Publish a link to this run").click()
    wait_for_app(page)
    sidebar.get_by_text("Published at").wait_for(timeout=60_000)
    link = sidebar.locator("[data-testid='stCode'] code").first.inner_text().strip()
    assert "view=" in link, link
    return link


# In the page, by the browser's own clock from the navigation's start (performance.now()): when
# the run is on screen, the frame after its chips, its note and a drawn trace of its step chart
# are all in the document. The test driver's own waits see it later (their polling and round
# trips: ~0.1–0.3 s here), so both are reported.
RUN_ON_SCREEN = """
window.__runShown = null;
const seen = () => document.querySelector('.ie-chips .ie-gen')
  && document.querySelector('.js-plotly-plot .main-svg .trace')
  && document.body.textContent.includes('Opened the run shared with this link');
const watch = new MutationObserver(() => {
  if (!seen()) return;
  watch.disconnect();
  requestAnimationFrame(() => { window.__runShown = performance.now(); });
});
watch.observe(document, {subtree: true, childList: true, characterData: true});
"""


def link_ms(browser, link: str) -> tuple[float, float, float]:
    """A new visitor opens the link → (its run on screen by the page's clock: the token chips,
    the step chart drawn and the note that it is the shared run; the same as the test driver
    sees it; the app idle: everything below drawn too, by the driver)."""
    page = browser.new_context(viewport=VIEWPORT).new_page()
    page.add_init_script(RUN_ON_SCREEN)
    t0 = time.monotonic()
    page.goto(link)
    page.locator(".ie-chips .ie-gen").first.wait_for(timeout=180_000)
    page.get_by_text("Opened the run shared with this link").wait_for(timeout=180_000)
    page.locator(".js-plotly-plot").first.wait_for(timeout=180_000)
    seen = (time.monotonic() - t0) * 1000
    page.wait_for_selector(APP_IDLE, timeout=180_000)
    idle = (time.monotonic() - t0) * 1000
    shown = page.wait_for_function("window.__runShown", timeout=60_000).json_value()
    page.context.close()
    return shown, seen, idle


def local_round(browser, tmp: Path) -> dict[str, float]:
    port = free_port()
    command = [sys.executable, str(ROOT / "scripts" / "streamlit_app.py"), "--server.port",
               str(port), "--server.address", "127.0.0.1", "--server.headless", "true"]
    start = time.monotonic()
    with served(command, f"http://127.0.0.1:{port}", tmp / "local.log") as (url, proc):
        health = time.monotonic() - start
        settle = idle_after(proc)
        first = browser.new_context(viewport=VIEWPORT).new_page()
        first_ms = usable_ms(first, url)
        second = browser.new_context(viewport=VIEWPORT).new_page()
        second_ms = usable_ms(second, url)
        second.context.close()
        generate_and_wait(first, PROMPT)
        link = publish(first)
        shown_ms, seen_ms, idle_ms = link_ms(browser, link)
        first.context.close()
    return {"health_s": health, "start_work_s": settle, "first_visit_usable_ms": first_ms,
            "second_visit_usable_ms": second_ms, "share_link_run_shown_ms": shown_ms,
            "share_link_run_seen_by_driver_ms": seen_ms, "share_link_idle_ms": idle_ms}


def hosted_round(browser, tmp: Path) -> dict[str, float]:
    env, port = hosted_env(tmp)
    start = time.monotonic()
    with served([str(ROOT / "scripts" / "serve.sh")], f"http://127.0.0.1:{port}",
                tmp / "hosted.log", env, replace_env=True) as (url, proc):
        health = time.monotonic() - start
        settle = idle_after(proc)
        page = browser.new_context(viewport=VIEWPORT).new_page()
        first_ms = usable_ms(page, url)
        t0 = time.monotonic()
        page.get_by_text(LOADED).wait_for(timeout=180_000)
        wait_for_app(page)
        loaded_ms = (time.monotonic() - t0) * 1000
        page.wait_for_function(PRELOADED, timeout=60_000)  # a visitor types meanwhile
        page.evaluate("new Promise((done) => requestIdleCallback(done, {timeout: 5000}))")
        t0 = start_generation(page, PROMPT)
        page.get_by_text("stopped because").wait_for(timeout=180_000)
        wait_for_app(page)
        chips = page.evaluate("window.__chips")
        first_token = next(t for t, n in chips if n >= 1) - t0
        ttft = page.get_by_test_id("stMetricValue").first.inner_text()
        engine_ttft = float(ttft.split()[0]) * (1000 if ttft.endswith(" s") else 1)
        page.context.close()
    return {"hosted_health_s": health, "hosted_start_work_s": settle,
            "hosted_first_visit_usable_ms": first_ms, "hosted_model_shown_after_ms": loaded_ms,
            "hosted_first_token_on_screen_ms": first_token, "hosted_engine_ttft_ms": engine_ttft}


def hosted_env(tmp: Path) -> tuple[dict[str, str], int]:
    """A Space's environment on a fresh port, its model cache holding the converted model and no
    compiled native step (a Space's first start)."""
    cache = tmp / f"cache-{time.monotonic_ns()}"
    seed_model_cache(cache)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    env.update(INFERENCE_EXPLORER_HOSTED="1", INFERENCE_EXPLORER_CACHE=str(cache),
               INFERENCE_EXPLORER_CLICK_S="120", PYTHON=sys.executable, PORT=str(port),
               ADDRESS="127.0.0.1", HF_HUB_OFFLINE="1")
    return env, port


def cold_round(browser, tmp: Path) -> dict[str, float]:
    """A Space waking up: the first visitor's request comes as the server starts (the browser
    asks as soon as the health check answers). Seconds from the server's start until the prompt
    box and Generate are on screen (the starting page, ui/starting.py, or the page itself), and
    — the prompt typed and Ctrl+Enter pressed at once — until its first token is on screen."""
    env, port = hosted_env(tmp)
    page = browser.new_context(viewport=VIEWPORT).new_page()
    start = time.monotonic()
    with served([str(ROOT / "scripts" / "serve.sh")], f"http://127.0.0.1:{port}",
                tmp / "cold.log", env, replace_env=True) as (url, _proc):
        health = time.monotonic() - start
        page.goto(url)
        box = page.get_by_role("textbox", name="Prompt", exact=True)
        box.wait_for(timeout=180_000)
        page.get_by_role("button", name="Generate", exact=True).wait_for(timeout=180_000)
        usable = time.monotonic() - start
        box.fill(PROMPT)
        box.press("Control+Enter")
        pressed = time.monotonic() - start
        page.locator(".ie-chips .ie-gen").first.wait_for(timeout=180_000)
        first_token = time.monotonic() - start
        page.get_by_text("stopped because").wait_for(timeout=180_000)
        answer = page.locator(".ie-chips").first.inner_text()
        page.context.close()
    return {"cold_health_s": health, "cold_usable_s": usable, "cold_pressed_s": pressed,
            "cold_first_token_s": first_token, "cold_answer": answer}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/out/first_visit.json")
    parser.add_argument("--cold", action="store_true",
                        help="only the cold start: the first visitor comes as the server starts")
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp_name, sync_playwright() as pw:
        tmp = Path(tmp_name)
        browser = launch_chromium(pw)
        for _ in range(args.rounds):
            cold = cold_round(browser, tmp)
            warm = {} if args.cold else {**local_round(browser, tmp), **hosted_round(browser, tmp)}
            rounds.append({**cold, **warm})
            print(json.dumps(rounds[-1]), flush=True)
        browser.close()
    summary = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]
               if isinstance(rounds[0][key], float)}
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
              "load_average": os.getloadavg(), "prompt": PROMPT, "rounds": rounds,
              "median": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print("\n| metric | median | min–max |\n|---|---|---|")
    for key, value in summary.items():
        values = [r[key] for r in rounds]
        print(f"| {key} | {value:.3g} | {min(values):.3g}–{max(values):.3g} |")


if __name__ == "__main__":
    main()
