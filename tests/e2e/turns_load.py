"""One visitor's four tabs against another visitor's "Hi", in real Chromium on a hosted-mode server:
the browser test of fair turns (test_fair_turns_browser.py) and its benchmark (bench/fair_turns.py).

Two clients as a Space's proxy would show them: each client is one browser (a browser context,
its tabs pages of it, sharing the server's cookie) sending its own X-Forwarded-For, which
reaches the websocket (`st.context.headers`) and which hosted mode reads as the proxy's entry
(ui/clients.py). The hostile client's tabs open the Generate page with the
KV cache off and 64 new tokens (a share link's settings) and press Generate on a ~250-token
prompt: each run holds the model turn until the per-click budget stops it. Times are the
browser's own clock (`Date.now()` at the keypress and when the page changed), so Playwright's
polling adds nothing.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .browser import APP_IDLE, ROOT, free_port, served

HOSTILE = "10.0.0.1"
VICTIM = "10.0.0.2"
TABS = 4
# about 250 tokens with the chat template, under the hosted limit of 256
LONG_PROMPT = "Tell me a long story about " + " and ".join(["a red fox"] * 54)
LONG_SETTINGS = "?kv_cache=0&new_tokens=64"
LOADED = "SmolLM2-135M-Instruct · cpu"  # the sidebar's line once the model is loaded
# Records, in the browser's clock, when the script run that drew a run's summary line ended
# (`done`: the first time the app is idle with the summary shown, after a script run was seen
# since the watch began: a previous run's summary does not count) and each distinct queue
# notice ("Busy: …") the page showed.
WATCH = """() => {
  const log = window.__fair = {ran: false, done: null, notices: []};
  const app = document.querySelector('[data-testid="stApp"]');
  new MutationObserver(() => {
    const state = app.dataset.testScriptState;
    if (state === 'running') log.ran = true;
    for (const alert of document.querySelectorAll('[data-testid="stAlert"]')) {
      const m = alert.textContent.match(/Busy:.*?keep this page open\\./);
      if (m && (!log.notices.length || log.notices[log.notices.length - 1][1] !== m[0]))
        log.notices.push([Date.now(), m[0]]);
    }
    if (log.ran && log.done === null && state === 'notRunning'
        && document.body.textContent.includes('stopped because')) log.done = Date.now();
  }).observe(document.body, {childList: true, subtree: true, characterData: true,
                             attributes: true, attributeFilter: ['data-test-script-state']});
}"""

# A class at once (bench/class_bench.py, test_space.py): in the browser's clock (one browser:
# every page's), a run's first generated chip, the first exception or error shown, and its
# summary line once the app is idle again.
WATCH_CLASS = """() => {
  const log = window.__class = {ran: false, first: null, done: null, error: null};
  const app = document.querySelector('[data-testid="stApp"]');
  new MutationObserver(() => {
    const state = app.dataset.testScriptState;
    if (state === 'running') log.ran = true;
    if (log.first === null && document.querySelectorAll('.ie-chips .ie-gen').length > 0)
      log.first = Date.now();
    if (log.error === null && document.querySelector(
        '[data-testid="stException"], [data-testid="stAlertContentError"]')) log.error = Date.now();
    if (log.ran && log.done === null && state === 'notRunning'
        && document.body.textContent.includes('stopped because')) log.done = Date.now();
  }).observe(document.body, {childList: true, subtree: true, characterData: true,
                             attributes: true, attributeFilter: ['data-test-script-state']});
}"""


def hosted_server(log_path: Path, root: Path = ROOT, env: dict[str, str] | None = None):
    """A hosted-mode `streamlit run` of `root`'s app (scripts/streamlit_app.py, the model from
    this user's cache) on a free loopback port: a context manager of (url, process)."""
    port = free_port()
    command = [sys.executable, str(root / "scripts" / "streamlit_app.py"), "--server.port",
               str(port), "--server.address", "127.0.0.1", "--server.headless", "true"]
    return served(command, f"http://127.0.0.1:{port}", log_path,
                  {"INFERENCE_EXPLORER_HOSTED": "1", "PYTHONPATH": str(root), **(env or {})},
                  cwd=root)


