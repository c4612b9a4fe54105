"""The local vLLM server: where its venv and model folder live, and how to start it.

vLLM cannot share the app's venv (it pins its own transformers and torch stack), so `make vllm`
(scripts/vllm_setup.sh) builds one outside the repository, beside the converted model cache, where
a clean clone and CI reuse it. The model folder vLLM serves is the app's converted default model
with two changes vLLM's Llama loader needs: `architectures: ["LlamaForCausalLM"]` in config.json and
the (tied) embedding stored as `model.embed_tokens.weight` — the app's cache keeps only
`lm_head.weight`. Same float32 weights, so greedy outputs can be compared token for token.

`python -m engine.remote.server prepare` writes the folder; `... start` starts the server, waits
until /health answers and prints the base URL (scripts/vllm_start.sh). Imports no torch.
"""

from __future__ import annotations

import argparse
import atexit
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import EngineError

VLLM_VERSION = "0.32.0"
VLLM_ENV = "INFERENCE_EXPLORER_VLLM"  # overrides the folder holding venv/ and model/
SERVED_NAME = "smollm2-135m"
DEFAULT_PORT = 8011
MAX_MODEL_LEN = 2048
KV_CACHE_GB = 1  # VLLM_CPU_KVCACHE_SPACE: 1 GiB holds ~23k token slots of this model in float32
# vLLM's n-gram (prompt lookup) speculation with this app's defaults (engine/serving/speculative.py):
# 4 draft tokens from a match of the last 3 down to 1 tokens in the context.
SPECULATIVE_CONFIG = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                      "prompt_lookup_min": 1}


def vllm_home() -> Path:
    """`<cache>/vllm-<version>`: the venv and the model folder vLLM serves."""
    env = os.environ.get(VLLM_ENV)
    if env:
        return Path(env).expanduser()
    from ..loader import cache_root

    return cache_root().parent / f"vllm-{VLLM_VERSION}"


def vllm_python() -> Path:
    return vllm_home() / "venv" / "bin" / "python"


def model_folder() -> Path:
    return vllm_home() / "model"


def is_installed() -> bool:
    return vllm_python().is_file() and (model_folder() / "complete.json").is_file()


def prepare_model_folder(out: Path | None = None) -> Path:
    """Write the folder vLLM serves from the app's converted default model (converting it first if
    needed); atomic, so a crash leaves no half folder."""
    from safetensors.torch import load_file, save_file

    from ..loader import _default_cache_dir, default_gguf_path, is_complete_cache, load_model

    out = out or model_folder()
    if (out / "complete.json").is_file():
        return out
    source = _default_cache_dir(default_gguf_path())
    if not is_complete_cache(source):
        load_model()  # converts the GGUF into the cache
    tensors = load_file(source / "model.safetensors")
    if "model.embed_tokens.weight" not in tensors:
        # [vocab, hidden]: the tied embedding, stored under the name vLLM's loader reads
        tensors["model.embed_tokens.weight"] = tensors.pop("lm_head.weight").contiguous()
    config = json.loads((source / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:  # transformers 5 nests it; vLLM's config reader looks at the top
        config["rope_theta"] = rope["rope_theta"]
    for key in ("_name_or_path", "_model_name_or_path", "transformers_version"):
        config.pop(key, None)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="model.tmp-", dir=out.parent))
    try:
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (source / name).is_file():
                shutil.copy(source / name, tmp / name)
        (tmp / "complete.json").write_text(json.dumps({"source": str(source)}))
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def server_command(port: int, eager: bool, speculative: bool = False) -> list[str]:
    """`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script looks up package
    metadata named `vllm`, but the CPU build is named vllm-cpu). float32 like the app, so greedy
    tokens can be compared; `eager` skips torch.compile (a start of about a minute instead of
    several on two cores, and slower steps); `speculative` turns on prompt-lookup speculation."""
    command = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(model_folder()), "--served-model-name", SERVED_NAME,
               "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
               "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log"]
    if speculative:
        command += ["--speculative-config", json.dumps(SPECULATIVE_CONFIG)]
    return command + (["--enforce-eager"] if eager else [])


