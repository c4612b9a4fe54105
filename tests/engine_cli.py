"""`python -m engine ARGS` as real processes, forked from one interpreter that has imported the
CLI once: the tests that check what a real process prints for a bad argument (exit status 2, one
line on stderr, never a traceback) pay for importing torch and transformers once per session
instead of once per case.

Each case is still a process of its own, with its own exit status, stdout and stderr (file
descriptors 1 and 2, so output from C code counts too), and it ends as a process started with
`python -m engine` does (atexit handlers, interpreter shutdown). What such a process would print
while importing the CLI is captured once, when the server starts (`import_output`).

The server is `python -m tests.engine_cli`: one JSON request per line on stdin, one reply per
line on stdout.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]


class EngineCli:
    """The forking server, started with this environment (plus HF_HUB_OFFLINE=1, as the tests'
    own subprocesses use) in the repository root."""

    def __init__(self) -> None:
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.engine_cli"], cwd=ROOT, env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log, text=True)
        self.import_output: str = self._reply()["import_output"]

    def _reply(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            self._log.seek(0)
            raise RuntimeError("the engine CLI server ended: "
                               + self._log.read().decode(errors="replace")[-2000:])
        return json.loads(line)

    def run(self, *args: str, timeout: int = 120,
            memory_cap: int | None = None) -> subprocess.CompletedProcess:
        """Like subprocess.run([python, "-m", "engine", *args], capture_output=True, text=True);
        a process still running after `timeout` seconds is killed (SIGALRM: status -14). With
        `memory_cap` the case may map at most that many bytes beyond what the server had mapped
        when it forked (RLIMIT_AS: a larger allocation fails, as it would in a capped process)."""
        self._proc.stdin.write(json.dumps({"args": list(args), "timeout": timeout,
                                           "memory_cap": memory_cap}) + "\n")
        self._proc.stdin.flush()
        done = self._reply()
        return subprocess.CompletedProcess([sys.executable, "-m", "engine", *args], done["code"],
                                           done["stdout"], done["stderr"])

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._log.close()


def _text(sink: IO[bytes]) -> str:
    sink.seek(0)
    return sink.read().decode(errors="replace")


def _case(request: dict, out: IO[bytes], err: IO[bytes]) -> None:
    """In the forked child: become `python -m engine ARGS` (never returns: the CLI's SystemExit,
    or the exception a real process would die of, ends this interpreter)."""
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    signal.alarm(request["timeout"])
    if request.get("memory_cap"):
        import resource

        mapped = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        cap = mapped + request["memory_cap"]
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    main = sys.modules.pop("engine.__main__")  # run afresh as __main__, as `-m engine` does
    sys.argv = [main.__file__, *request["args"]]
    runpy.run_module("engine", run_name="__main__", alter_sys=True)
    sys.exit(0)


def _import_the_engine() -> None:
    """The CLI and every engine module a command may import when it runs (torch, transformers,
    torch._dynamo through the trace reader, ...): what each case would otherwise pay again."""
    import pkgutil

    import engine
    import engine.__main__  # noqa: F401 — first: it sets HF_HUB_OFFLINE before the rest

    for module in pkgutil.walk_packages(engine.__path__, "engine."):
        importlib.import_module(module.name)


def serve() -> None:
    replies = os.fdopen(os.dup(1), "w")
    with tempfile.TemporaryFile() as sink:  # what importing the CLI prints, on either stream
        saved = os.dup(1), os.dup(2)
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        _import_the_engine()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        imported = _text(sink)
    replies.write(json.dumps({"import_output": imported}) + "\n")
    replies.flush()
    gc.freeze()  # a child's collections and shutdown then copy fewer of the shared pages
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            pid = os.fork()
            if pid == 0:
                _case(request, out, err)
            _, status = os.waitpid(pid, 0)
            reply = {"code": os.waitstatus_to_exitcode(status), "stdout": _text(out),
                     "stderr": _text(err)}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve()
