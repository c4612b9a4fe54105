"""Browser benchmark: what a visitor sees, in real Chromium against `streamlit run`.

Measures, with a warm model: the time from pressing Generate (Ctrl+Enter) to the first generated
token on screen, and the on-screen token rate against the engine's own rate (1000 / mean ITL of
the same run's trace, downloaded from the page).

From the repository root (the packages import from there, nothing is put on sys.path):

    python -m bench.browser_bench [--rounds 3] [--out bench/out/browser.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from playwright.sync_api import sync_playwright

from engine import load_trace
from tests.e2e.browser import launch_chromium, open_app, start_generation, streamlit_server, wait_for_app

PROMPT = "Write a long story about a lighthouse keeper."


def one_round(page, tmp: Path, index: int) -> dict[str, float]:
    t0 = start_generation(page, PROMPT)
    page.get_by_text("stopped because").wait_for(timeout=180_000)
    wait_for_app(page)
    log = page.evaluate("window.__chips")
    with page.expect_download() as info:
        page.get_by_role("button", name="Download trace").click()
    path = tmp / f"round{index}.npz"
    info.value.save_as(path)
    trace = load_trace(path)
    first = next(t for t, n in log if n >= 1)
    final_n = max(n for _, n in log)
    last = next(t for t, n in log if n == final_n)
    screen_rate = (final_n - 1) / (last - first) * 1000
    engine_rate = 1000 / statistics.mean(trace.itl_ms)
    return {"first_token_on_screen_ms": first - t0, "engine_ttft_ms": trace.ttft_ms,
            "tokens": final_n, "prompt_tokens": len(trace.prompt_token_ids),
            "screen_tokens_per_s": screen_rate, "engine_tokens_per_s": engine_rate,
            "screen_vs_engine": screen_rate / engine_rate}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/out/browser.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name, sync_playwright() as pw:
        tmp = Path(tmp_name)
        with streamlit_server(tmp / "streamlit.log") as url:
            browser = launch_chromium(pw)
            page = open_app(browser, url)  # loads (warms) the model
            one_round(page, tmp, -1)  # warm-up run
            rounds = []
            for i in range(args.rounds):
                # a new visitor each round: a reload would restore the last answer (its chips on
                # screen before the new run's first token would read as that token)
                page.close()
                page = open_app(browser, url)
                rounds.append(one_round(page, tmp, i))
            browser.close()
    summary = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
              "prompt": PROMPT, "rounds": rounds, "median": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print("\n| metric | median |\n|---|---|")
    for key, value in summary.items():
        print(f"| {key} | {value:.3g} |")


if __name__ == "__main__":
    main()
