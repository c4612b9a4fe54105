"""Fair turns, measured in a browser: how long one visitor's "Hi" takes while another visitor's
four tabs each run a long generation (issue 27: the model turn rotates between clients, not tabs).

A hosted-mode server (scripts/streamlit_app.py, the model from this user's cache) and Debian's
Chromium, as tests/e2e/turns_load.py sets them up: four tabs of a "hostile" client
(X-Forwarded-For 10.0.0.1) press Generate with the KV cache off on a ~250-token prompt (each
run holds the model until the 15 s click budget stops it); once three of them wait in the queue,
a victim (10.0.0.2) generates "Hi". Measured, per round: the victim's time from pressing Generate
to its finished run, every queue notice it was shown (place and estimate), and when each hostile
run finished. Before the rounds, the same "Hi" alone (another tab of the victim, model free). The
first round gives the turn's history its first long runs, so the second round's estimates come
from measured times of both kinds of run.

From the repository root (`--root`: serve another checkout of the app, e.g. an older commit's,
with this script and this venv):

    python -m bench.fair_turns [--root DIR] [--rounds 2] [--out bench/out/fair_turns.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.e2e.browser import ROOT, launch_chromium
from tests.e2e.turns_load import VICTIM, Contest, alone_s, hosted_server, tab, warmed_up


def one_round(contest: Contest) -> dict:
    contest.start()
    victim = contest.victim_s()
    hostile = contest.hostile_done_s()
    return {"victim_s": round(victim, 2),
            "victim_notices": [{"at_s": round(t, 2), "text": text} for t, text in contest.notices()],
            "hostile_done_after_victim_press_s": [round(t, 2) for t in hostile],
            "hostile_run_s": [round((contest.pressed - s) / 1000 + t, 2)
                              for s, t in zip(contest.starts, hostile)],
            "victim_summary": contest.victim.get_by_text("stopped because").first.inner_text()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=ROOT, help="the app checkout to serve")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="bench/out/fair_turns.json")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        log = Path(tmp) / "streamlit.log"
        with hosted_server(log, args.root.resolve()) as (url, _proc):
            warmed_up(log)
            browser = launch_chromium(pw)
            try:
                alone_page = tab(browser, url, VICTIM)
                alone = [round(alone_s(alone_page), 2) for _ in range(2)]  # the first: cold page
                contest = Contest.open(browser, url)
                rounds = [one_round(contest) for _ in range(args.rounds)]
            finally:
                browser.close()
    report = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "root": str(args.root.resolve()), "victim_alone_s": alone, "rounds": rounds,
              "bench_s": round(time.monotonic() - started, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
