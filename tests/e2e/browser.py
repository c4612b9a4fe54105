"""A real Streamlit server and Debian's Chromium driven by Playwright, for tests and benchmarks.

Waiting follows Streamlit's own e2e suite: `/_stcore/health`, then the `stApp` element's
connection state CONNECTED and script state notRunning.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
APP_IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
APP_RUNNING = '[data-testid="stApp"][data-test-script-state="running"]'
APP_CONNECTED = '[data-testid="stApp"][data-test-connection-state="CONNECTED"]'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def streamlit_server(log_path: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """Start `streamlit run app.py` (through scripts/streamlit_app.py, as scripts/serve.sh does)
    on a free loopback port; yield its URL; always stop it."""
    port = free_port()
    command = [sys.executable, str(ROOT / "scripts" / "streamlit_app.py"), "--server.port", str(port),
               "--server.address", "127.0.0.1", "--server.headless", "true"]
    with served(command, f"http://127.0.0.1:{port}", log_path, env) as (url, _proc):
        yield url


@contextlib.contextmanager
def served(command: list[str], url: str, log_path: Path, env: dict[str, str] | None = None,
           cwd: Path = ROOT, replace_env: bool = False) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run a server command until `url`/_stcore/health answers ok; yield (url, process); always
    stop it. `replace_env`: `env` is the whole environment, not additions to this one."""
    full_env = dict(env or {}) if replace_env else dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=cwd, env=full_env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 120
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the server exited early; see {log_path}")
                try:
                    with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                        if resp.read().strip() == b"ok":
                            break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"the server did not become healthy; see {log_path}")
                time.sleep(0.1)
            yield url, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def launch_chromium(playwright):
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"Chromium not found at {CHROMIUM}: install Debian's `chromium` "
                           "(apt-get install chromium); browser tests never skip")
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def wait_for_app(page, timeout_ms: int = 180_000) -> None:
    page.wait_for_selector(APP_CONNECTED, timeout=timeout_ms)
    page.wait_for_selector(APP_IDLE, timeout=timeout_ms)


def go_to(page, name: str, timeout_ms: int = 180_000) -> None:
    """Clicks a page in the sidebar and waits for that page's own heading, then for idle.

    Waiting for idle alone is not enough: right after the click the old page can still read
    idle before the new page's run starts (a clean-clone CI run failed on exactly that).
    """
    page.get_by_test_id("stSidebarNav").get_by_text(name, exact=True).click()
    page.get_by_role("heading", name=name).first.wait_for(timeout=timeout_ms)
    wait_for_app(page, timeout_ms)


def open_app(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page.goto(url)
    wait_for_app(page)
    return page


# Records (ms since page load, number of generated-token chips) at every DOM change.
WATCH_CHIPS = """
() => {
  window.__chips = [];
  const count = () => document.querySelectorAll('.ie-chips .ie-gen').length;
  let last = -1;
  new MutationObserver(() => {
    const n = count();
    if (n !== last) { last = n; window.__chips.push([performance.now(), n]); }
  }).observe(document.body, {childList: true, subtree: true, characterData: true});
}
"""


def run_then_open(page, url: str, prompt: str, name: str) -> None:
    """A fresh session at `url` that generates `prompt`, then opens the page `name` (a module's
    one generation, shared by its tests)."""
    page.goto(url)
    wait_for_app(page)
    generate_and_wait(page, prompt)
    go_to(page, name)


def no_exception(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0


def start_generation(page, prompt: str) -> float:
    """Type the prompt, submit with Ctrl+Enter; return the page clock at the keypress."""
    box = page.get_by_role("textbox", name="Prompt", exact=True)
    box.fill(prompt)
    page.evaluate(WATCH_CHIPS)
    t0 = page.evaluate("performance.now()")
    box.press("Control+Enter")
    return t0


def generate_and_wait(page, prompt: str, timeout_ms: int = 180_000) -> None:
    """Generate and wait until the run has finished and its summary line is shown."""
    start_generation(page, prompt)
    page.get_by_text("stopped because").wait_for(timeout=timeout_ms)
    wait_for_app(page, timeout_ms)


# Records, at every change of the page while `name`'s run goes on: [the script is running, shown
# buttons whose text holds `name`, shown tab bars, Streamlit's running indicator shown]. Streamlit
# shows a rerun's elements as they come and keeps the last run's until then: a tree that changed
# shape during a run would show two buttons or tab bars.
WATCH_RUN = """(name) => {
  window.__run = [];
  const shown = e => e.getClientRects().length > 0;
  new MutationObserver(() => {
    const app = document.querySelector('[data-testid="stApp"]');
    const main = document.querySelector('[data-testid="stMain"]');
    const widget = document.querySelector('[data-testid="stStatusWidget"]');
    window.__run.push([app.dataset.testScriptState === "running",
      [...main.querySelectorAll('button')].filter(b => shown(b) && b.innerText.includes(name)).length,
      [...main.querySelectorAll('[role="tablist"]')].filter(shown).length,
      !!widget && shown(widget)]);
  }).observe(document.body, {childList: true, subtree: true, attributes: true});
}"""


def check_run(page) -> None:
    """What WATCH_RUN saw: never two run buttons or tab bars, the running indicator while the
    script ran."""
    log = page.evaluate("window.__run")
    running = [r for r in log if r[0]]
    assert running, "the run was seen"
    assert max(r[1] for r in log) <= 1 and max(r[2] for r in log) <= 1, log
    assert any(r[3] for r in running), "Streamlit's running indicator was shown"
