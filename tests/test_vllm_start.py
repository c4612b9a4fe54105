"""`make vllm-start` (scripts/vllm_start.sh → `python -m engine.remote.server start`) stops the
vLLM server it started — its whole process group — when it is stopped by Ctrl-C, SIGTERM or a
closed terminal, also while vLLM is still starting.

The real script and the real supervision code run; vLLM itself is a stand-in (a real vLLM start
takes about a minute and a GiB; tests/test_vllm_speculative.py stops the real one, which the session
starts with this script, by SIGTERM): `INFERENCE_EXPLORER_VLLM` points at a folder whose venv/bin/python
runs STANDIN, which answers /health on the port it is given and starts a child of its own, as
vLLM's API server starts its engine core — both in the session the starter gives them.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.remote.server import healthy

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 60.0  # generous: the machine may be busy; never a speed claim
STANDIN = """
import http.server, os, subprocess, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
pids = os.environ["STANDIN_PIDS"]
with open(pids + ".tmp", "w") as out:
    out.write(f"{os.getpid()} {core.pid} {os.getpgid(0)}")
os.rename(pids + ".tmp", pids)
time.sleep(float(os.environ.get("STANDIN_DELAY_S", "0")))

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie waiting for its parent counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def wait_for(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S:.0f} s: {what}")
        time.sleep(0.1)


@pytest.fixture
def standin(tmp_path):
    """The folder that stands for `make vllm`'s: venv/bin/python runs STANDIN, model/ is
    complete; returns the environment for the starter."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "complete.json").write_text("{}")
    (tmp_path / "standin.py").write_text(STANDIN)
    python = tmp_path / "venv" / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / "standin.py"}" "$@"\n')
    python.chmod(0o755)
    return dict(os.environ, INFERENCE_EXPLORER_VLLM=str(tmp_path), APP_PYTHON=sys.executable,
                STANDIN_PIDS=str(tmp_path / "pids"))


def start(env: dict[str, str], port: int) -> subprocess.Popen:
    """scripts/vllm_start.sh in a session of its own, as a terminal runs a foreground job."""
    return subprocess.Popen([str(ROOT / "scripts" / "vllm_start.sh"), "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def standin_pids(env: dict[str, str]) -> tuple[int, int, int]:
    pids = Path(env["STANDIN_PIDS"])
    wait_for(pids.is_file, "the stand-in vLLM started")
    server, core, pgid = map(int, pids.read_text().split())
    return server, core, pgid


def first_line(starter: subprocess.Popen) -> str:
    """The starter's first line of output (its base URL once vLLM answers), waited for at most
    WAIT_S."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(starter.stdout.readline()), daemon=True).start()
    return lines.get(timeout=WAIT_S)


def send(starter: subprocess.Popen, how: str) -> None:
    """Ctrl-C in a terminal signals the whole foreground group; `kill` signals one process."""
    if how == "Ctrl-C":
        os.killpg(starter.pid, signal.SIGINT)
    else:
        os.kill(starter.pid, getattr(signal, how))


def clean_up(starter: subprocess.Popen, env: dict[str, str]) -> None:
    """Kill what a failed test left running: the starter and the stand-in's process group."""
    if starter.poll() is None:
        starter.kill()
        starter.wait()
    pids = Path(env["STANDIN_PIDS"])
    if pids.is_file():
        try:
            os.killpg(int(pids.read_text().split()[2]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def stopped_everything(starter: subprocess.Popen, pids: tuple[int, int, int], url: str) -> str:
    """Wait for the starter to exit; assert that vLLM's group is gone and its port closed."""
    out, _ = starter.communicate(timeout=WAIT_S)
    server, core, pgid = pids
    assert starter.returncode == 0, out
    assert not running(server) and not running(core), out
    assert group_members(pgid) == [], out
    assert not healthy(url, timeout=2.0)
    return out


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C", "SIGHUP"])
def test_stopping_the_starter_stops_the_vllm_process_group(standin, how):
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    starter = start(standin, port)
    try:
        pids = standin_pids(standin)
        assert first_line(starter).startswith(f"{url}  (healthy after")  # it waits on vLLM now
        assert healthy(url) and all(running(p) for p in pids[:2])
        assert pids[2] not in (os.getpgid(0), starter.pid)  # vLLM runs in a group of its own
        send(starter, how)
        out = stopped_everything(starter, pids, url)
        assert "stopping vLLM" in out and "vLLM stopped" in out
    finally:
        clean_up(starter, standin)


def test_a_stop_while_vllm_is_still_starting_stops_it_too(standin):
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    starter = start(dict(standin, STANDIN_DELAY_S="600"), port)  # never healthy by itself
    try:
        pids = standin_pids(standin)
        send(starter, "SIGTERM")
        stopped_everything(starter, pids, url)
    finally:
        clean_up(starter, standin)
