"""The hosted demo through its own entrypoint: scripts/serve.sh with a Space's environment (hosted
mode, a fresh HOME where scripts/prepare_model.sh loads the model as the Dockerfile does),
driven by real Chromium. No Docker engine here: the image itself is not built. The first visit is a
share link, as the server's start-up work goes on: the starting page at once, then its view.
Eight visitors (eight clients, each its own X-Forwarded-For as the Space's proxy writes it)
generate at once: their runs decode in one batch (every first token arrives before any run has
finished, steps are shared) and each gets their own prompt's greedy answer, its trace equal to
the engine's solo run. The walk includes the Prefill vs decode page's eager-vs-native
comparison, clicked as a visitor would (real model, real C build): the one browser test of
each."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from playwright.sync_api import expect, sync_playwright

from engine import GenerationSettings, Run
from engine.files import load_trace
from engine.loader import cache_root

from .browser import (
    APP_CONNECTED,
    APP_IDLE,
    WATCH_RUN,
    check_run,
    free_port,
    go_to,
    launch_chromium,
    served,
)
from .turns_load import PRESS_AT, WATCH_CLASS

ROOT = Path(__file__).resolve().parents[2]
# answers that run all 48 tokens (no early end): the eight runs overlap for their whole length
PROMPTS = ["Describe three fruits.", "Describe three planets.", "Describe three rivers.",
           "Describe three birds.", "Describe three colours.", "Describe three trees.",
           "Describe three oceans.", "Describe three metals."]

# A hang, not a speed: speed is measured in bench/browser_bench.py (docs/benchmarks.md), not asserted.
FIRST_PAGE_S = 60.0
RSS_BOUND = 4 << 30


@pytest.fixture(scope="module")
def space_env(tmp_path_factory):
    """(environment, HOME) of a hosted Space whose model cache is prepared as the image does:
    the image's script runs in a fresh HOME. The converted model it finds there is linked from
    this user's cache (`make model` converted it; tests/test_loader.py checks a conversion from
    the GGUF), so the script's load and the Space's start are tested without a second
    conversion."""
    home = tmp_path_factory.mktemp("home")
    seed_model_cache(home / ".cache" / "inference-explorer" / "models")
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_CACHE_HOME", "INFERENCE_EXPLORER_CACHE")}
    # A 120 s click budget: the budget's own cut is tested in test_hosting.py; here a busy CI
    # machine must not turn the kernel comparison's speed into a failure (a clean-clone run did).
    env.update(HOME=str(home), PYTHON=sys.executable, INFERENCE_EXPLORER_HOSTED="1",
               INFERENCE_EXPLORER_CLICK_S="120", PORT=str(free_port()), ADDRESS="127.0.0.1",
               HF_HUB_OFFLINE="1")
    done = subprocess.run([str(ROOT / "scripts" / "prepare_model.sh")], env=env, check=True,
                          capture_output=True, text=True, timeout=300)
    assert f"Loading cached model from {home}/.cache/inference-explorer/models/" in done.stdout
    assert list((home / ".cache" / "inference-explorer" / "models").glob("*/complete.json"))
    return env, home


def seed_model_cache(target: Path) -> None:
    """Hard links (a copy across file systems) of every completed converted model in this
    user's cache."""
    for folder in cache_root().glob("*/"):
        if (folder / "complete.json").is_file():
            def link(src, dst):
                try:
                    os.link(src, dst)
                except OSError:
                    shutil.copy2(src, dst)
            shutil.copytree(folder, target / folder.name, copy_function=link)


@contextmanager
def space(env: dict[str, str], home: Path):
    """(url, server process, monotonic time the entrypoint was started) of a running Space."""
    start = time.monotonic()
    with served([str(ROOT / "scripts" / "serve.sh")], f"http://127.0.0.1:{env['PORT']}",
                home / "server.log", env, cwd=home, replace_env=True) as (url, proc):
        yield url, proc, start