def warmed_up(log_path: Path, timeout_s: float = 180.0) -> None:
    """Wait until the server's start-up run (ui/startup.py) has left the model turn: a tab that
    presses Generate during it would queue behind it, as behind a visitor's run."""
    deadline = time.monotonic() + timeout_s
    while "warmed up in" not in log_path.read_text(errors="replace"):
        assert "start-up: could not" not in log_path.read_text(errors="replace"), log_path
        assert time.monotonic() < deadline, f"no warm-up in {timeout_s:.0f} s; see {log_path}"
        time.sleep(0.2)


PRESS_AT = """(at) => {
  const box = document.activeElement;  // the Prompt box, filled and focused
  setTimeout(() => box.dispatchEvent(new KeyboardEvent('keydown', {
    key: 'Enter', code: 'Enter', ctrlKey: true, bubbles: true, cancelable: true})),
    Math.max(0, at - Date.now()));
}"""  # Control+Enter in the focused box at the wall-clock time `at` (ms): pages press together


_CONTEXTS: dict[str, object] = {}  # each client's browser context (its tabs share its cookie)


def tab(browser, url: str, client: str, query: str = ""):
    """A tab of `client` (a page of its browser context: its own Streamlit session) on the
    Generate page, the model loaded."""
    context = _CONTEXTS.get(client)
    if context is None or context.browser is not browser or not browser.is_connected():
        context = browser.new_context(viewport={"width": 1400, "height": 1000},
                                      extra_http_headers={"X-Forwarded-For": client})
        _CONTEXTS[client] = context
    page = context.new_page()
    page.goto(f"{url}/{query}")
    page.get_by_text(LOADED).first.wait_for(timeout=180_000)
    page.wait_for_selector(APP_IDLE, timeout=180_000)
    return page


def press(page, prompt: str) -> float:
    """Watch the page (WATCH), type the prompt and press Ctrl+Enter; the browser's clock (ms) at
    the keypress."""
    page.evaluate(WATCH)
    box = page.get_by_role("textbox", name="Prompt", exact=True)
    box.fill(prompt)
    pressed = page.evaluate("Date.now()")
    box.press("Control+Enter")
    return pressed


def done_at(page, timeout_s: float = 300.0) -> float:
    """When (browser clock, ms) the page's run had finished and its summary was shown; waits."""
    page.wait_for_function("window.__fair.done !== null", timeout=timeout_s * 1000, polling=100)
    return page.evaluate("window.__fair.done")


def alone_s(page, prompt: str = "Hi") -> float:
    """Seconds from pressing Generate to the finished run, with the model free."""
    pressed = press(page, prompt)
    return (done_at(page) - pressed) / 1000


@dataclass
class Contest:
    """The hostile client's tabs (the first one runs, the others wait) and the victim's tab, the
    victim's Generate pressed at `pressed` (browser clock, ms)."""

    hostile: list
    victim: object
    starts: list[float] = field(default_factory=list)
    pressed: float = 0.0

    @classmethod
    def open(cls, browser, url: str) -> "Contest":
        return cls([tab(browser, url, HOSTILE, LONG_SETTINGS) for _ in range(TABS)],
                   tab(browser, url, VICTIM))

    def start(self) -> None:
        """Every hostile tab presses Generate; once all but one wait in the queue (which one
        runs depends on whose script reached the turn first, not on the order of the
        keypresses), the victim does."""
        self.starts = [press(page, LONG_PROMPT) for page in self.hostile]
        deadline = time.monotonic() + 120
        while sum(page.evaluate("window.__fair.notices.length > 0")
                  for page in self.hostile) < TABS - 1:
            assert time.monotonic() < deadline, "the hostile tabs were not queued"
            time.sleep(0.1)
        self.pressed = press(self.victim, "Hi")

    def victim_s(self) -> float:
        """Seconds from the victim's keypress to its finished run; waits for it."""
        return (done_at(self.victim) - self.pressed) / 1000

    def notices(self) -> list[tuple[float, str]]:
        """The victim's queue notices: (seconds after its keypress, text)."""
        return [((t - self.pressed) / 1000, text)
                for t, text in self.victim.evaluate("window.__fair.notices")]

    def hostile_done_s(self, upto: int = TABS) -> list[float]:
        """Seconds after the victim's keypress at which the first `upto` hostile tabs' runs had
        finished on screen; waits for them."""
        return [(done_at(page) - self.pressed) / 1000 for page in self.hostile[:upto]]