@dataclass
class ServerProcess:
    """A vLLM server this process started: `base_url` answers OpenAI-compatible requests."""

    process: subprocess.Popen
    base_url: str
    log: Path
    start_s: float

    def stop(self) -> None:
        """SIGTERM to its whole process group (the API server, its engine core and worker), then
        SIGKILL after 30 s: no vLLM process outlives this."""
        for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.process.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            if _group_gone(self.process.pid, 1.0):  # the parent is gone; its children may not be
                break

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_gone(pgid: int, wait_s: float) -> bool:
    """Whether process group `pgid` has no process left, waiting up to `wait_s` for it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def healthy(base_url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(base_url.rstrip("/").removesuffix("/v1") + "/health",
                                    timeout=timeout) as response:
            return response.status == 200
    except (OSError, http.client.HTTPException, ValueError):  # not a server, or not HTTP
        return False


def start_server(port: int = DEFAULT_PORT, eager: bool = True, timeout_s: float = 900.0,
                 log: Path | None = None, speculative: bool = False) -> ServerProcess:
    """Start vLLM on 127.0.0.1:`port` and wait until /health answers; on failure, stop it and
    raise EngineError with the end of its log."""
    if not is_installed():
        raise EngineError("vLLM is not installed: run `make vllm` (a separate venv of "
                          f"vllm-cpu=={VLLM_VERSION} and its model folder)")
    base_url = f"http://127.0.0.1:{port}/v1"
    if healthy(base_url):
        raise EngineError(f"something already answers on port {port}: stop it or choose --port")
    log = log or vllm_home() / f"server-{port}.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_GB),
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    started = time.perf_counter()
    with open(log, "wb") as sink:
        process = subprocess.Popen(server_command(port, eager, speculative), stdout=sink,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = ServerProcess(process, base_url, log, 0.0)
    atexit.register(server.stop)  # whoever started it (the app, a test session) stops it on exit
    try:
        while not healthy(base_url):
            if process.poll() is not None or time.perf_counter() - started > timeout_s:
                tail = log.read_text(errors="replace").strip().splitlines()[-5:]
                raise EngineError("vLLM did not start: " + " | ".join(tail)[-600:])
            time.sleep(0.25)
    except BaseException:  # a failed start, or Ctrl-C / a stop signal while it starts
        server.stop()
        raise
    server.start_s = time.perf_counter() - started
    return server


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: object) -> None:
    """The first stop signal: ignore the next ones (the stop it starts must finish) and unwind."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def serve_until_stopped(start: Callable[[], ServerProcess]) -> int:
    """Run `start()` (which starts vLLM), then wait until vLLM exits or this process is asked to
    stop — Ctrl-C (SIGINT), SIGTERM, or a closed terminal (SIGHUP) — and stop vLLM's whole process
    group; returns the exit status for the command (0 when stopped by a signal).

    vLLM runs in a session of its own, so no terminal signal reaches it: this process must pass the
    stop on. Python's default SIGTERM and SIGHUP end the process at once, running no `finally` and
    no atexit, so all three signals become KeyboardInterrupt here; after the first one the others
    are ignored, so an impatient second Ctrl-C cannot cut the stop short and leave vLLM serving."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _interrupt)
    server = None
    try:
        server = start()
        print(f"{server.base_url}  (healthy after {server.start_s:.0f} s; log {server.log})",
              flush=True)
        code = server.process.wait()
        print(f"error: vLLM exited by itself (status {code}); see {server.log}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if server is not None:
            print("stopping vLLM…", flush=True)
            server.stop()
            print("vLLM stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.remote.server")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="write the model folder vLLM serves")
    sub.add_parser("where", help="print the vLLM venv's python (nothing if not installed)")
    start = sub.add_parser("start", help="start vLLM, print its base URL once healthy, and keep "
                                         "serving until interrupted")
    start.add_argument("--port", type=int, default=DEFAULT_PORT)
    start.add_argument("--compile", action="store_true",
                       help="let vLLM torch.compile (minutes at the first start on two cores)")
    start.add_argument("--speculate", action="store_true",
                       help="prompt-lookup speculative decoding (4 drafts, n-gram 3 down to 1)")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            print(prepare_model_folder())
        elif args.command == "where":
            print(vllm_python() if is_installed() else "")
        else:
            return serve_until_stopped(lambda: start_server(
                args.port, eager=not args.compile, speculative=args.speculate))
    except EngineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