def rss(proc: subprocess.Popen) -> int:
    """Resident memory of the server and anything it started."""
    root = psutil.Process(proc.pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


def test_a_space_serves_eight_visitors_at_once_within_its_limits(space_env, tmp_path, lm):
    # The visitor's browser runs before the Space starts: its launch is not the Space's start-up.
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        first = browser.new_page(viewport={"width": 1440, "height": 900}, accept_downloads=True)
        traces = visit(browser, first, *space_env, tmp_path)
        browser.close()
    check_traces(lm, traces)


def visit(browser, first, env: dict[str, str], home: Path, tmp_path: Path) -> list:
    """Eight visitors on a Space started now; returns each visitor's downloaded trace."""
    with space(env, home) as (url, proc, start):
        # the first visit after the start is a share link: it opens its view, with the selectors
        # on it, while the start-up work may still run
        first.goto(f"{url}/attention?example=qa&layer=3&head=2")
        # never a blank page: while the start-up works, the starting page says what it does
        first.get_by_text("The server is starting").wait_for(timeout=60_000)
        starting_s = time.monotonic() - start
        first.wait_for_selector(APP_CONNECTED, timeout=60_000)
        first.get_by_role("heading", name="Attention").first.wait_for(timeout=60_000)
        first.wait_for_selector(APP_IDLE, timeout=60_000)
        interactive_s = time.monotonic() - start
        print(f"\nstarting page {starting_s:.1f} s, first page interactive {interactive_s:.1f} s "
              "after the entrypoint started")
        assert interactive_s <= FIRST_PAGE_S
        # the selectors can come with the run after the model is in (a hosted page draws first)
        layer = first.get_by_role("combobox", name="Layer", exact=True)
        expect(layer).to_have_value("3", timeout=60_000)
        first.goto(url)
        first.get_by_role("textbox", name="Prompt", exact=True).wait_for(timeout=60_000)
        first.wait_for_selector(APP_IDLE, timeout=60_000)
        first.get_by_text("SmolLM2-135M-Instruct · cpu").wait_for(timeout=60_000)  # loaded

        pages = [first] + [browser.new_context(
            viewport={"width": 1440, "height": 900}, accept_downloads=True,
            extra_http_headers={"X-Forwarded-For": f"10.8.0.{i}"}).new_page()
            for i in range(1, len(PROMPTS))]
        for page in pages[1:]:
            page.goto(url)
            page.get_by_text("SmolLM2-135M-Instruct · cpu").wait_for(timeout=60_000)
            page.wait_for_selector(APP_IDLE, timeout=60_000)
        for page, prompt in zip(pages, PROMPTS):
            page.evaluate(WATCH_CLASS)
            page.get_by_role("textbox", name="Prompt", exact=True).fill(prompt)
        at = pages[0].evaluate("Date.now()") + 1500  # one moment for all eight (pressing them
        for page in pages:  # one after another spreads the class over seconds)
            page.get_by_role("textbox", name="Prompt", exact=True).focus()
            page.evaluate(PRESS_AT, at)
        for page in pages:
            page.wait_for_function("window.__class.done !== null", timeout=300_000, polling=100)
        times = [page.evaluate("window.__class") for page in pages]
        print("first tokens (ms after the press):", [t["first"] - at for t in times],
              "done:", [t["done"] - at for t in times])
        assert max(t["first"] for t in times) < min(t["done"] for t in times), times
        traces = []
        for i, page in enumerate(pages):
            page.get_by_text("stopped because").wait_for(timeout=300_000)
            page.wait_for_selector(APP_IDLE, timeout=60_000)
            assert page.locator('[data-testid="stException"]').count() == 0
            page.get_by_role("button", name="Prepare the downloads (trace file and report)").click()
            with page.expect_download() as info:
                page.get_by_role("button", name="Download trace").click(timeout=60_000)
            path = tmp_path / f"visitor{i}.npz"
            info.value.save_as(path)
            traces.append(load_trace(path))
        # the eight runs were decoded together, each its own trace (equal to its solo run: below)
        assert all(t.decoder.name == "batched" for t in traces)
        assert max(s.batch for t in traces for s in t.steps) >= 4, "the steps were not shared"

        over = pages[0]
        over.get_by_role("textbox", name="Prompt", exact=True).fill("many words " * 200)
        over.get_by_role("textbox", name="Prompt", exact=True).press("Control+Enter")
        over.get_by_text("the limit is 256").wait_for(timeout=60_000)

        kernels = pages[1]
        go_to(kernels, "Prefill vs decode", 60_000)
        # a fresh Space has no stored ceilings: a click measures them
        kernels.get_by_role("button", name="Measure this machine's ceilings").click()
        kernels.get_by_text("Ceilings stored for this machine").wait_for(timeout=120_000)
        kernels.wait_for_selector(APP_IDLE, timeout=60_000)
        # the last run drew the measurement's spinner above the sweeps' tabs, this one does not:
        # one tab bar and one measure button throughout (each section in its own container)
        kernels.evaluate(WATCH_RUN, "Measure")
        kernels.get_by_role("button", name="Compare eager and native C").click()
        kernels.get_by_text("Per token vs eager").wait_for(timeout=120_000)
        kernels.wait_for_selector(APP_IDLE, timeout=60_000)
        check_run(kernels)
        assert kernels.get_by_role("button", name="Measure again").count() == 1
        assert kernels.get_by_text("Greedy tokens identical").count() >= 1
        summary = kernels.get_by_text("Per token vs eager").inner_text()
        assert "native C" in summary and "compiled" not in summary  # nothing compiled on this path
        log = (home / "server.log").read_text()  # the start-up loaded and warmed it, once
        assert log.count("start-up: model default/fp32 loaded in") == 1, log[-3000:]
        assert "start-up: could not" not in log, log[-3000:]
        memory = rss(proc)
        print(f"server RSS with the model, the native decoder and 8 sessions: "
              f"{memory / 2**30:.2f} GiB")
        assert memory < RSS_BOUND
    return traces


def check_traces(lm, traces: list) -> None:
    """Each visitor's trace equals the engine's own greedy run of their prompt."""
    for prompt, trace in zip(PROMPTS, traces):
        settings = GenerationSettings(max_new_tokens=48, max_prompt_tokens=256)
        expected = Run(lm, prompt, settings).run_all()
        assert trace.prompt == prompt and trace.settings.max_new_tokens == 48
        assert trace.output_token_ids == expected.output_token_ids, prompt
