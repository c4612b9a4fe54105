"""This engine against llama.cpp on GGUF files of real shapes: open time, peak RSS, TTFT of a 64-
and a 512-token prompt, ITL, MBU against the memory-bandwidth roof, and whether the two compute
the same first distribution and greedy tokens.

The files are synthetic (scripts/synth_gguf.py: the published shapes of SmolLM2-135M, Llama 3.2
1B and 3B and Llama 3.1 8B, real vocabularies, random weights as GGML blocks), written once into
the per-user cache and reused (bench/gguf_files.py). For each (shape, type), every round runs
this engine in a fresh process (bench/gguf_ours.py) and then llama.cpp in a fresh worker
(bench/gguf_peer.py), on the same file, threads and token ids: interleaved, so a busy stretch of
a shared machine falls on both, and fresh, so each open time and peak RSS belongs to one model.
Medians over the rounds; each ratio (ours ÷ llama.cpp) is the median of the rounds' own ratios.
A round is marked disturbed when, over either engine's timed window, other processes used at
least 25 % of all CPUs while that engine got under 75 % of its threads' time — the app's rule for
a step (engine/timing/disturbance.py). The page cache is never dropped (shared machine); each
measurement records how much of the file it held.

MBU: bytes a decode step reads (the stored weights, an untied embedding for its one row, and our
float32 KV cache at the timed steps' middle position) ÷ ITL ÷ the read bandwidth measured here with
the same threads (engine/kernels/microbench.py; the best read of the run); the roof ITL is those
bytes ÷ that bandwidth. MBU bracketed divides by the better of two plain reads right before and
right after each engine's timed steps instead (ours: the step's own matrices, in its process,
bench/gguf_ours.py; llama.cpp: the buffer here, around the worker's steps): the bandwidth of that
stretch of a VM whose bandwidth changes in states that last seconds. The first step's agreement:
KL(llama.cpp ‖ ours) over the whole vocabulary, the overlap of the two top-10 sets, and how many
greedy tokens agree from the start.

    .venv/bin/python -m bench.gguf_bench [--shapes 135m,1b,3b,8b] [--types q4_0,q8_0,q4_k_m]
        [--threads 2] [--rounds 3] [--json out.json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench import gguf_peer
from bench.gguf_files import SHAPES, TYPES, cpu_has_amx, cpu_name, prompt_ids, resident_fraction, synthetic
from bench.gguf_table import markdown, summarize
from engine.clock import _machine_ticks, _own_ticks, load_average, usable_cores
from engine.timing.disturbance import CPU_SHARE_LIMIT, OTHERS_LIMIT

ROOT = Path(__file__).resolve().parents[1]
TIE = 0.02  # tests/test_gguf_llamacpp_parity.py's: a gap within both engines' 8-bit rounding


class Bandwidth:
    """The machine's read bandwidth with the benchmark's threads: a buffer far larger than the
    caches, read once before every round and a few times, spread out, at the start and the end
    (a shared VM's bandwidth changes in states that last seconds); the ceiling is the best."""

    def __init__(self, threads: int, megabytes: int) -> None:
        import torch

        from engine.kernels.microbench import bandwidth_buffer

        torch.set_num_threads(threads)
        self.buffer = bandwidth_buffer(torch.device("cpu"), megabytes)
        self.buffer.sum()
        self.reads: list[float] = []

    def read(self, times: int = 1, spread_s: float = 0.0) -> float:
        from engine.kernels.microbench import read_gb_s

        for i in range(times):
            if i:
                time.sleep(spread_s / max(times - 1, 1))
            self.reads.append(read_gb_s(self.buffer))
        return max(self.reads[-times:])

    @property
    def ceiling(self) -> float:
        return max(self.reads)


def run_ours(path: Path, args: argparse.Namespace, logits_out: Path | None) -> dict:
    """One fresh process of bench/gguf_ours.py; its JSON, with the file's page-cache share."""
    resident = resident_fraction(path)
    command = [sys.executable, "-m", "bench.gguf_ours", str(path), "--threads", str(args.threads),
               "--prompt", str(args.prompt), "--long", str(args.long), "--steps", str(args.steps),
               "--agree", str(args.agree)]
    if logits_out is not None:
        command += ["--logits-out", str(logits_out)]
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    if done.returncode:
        raise SystemExit(f"gguf_ours on {path.name} failed ({done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1]) | {
        "resident_before": resident, "process_s": time.perf_counter() - start}


def run_llama(path: Path, args: argparse.Namespace, extra_buffers: bool, top: int,
              bandwidth: Bandwidth) -> dict:
    """One fresh llama.cpp worker: the agreement run (its first evaluation, as ours), then the
    timed window (the short prompt and its steps, the long prompt) judged for disturbance."""
    resident = resident_fraction(path)
    short, long = prompt_ids(args.prompt), prompt_ids(args.long)
    worker, first, note = gguf_peer.first_run(path, args.threads, short, args.agree, top,
                                              extra_buffers)
    with worker:
        machine, own, cpu = _machine_ticks(), _own_ticks(), worker.cpu_ms()
        start = time.perf_counter()
        read_before = bandwidth.read(2)  # the bracketed MBU's reads, as ours takes in its process
        run = worker.ask(short, args.steps + 1)
        read_after = bandwidth.read(2)
        long_run = worker.ask(long, 1) if args.long else None
        wall = (time.perf_counter() - start) * 1000
        machine_after, own_after, cpu_after = _machine_ticks(), _own_ticks(), worker.cpu_ms()
        peak = worker.peak_rss()
    cpu_share = others = None
    if cpu is not None and cpu_after is not None:
        cpu_share = (cpu_after - cpu) / (args.threads * wall)
    if None not in (machine, machine_after, own, own_after, cpu, cpu_after):
        total = machine_after[1] - machine[1]
        worker_ticks = (cpu_after - cpu) / 1000 * gguf_peer.TICKS
        busy = machine_after[0] - machine[0] - (own_after - own) - worker_ticks
        others = min(max(busy / total, 0.0), 1.0) if total > 0 else None
    return {
        "extra_buffers": worker.extra_buffers, "crashed_with_defaults": bool(note),
        "version": worker.ready["version"], "open_s": worker.ready["load_s"],
        "vocab": worker.ready["n_vocab"], "peak_rss": peak, "resident_before": resident,
        "tokens": first["tokens"], "top": first.get("top"), "margins": first.get("margins"),
        "cold_ttft_ms": first["prefill_ms"], "ttft_ms": run["prefill_ms"],
        "ttft_long_ms": long_run["prefill_ms"] if long_run else None, "step_ms": run["step_ms"],
        "itl_ms": statistics.median(run["step_ms"]),
        "read_gb_s_around_steps": [read_before, read_after],
        "window": {"wall_ms": wall, "cpu_share": cpu_share, "others_share": others,
                   "disturbed": others is not None and cpu_share is not None
                   and others >= OTHERS_LIMIT and cpu_share < CPU_SHARE_LIMIT},
    }


def agreement(ours: dict, logits: np.ndarray, llama: dict) -> dict:
    """KL(llama.cpp ‖ ours) of the first step's distributions, the top-10 overlap, and how many
    greedy tokens are equal from the start (and whether every token llama.cpp chose by a clear
    margin, before its first near tie, is ours too: tests/test_gguf_llamacpp_parity.py)."""
    theirs = np.full(len(logits), -np.inf)
    for i, value in llama["top"]:
        theirs[i] = value

    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        return x - x.max() - np.log(np.exp(x - x.max()).sum())

    p, q = log_softmax(theirs), log_softmax(logits)
    kl = float(np.sum(np.exp(p) * (p - q)))
    top_ours = set(np.argsort(-logits)[:10].tolist())
    top_theirs = set(np.argsort(-theirs)[:10].tolist())
    a, b = ours["tokens"], llama["tokens"]
    equal = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    # margins[i] is llama.cpp's gap between its best two when it chose token i
    tie = next((i for i, m in enumerate(llama["margins"]) if m < TIE), len(llama["margins"]))
    return {"kl": kl, "top10_overlap": len(top_ours & top_theirs), "greedy_equal": equal,
            "greedy_of": len(a), "first_tie": tie, "equal_until_tie": a[:tie] == b[:tie]}


def one_row(shape: str, qtype: str, args: argparse.Namespace, bandwidth: Bandwidth) -> dict:
    """Every round of one (shape, type): ours and llama.cpp, interleaved."""
    start = time.perf_counter()
    path, wrote = synthetic(shape, qtype)
    row = {"shape": shape, "type": qtype, "file": str(path), "file_bytes": path.stat().st_size,
           "written_s": time.perf_counter() - start if wrote else None, "rounds": []}
    extra = not args.no_extra_buffers
    note = "" if extra else "extra buffers off: --no-extra-buffers"
    with tempfile.TemporaryDirectory() as folder:
        logits_out = Path(folder) / "first.npy"
        for r in range(args.rounds):
            measured = {"load_before": load_average(), "bandwidth_gb_s": bandwidth.read()}
            measured["ours"] = run_ours(path, args, logits_out if r == 0 else None)
            say(f"{shape} {qtype} round {r + 1}: ours TTFT {measured['ours']['ttft_ms']:.0f} ms, "
                f"ITL {measured['ours']['itl_ms']:.2f} ms")
            if gguf_peer.installed():
                top = measured["ours"]["vocab"] if r == 0 else 0
                llama = run_llama(path, args, extra, top, bandwidth)
                if llama["crashed_with_defaults"]:
                    extra, note = False, gguf_peer.NO_EXTRA
                measured["llama"] = llama
                if r == 0:
                    row["agreement"] = agreement(measured["ours"], np.load(logits_out), llama)
                    llama.pop("top")
                say(f"{shape} {qtype} round {r + 1}: llama.cpp TTFT {llama['ttft_ms']:.0f} ms, "
                    f"ITL {llama['itl_ms']:.2f} ms")
            measured["load_after"] = load_average()
            measured["disturbed"] = any(measured[k]["window"]["disturbed"]
                                        for k in ("ours", "llama") if k in measured)
            row["rounds"].append(measured)
    row["note"] = note
    if args.clean and wrote:
        path.unlink()
    return row


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def machine(args: argparse.Namespace) -> dict:
    return {"cpu": cpu_name(), "cores": usable_cores(), "threads": args.threads,
            "amx": cpu_has_amx(), "python": sys.version.split()[0],
            "llama_cpp": "not installed: `make llamacpp` adds its columns"}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt", type=int, default=64, help="the short prompt's tokens")
    p.add_argument("--long", type=int, default=512, help="the long prompt's tokens (0: none)")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps (ITL)")
    p.add_argument("--agree", type=int, default=16, help="greedy tokens compared")
    p.add_argument("--bandwidth-mb", type=int, default=1024, help="the read buffer's size")
    p.add_argument("--no-extra-buffers", action="store_true",
                   help="run llama.cpp without extra buffers from the start")
    p.add_argument("--clean", action="store_true",
                   help="delete each synthetic file this run wrote once its row is done")
    p.add_argument("--json", type=Path, help="write the whole result here")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = p.parse_args(argv)
    args.shapes, args.types = args.shapes.split(","), args.types.split(",")
    unknown = [s for s in args.shapes if s not in SHAPES] + [t for t in args.types if t not in TYPES]
    if unknown:
        p.error(f"unknown shape or type: {', '.join(unknown)} (shapes {', '.join(SHAPES)}; "
                f"types {', '.join(TYPES)})")
    if args.long > 512:
        p.error("--long is at most 512 (the llama.cpp worker's context)")
    if args.prompt + max(args.steps, args.agree) > 512:
        p.error("--prompt plus --steps (or --agree) must fit the worker's context of 512")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(args), "settings": {k: v for k, v in vars(args).items()
                                                     if k not in ("json", "markdown")}}
    bandwidth = Bandwidth(args.threads, args.bandwidth_mb)
    bandwidth.read(8, 1.5)
    rows = [one_row(shape, qtype, args, bandwidth) for shape in args.shapes for qtype in args.types]
    bandwidth.read(8, 1.5)
    report["bandwidth"] = {"ceiling_gb_s": bandwidth.ceiling,
                           "median_gb_s": statistics.median(bandwidth.reads),
                           "reads": bandwidth.reads}
    report["rows"] = [row | {"summary": summarize(row, bandwidth.ceiling)} for row in rows]
    versions = {r["llama"]["version"] for row in rows for r in row["rounds"] if "llama" in r}
    if versions:
        report["machine"]["llama_cpp"] = "llama-cpp-python " + ", ".join(sorted(versions))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    if args.markdown:
        print(markdown(report))
    elif not args.json:
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
