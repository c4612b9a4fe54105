"""Issue 27's attacks on a real hosted-mode server, in Chromium: does a victim's work survive,
and how far does the server's memory grow?

A hosted server (tests/e2e/turns_load.py `hosted_server`, the model from this user's cache) and
two clients as a Space's proxy would show them (each browser context its own X-Forwarded-For).
The victim opens the `qa` example; then, one after the other:

1. 66 fresh sessions of the attacker, each opening `/?example=qa` (each page a new session);
2. 8 open sessions of the attacker, each uploading a 137 KB trace of zero attention that decodes
   to 86 MB (tests/test_fair_store.py `expanding_trace`);
3. 10 uploads of 45 MB replayed to the upload endpoint under made-up file ids, with the headers
   and cookies of a real upload the attacker's page made.

After each, a reload of the victim's address (its `?s=` token) in a new session: is the run
back? The server's RSS (its process tree) is sampled every 0.2 s throughout: the peak, and the
growth over the RSS before the attacks. From the repository root:

    python -m bench.shared_attacks [--root DIR] [--out bench/out/shared_attacks.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psutil
from playwright.sync_api import sync_playwright

from tests.e2e.browser import APP_IDLE, ROOT, launch_chromium
from tests.e2e.turns_load import HOSTILE, VICTIM, hosted_server, warmed_up
from tests.test_fair_store import expanding_trace

UPLOAD = '[data-testid="stFileUploaderDropzoneInput"]'


class Rss:
    """The peak RSS of a process tree, sampled in a thread."""

    def __init__(self, pid: int) -> None:
        self.root, self.peak, self._stop = psutil.Process(pid), 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def now(self) -> int:
        tree = [self.root, *self.root.children(recursive=True)]
        return sum(p.memory_info().rss for p in tree if p.is_running())

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self.now())

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()


def visit(browser, url: str, client: str, query: str = ""):
    page = browser.new_context(viewport={"width": 1400, "height": 1000},
                               extra_http_headers={"X-Forwarded-For": client}).new_page()
    page.goto(f"{url}/{query}")
    page.wait_for_selector(APP_IDLE, timeout=180_000)
    page.get_by_role("heading", name="Generate").first.wait_for(timeout=180_000)
    page.wait_for_selector(APP_IDLE, timeout=180_000)
    return page


def restored(browser, url: str, token: str) -> bool:
    """A reload of the victim's session: is its run back (the qa example's token chips)?"""
    page = visit(browser, url, VICTIM, f"?s={token}")
    back = page.locator(".ie-chips .ie-gen").count() > 0
    page.context.close()
    return back


def attack(root: Path, tmp: Path) -> dict:
    crafted = tmp / "crafted.npz"
    crafted.write_bytes(expanding_trace())
    log = tmp / f"server-{time.monotonic_ns()}.log"
    out: dict = {}
    with sync_playwright() as pw, hosted_server(log, root) as (url, proc):
        warmed_up(log)
        browser = launch_chromium(pw)
        victim = visit(browser, url, VICTIM, "?example=qa")
        victim.locator(".ie-chips .ie-gen").first.wait_for(timeout=60_000)
        token = parse_qs(urlsplit(victim.url).query)["s"][0]
        victim.context.close()
        rss = Rss(proc.pid)
        time.sleep(1.0)
        out["rss_before_mb"] = rss.now() / 2**20

        for _ in range(66):
            page = visit(browser, url, HOSTILE, "?example=qa")
            page.context.close()
        out["66_fresh_sessions_victim_restored"] = restored(browser, url, token)

        holders, lines = [], []
        for _ in range(8):
            page = visit(browser, url, HOSTILE)
            page.locator(UPLOAD).set_input_files(str(crafted))
            page.get_by_text("crafted.npz:").or_(page.locator(".ie-chips .ie-gen")).first.wait_for(
                timeout=120_000, state="attached")
            page.wait_for_selector(APP_IDLE, timeout=180_000)
            if not holders:
                page.screenshot(path=str(tmp.parent / "crafted-upload.png"), full_page=True)
            lines.append(page.locator('[data-testid="stAlert"]').last.text_content()[:200])
            holders.append(page)
        out["crafted_file_message"] = lines[-1]
        out["8_crafted_sessions_rss_growth_mb"] = (rss.now() - 0) / 2**20 - out["rss_before_mb"]
        out["8_crafted_sessions_victim_restored"] = restored(browser, url, token)

        page = holders[0]
        seen: list = []
        page.on("request", lambda r: seen.append(r) if "/upload_file/" in r.url else None)
        page.locator(UPLOAD).set_input_files(str(ROOT / "assets" / "examples" / "sampled.npz"))
        page.wait_for_selector(APP_IDLE, timeout=180_000)
        put = next(r for r in seen if r.method == "PUT")
        base = put.url.rsplit("/", 1)[0]
        headers = {k: v for k, v in put.headers.items() if k.lower().startswith("x-")}
        payload = {"name": "big.npz", "mimeType": "application/octet-stream",
                   "buffer": os.urandom(45 << 20)}
        statuses = [page.request.put(f"{base}/{uuid.uuid4()}", multipart={"file": payload},
                                     headers=headers).status for _ in range(10)]
        out["replayed_uploads_status"] = statuses
        time.sleep(1.0)
        out["replayed_uploads_rss_growth_mb"] = rss.now() / 2**20 - out["rss_before_mb"]
        rss.stop()
        out["rss_peak_mb"] = rss.peak / 2**20
        out["rss_peak_growth_mb"] = out["rss_peak_mb"] - out["rss_before_mb"]
        browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--out", default="bench/out/shared_attacks.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = attack(args.root.resolve(), Path(tmp))
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "root": str(args.root),
              **result}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
