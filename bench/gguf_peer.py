"""llama.cpp on a GGUF file, as bench/llamacpp_peer.py's worker in `make llamacpp`'s venv: started
fresh for each measurement, with llama.cpp's defaults, and restarted without its extra buffers
when it crashes with them.

Why restart rather than always run without them: the extra buffers (AMX, and weight repacking
into interleaved rows for its AVX2 / AVX-512 kernels) are llama.cpp at its best, and they crash
only on some hosts (VMs that advertise AMX without granting its tile state: SIGSEGV in
ggml_backend_amx_mul_mat, at the load or the first evaluation). A row measured without them says
so. Besides its answers, the worker's peak RSS (VmHWM) and CPU time are read from /proc while it
lives, so the parent can judge its timed window as the app judges a step (engine/clock.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER_PYTHON = ROOT / ".venv-llamacpp" / "bin" / "python"
PEER_SCRIPT = ROOT / "bench" / "llamacpp_peer.py"
NO_EXTRA = "extra buffers off: crashed with defaults"
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class PeerCrashed(RuntimeError):
    """The worker died (at load or while answering): its exit status and stderr's tail."""


def installed() -> bool:
    return PEER_PYTHON.exists()


class Worker:
    """One llama.cpp worker process on one file; `ready` is its first line (version, load_s,
    n_vocab). Raises PeerCrashed when it dies before saying it is ready."""

    def __init__(self, path: Path | str, threads: int, extra_buffers: bool = True) -> None:
        self.extra_buffers = extra_buffers
        args = [str(PEER_PYTHON), str(PEER_SCRIPT), str(path), str(threads)]
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(args + ([] if extra_buffers else ["--no-extra-buffers"]),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, cwd=ROOT)
        self.ready = self._answer()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            status = self.proc.wait(timeout=60)
            self._stderr.seek(0)
            tail = self._stderr.read()[-2000:]
            self._stderr.close()
            raise PeerCrashed(f"llama.cpp worker exited with status {status}: {tail.strip()}")
        return json.loads(line)

    def ask(self, ids: list[int], tokens: int, top: int = 0) -> dict:
        """A greedy run of `tokens` after `ids` (see bench/llamacpp_peer.py)."""
        request = {"ids": ids, "tokens": tokens} | ({"top": top} if top else {})
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: _answer reads the empty line and says how
        return self._answer()

    def _status_kib(self, field: str) -> int | None:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        except OSError:
            return None
        return None

    def peak_rss(self) -> int | None:
        """The worker's peak resident set so far (VmHWM), in bytes."""
        kib = self._status_kib("VmHWM")
        return None if kib is None else kib * 1024

    def cpu_ms(self) -> float | None:
        """The worker's user + system CPU time so far (all its threads), in ms."""
        try:
            text = Path(f"/proc/{self.pid}/stat").read_bytes()
        except OSError:
            return None
        fields = text[text.rfind(b")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) * 1000.0 / TICKS

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _start(path: Path | str, threads: int, ids: list[int], tokens: int, top: int,
           extra_buffers: bool) -> tuple[Worker, dict]:
    worker = Worker(path, threads, extra_buffers)
    try:
        return worker, worker.ask(ids, tokens, top)
    except PeerCrashed:
        worker.close()
        raise


def first_run(path: Path | str, threads: int, ids: list[int], tokens: int, top: int = 0,
              extra_buffers: bool = True) -> tuple[Worker, dict, str]:
    """A started worker and its first answer, with llama.cpp's defaults unless `extra_buffers`
    is False; when the defaults crash at the load or the first evaluation, the same again
    without extra buffers, and the note NO_EXTRA (else ""). The caller closes the worker."""
    if extra_buffers:
        try:
            return (*_start(path, threads, ids, tokens, top, True), "")
        except PeerCrashed:
            pass
    worker, answer = _start(path, threads, ids, tokens, top, False)
    return worker, answer, NO_EXTRA if extra_buffers else ""
