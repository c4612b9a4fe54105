"""The test session's vLLM server (tests/conftest.py's `vllm_url`): started on first use, or in
the background when the session starts (`--vllm-in-background`, which `make test` passes), so its
minute of start-up overlaps other tests instead of holding up the first `vllm` test; and, started
next in the same way, the speculative server that tests/test_vllm_speculative.py reads.

A background start runs in a thread of the process that controls the session (the only process
without pytest-xdist, the controller with it); the URL and a status file go into the environment,
which the workers inherit; the controller stops the server when the session ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

URL_ENV = "INFERENCE_EXPLORER_VLLM_URL"
STATUS_ENV = "INFERENCE_EXPLORER_VLLM_STATUS"  # "ok", or why the background start failed
SPEC_URL_ENV = "INFERENCE_EXPLORER_VLLM_SPEC_URL"  # the speculative server (its own port)
SPEC_STATUS_ENV = "INFERENCE_EXPLORER_VLLM_SPEC_STATUS"
SPEC_STARTER_ENV = "INFERENCE_EXPLORER_VLLM_SPEC_STARTER"  # a file: the pid of its starter
SPEC_PORT_OFFSET = 2  # the speculative server's port: the default port + this
ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 900.0
STARTED: list = []  # the servers this process started in the background


def default_url() -> str:
    from engine.remote.server import DEFAULT_PORT

    return os.environ.get(URL_ENV) or f"http://127.0.0.1:{DEFAULT_PORT}/v1"


def start_and_warm(port: int):
    """A vLLM server started (eager: about a minute on two cores) that has answered one short
    request: the first request pays one-time costs, which must land in no test's timings."""
    from engine.remote.client import StreamResult, stream_completion
    from engine.remote.server import SERVED_NAME, start_server

    server = start_server(port, eager=True)
    print(f"\nvLLM started at {server.base_url} in {server.start_s:.0f} s")
    warm = StreamResult()
    stream_completion(server.base_url, SERVED_NAME, "Hello", 4, warm, lambda: False)
    if warm.finish not in ("length", "stop"):
        server.stop()
        raise RuntimeError(f"its first request failed: {warm.error}")
    return server


@dataclass(frozen=True)
class Starter:
    """`scripts/vllm_start.sh` (what `make vllm-start` runs) serving vLLM at `base_url`."""

    process: subprocess.Popen
    base_url: str

    def stop(self) -> None:
        """SIGTERM, as `kill` sends it; the starter stops vLLM's process group and exits."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Starter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_speculative(timeout_s: float = WAIT_S) -> Starter:
    """The prompt-lookup speculative server (tests/test_vllm_speculative.py) on its own port,
    started as a user starts one — `make vllm-start` with --speculate — so that the module's last
    test can stop the real server the way a user does. Not warmed: that module reads its
    counters per run."""
    from engine.remote.server import DEFAULT_PORT, healthy

    port = DEFAULT_PORT + SPEC_PORT_OFFSET
    url = f"http://127.0.0.1:{port}/v1"
    log = tempfile.NamedTemporaryFile(prefix="vllm-starter-", suffix=".log", delete=False)
    process = subprocess.Popen([str(ROOT / "scripts" / "vllm_start.sh"), "--port", str(port),
                                "--speculate"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                               env=dict(os.environ, APP_PYTHON=sys.executable),
                               start_new_session=True)
    starter = Starter(process, url)
    deadline = time.monotonic() + timeout_s
    while not healthy(url):
        if process.poll() is not None or time.monotonic() > deadline:
            starter.stop()
            tail = Path(log.name).read_text(errors="replace").strip()[-600:]
            raise RuntimeError(f"the speculative vLLM did not start: {tail}")
        time.sleep(1.0)
    print(f"\nspeculative vLLM started by scripts/vllm_start.sh at {url}")
    return starter


def start_in_background() -> None:
    """Start vLLM on the default port in a thread, then the speculative server beside it (one
    start at a time: the first is what the `vllm` unit waits for), unless INFERENCE_EXPLORER_VLLM_URL
    names a server or one answers there already (the fixture then uses it), or vLLM is not
    installed (the fixtures then fail with the reason)."""
    from engine.remote.server import DEFAULT_PORT, healthy, is_installed

    url = default_url()
    if os.environ.get(URL_ENV) or healthy(url) or not is_installed():
        return
    folder = Path(tempfile.mkdtemp(prefix="vllm-start-"))
    main, spec, spec_starter = folder / "main", folder / "speculative", folder / "speculative.pid"
    os.environ.update({URL_ENV: url, STATUS_ENV: str(main), SPEC_STATUS_ENV: str(spec),
                       SPEC_STARTER_ENV: str(spec_starter),
                       SPEC_URL_ENV: f"http://127.0.0.1:{DEFAULT_PORT + SPEC_PORT_OFFSET}/v1"})

    def say(status: Path, outcome: str) -> None:  # whole or not at all: no half is ever read
        status.with_suffix(".tmp").write_text(outcome)
        os.replace(status.with_suffix(".tmp"), status)

    def speculative() -> Starter:
        starter = start_speculative()
        say(spec_starter, str(starter.process.pid))
        return starter

    def start() -> None:
        for status, begin in ((main, lambda: start_and_warm(DEFAULT_PORT)), (spec, speculative)):
            try:
                STARTED.append(begin())
                say(status, "ok")
            except Exception as err:  # noqa: BLE001 — every test that needs the server reports it
                say(status, f"vLLM did not start: {err}")

    threading.Thread(target=start, name="vllm start", daemon=True).start()


def wait_for_background_start(status_env: str = STATUS_ENV) -> str | None:
    """None once a background start has succeeded (or none was made); else why not."""
    status = os.environ.get(status_env)
    if not status:
        return None
    deadline = time.monotonic() + WAIT_S
    while not Path(status).is_file():
        if time.monotonic() > deadline:
            return f"vLLM ({status_env}) did not start within {WAIT_S:.0f} s"
        time.sleep(1.0)
    outcome = Path(status).read_text()
    return None if outcome == "ok" else outcome


def stop_started() -> None:
    while STARTED:
        STARTED.pop().stop()
