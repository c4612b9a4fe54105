"""A class at once: N visitors press Generate at the same moment on the hosted demo, with the
server's batching on and off (issue 39's table).

A hosted-mode server (tests/e2e/turns_load.py's `hosted_server`, the model from this user's
cache) and N visitors, each its own client (X-Forwarded-For 10.39.x.y, as a Space's proxy writes
it) on the Generate page with 32 new tokens, a short prompt each, all pressing Generate at once.
The visitors speak Streamlit's websocket protocol (bench/class_clients.py: a class's browsers run
on the students' machines, and Chromium pages on the bench machine would take most of its
cores); `--browser` uses Chromium contexts instead (then the two share the machine). Per
visitor, from its keypress: the first generated token's chip, and the finished run (its summary
line, then the script's end). Errors: an exception or error shown, or a run that never
finished. The server's peak RSS (VmHWM) and CPU time. Then the same with batching off
(INFERENCE_EXPLORER_BATCHING=0: one run at a time in the fair turn), on a new server, in the
same invocation.

    python -m bench.class_bench [--visitors 10 20 30] [--modes on off] [--browser]
        [--out bench/out/class_bench.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from playwright.sync_api import sync_playwright

from bench.class_clients import class_at_once
from tests.e2e.browser import APP_IDLE, launch_chromium
from tests.e2e.turns_load import LOADED, WATCH_CLASS, hosted_server, warmed_up

PROMPT = "Name three colours of the rainbow."
QUERY = "?new_tokens=32"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def server_pid(proc) -> int:
    """The Streamlit process (the launcher may exec it or run it as a child)."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    kids = children.read_text().split() if children.exists() else []
    return int(kids[0]) if kids else proc.pid


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def summary(visitors: int, first: list[float], done: list[float], errors: int) -> dict:
    return {"visitors": visitors, "first_token_s": [round(x, 2) for x in first],
            "finished_s": [round(x, 2) for x in done], "errors": errors,
            "first_median_s": round(statistics.median(first), 2) if first else None,
            "first_p90_s": round(percentile(first, 0.9), 2) if first else None,
            "first_max_s": round(max(first), 2) if first else None,
            "finished_max_s": round(max(done), 2) if done else None}


def protocol_class(url: str, visitors: int, timeout_s: float) -> dict:
    crowd = asyncio.run(class_at_once(url, visitors, PROMPT, QUERY.lstrip("?"), timeout_s))
    first = [v.first - v.pressed for v in crowd if v.first and v.pressed]
    done = [v.done - v.pressed for v in crowd if v.done and v.pressed]
    errors = sum(bool(v.errors) or v.done is None for v in crowd)
    row = summary(visitors, first, done, errors)
    row["cut_by_budget"] = sum(v.cut for v in crowd)
    row["error_texts"] = sorted({e for v in crowd for e in v.errors})[:5]
    return row


def browser_class(browser, url: str, visitors: int, timeout_s: float) -> dict:
    pages = []
    for i in range(visitors):
        context = browser.new_context(viewport={"width": 1280, "height": 900},
                                      extra_http_headers={"X-Forwarded-For":
                                                          f"10.39.{i // 250}.{i % 250 + 1}"})
        page = context.new_page()
        page.goto(f"{url}/{QUERY}")
        pages.append(page)
    for page in pages:
        page.get_by_text(LOADED).first.wait_for(timeout=300_000)
        page.wait_for_selector(APP_IDLE, timeout=300_000)
        page.evaluate(WATCH_CLASS)
        page.get_by_role("textbox", name="Prompt", exact=True).fill(PROMPT)
    pressed = []
    for page in pages:
        pressed.append(page.evaluate("Date.now()"))
        page.get_by_role("textbox", name="Prompt", exact=True).press("Control+Enter")
    deadline = time.monotonic() + timeout_s
    logs = [None] * visitors
    while time.monotonic() < deadline:
        logs = [page.evaluate("window.__class") for page in pages]
        if all(log["done"] is not None or log["error"] is not None for log in logs):
            break
        time.sleep(0.5)
    first = [(log["first"] - t) / 1000 for log, t in zip(logs, pressed) if log["first"]]
    done = [(log["done"] - t) / 1000 for log, t in zip(logs, pressed) if log["done"]]
    errors = sum(log["error"] is not None or log["done"] is None for log in logs)
    for page in pages:
        page.context.close()
    return summary(visitors, first, done, errors)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--visitors", type=int, nargs="+", default=[10, 20, 30])
    parser.add_argument("--modes", nargs="+", default=["on", "off"], choices=["on", "off"])
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--new-tokens", type=int, default=32, help="each visitor's new tokens")
    parser.add_argument("--browser", action="store_true",
                        help="Chromium contexts as the visitors (on the same machine)")
    parser.add_argument("--out", default="bench/out/class_bench.json")
    args = parser.parse_args()
    global QUERY
    QUERY = f"?new_tokens={args.new_tokens}"
    rows = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        # Playwright's sync API runs an event loop in this thread: only with --browser
        browser = launch_chromium(stack.enter_context(sync_playwright())) if args.browser else None
        for mode in args.modes:
            log = Path(tmp) / f"server-{mode}.log"
            env = {"INFERENCE_EXPLORER_BATCHING": "1" if mode == "on" else "0"}
            with hosted_server(log, env=env) as (url, proc):
                warmed_up(log)
                pid = server_pid(proc)
                for n in args.visitors:
                    used = cpu_s(pid)
                    row = (browser_class(browser, url, n, args.timeout) if browser is not None
                           else protocol_class(url, n, args.timeout))
                    row = {"batching": mode, **row, "server_cpu_s": round(cpu_s(pid) - used, 1),
                           "server_peak_rss_mb": peak_rss_mb(pid)}
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items()
                                      if not isinstance(v, list)}), flush=True)
        if browser is not None:
            browser.close()
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "prompt": PROMPT,
              "new_tokens": args.new_tokens, "clients": "Chromium" if args.browser else "protocol",
              "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print("\n| batching | visitors | first token median s | p90 s | max s | all finished s | "
          "errors | cut by the budget | server CPU s | server peak RSS MB |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batching']} | {r['visitors']} | {r['first_median_s']} | {r['first_p90_s']} | "
              f"{r['first_max_s']} | {r['finished_max_s']} | {r['errors']} | "
              f"{r.get('cut_by_budget', '–')} | {r['server_cpu_s']} | "
              f"{r['server_peak_rss_mb'] and round(r['server_peak_rss_mb'])} |")


if __name__ == "__main__":
    main()
