"""Engine benchmark: HF generate vs a bare KV-cache loop vs the engine with full recording, and
the same decode step eager vs compiled (engine/kernels/compiled.py, static cache) vs hand-written C
(engine/kernels/native.py).

All variants run side by side in one process, interleaved over several rounds, on the same prompt
and token count; we report medians and ratios (the machine is shared and noisy, so absolute
numbers drift, ratios measured together do not). Also cold (GGUF) and warm (cached) load times.

From the repository root (the packages import from there, nothing is put on sys.path):

    python -m bench.engine_bench [--tokens 32] [--rounds 12] [--out bench/out/engine.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # an entry point: offline unless asked, as the app

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from engine import GenerationSettings, Run, load_model  # noqa: E402
from engine.forward import prepare_prompt  # noqa: E402
from engine.kernels.compiled import CompiledDecoder  # noqa: E402
from engine.kernels.microbench import bandwidth_buffer, ceilings, measure_bandwidth, read_gb_s  # noqa: E402
from engine.kernels.native import NativeDecoder  # noqa: E402
from engine.loader import CACHE_ENV  # noqa: E402
from engine.timing.roofline import forward_work  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and a storm."


class _Clock:
    """A streamer for model.generate that timestamps every put() (first put = the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, _value: torch.Tensor) -> None:
        self.times.append(time.perf_counter() * 1000)

    def end(self) -> None:
        pass


def run_generate(lm, ids: list[int], n: int) -> tuple[float, list[float]]:
    clock = _Clock()
    inputs = torch.tensor([ids])
    start = time.perf_counter() * 1000
    lm.model.generate(inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False, streamer=clock)
    token_times = clock.times[1:]
    return token_times[0] - start, [b - a for a, b in zip(token_times, token_times[1:])]


@torch.inference_mode()
def run_bare(lm, ids: list[int], n: int) -> tuple[float, list[float]]:
    """The floor: prefill + argmax decode with a DynamicCache, nothing recorded."""
    model = lm.model
    start = time.perf_counter() * 1000
    cache = DynamicCache(config=model.config)
    out = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
    token = out.logits[0, -1].argmax()
    times = [time.perf_counter() * 1000]
    for _ in range(n - 1):
        out = model(input_ids=token.view(1, 1), cache=cache, use_cache=True, logits_to_keep=1)
        token = out.logits[0, -1].argmax()
        int(token)
        times.append(time.perf_counter() * 1000)
    return times[0] - start, [b - a for a, b in zip(times, times[1:])]


def run_engine(lm, n: int, record: bool) -> tuple[float, list[float]]:
    settings = GenerationSettings(max_new_tokens=n, record_attention=record, record_hidden=record)
    run = Run(lm, PROMPT, settings)
    trace = run.run_all()
    return trace.ttft_ms, list(trace.itl_ms)


def run_checked(name: str, greedy, reference: list[int]) -> tuple[float, list[float]]:
    """A decoder's `greedy()` (prefill, then timed decode steps); exits if its tokens differ from
    `generate`'s. TTFT = total − decode steps."""
    start = time.perf_counter() * 1000
    tokens, itl = greedy()
    total = time.perf_counter() * 1000 - start
    if tokens != reference:
        raise SystemExit(f"{name}: the decode changed the tokens")
    return total - sum(itl), itl


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", default="bench/out/engine.json")
    args = parser.parse_args()
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        old = os.environ.get(CACHE_ENV)
        os.environ[CACHE_ENV] = tmp
        t = time.perf_counter()
        load_model()
        cold = time.perf_counter() - t
        t = time.perf_counter()
        lm = load_model()
        warm = time.perf_counter() - t
        if old is None:
            del os.environ[CACHE_ENV]
        else:
            os.environ[CACHE_ENV] = old

    ids = prepare_prompt(lm.tokenizer, PROMPT, True)
    reference = lm.model.generate(torch.tensor([ids]), max_new_tokens=args.tokens,
                                  min_new_tokens=args.tokens, do_sample=False)[0, len(ids):].tolist()
    decoder = CompiledDecoder(lm)
    compile_s = decoder.compile(ids)
    t = time.perf_counter()
    native = NativeDecoder(lm)
    native_s = time.perf_counter() - t
    variants = {
        "generate": lambda: run_generate(lm, ids, args.tokens),
        "bare_loop": lambda: run_bare(lm, ids, args.tokens),
        "engine_full_recording": lambda: run_engine(lm, args.tokens, True),
        "engine_no_recording": lambda: run_engine(lm, args.tokens, False),
        "static_cache_eager": lambda: run_checked(
            "static_cache_eager", lambda: decoder.greedy(ids, args.tokens, False), reference),
        "static_cache_compiled": lambda: run_checked(
            "static_cache_compiled", lambda: decoder.greedy(ids, args.tokens, True), reference),
        "native_c": lambda: run_checked(
            "native_c", lambda: native.greedy(ids, args.tokens), reference),
    }
    for fn in variants.values():  # warm-up
        fn()
    # Each round runs every variant once, in a shuffled order; ratios are taken within a round
    # (paired), so slow drifts of a shared machine cancel out.
    # Every variant's run is bracketed by two reads of a 1 GB buffer: on a shared VM the read
    # bandwidth can sit in one state or another for seconds at a time, so a reading taken
    # elsewhere in the round may belong to another state (the report lists every read).
    rng = random.Random(0)
    buffer = bandwidth_buffer(lm.device)
    rounds: list[dict[str, tuple[float, float, int, float]]] = []
    reads: list[float] = []
    for _ in range(args.rounds):
        order = list(variants)
        rng.shuffle(order)
        measured = {}
        for name in order:
            before = read_gb_s(buffer)
            ttft, itl = variants[name]()
            after = read_gb_s(buffer)
            reads += [before, after]
            measured[name] = (ttft, statistics.median(itl), len(itl) + 1, max(before, after))
        rounds.append(measured)
    del buffer
    result = {}
    for name in variants:
        result[name] = {
            "ttft_ms": statistics.median(r[name][0] for r in rounds),
            "itl_ms": statistics.median(r[name][1] for r in rounds),
            "tokens": min(r[name][2] for r in rounds),
            "itl_vs_bare": statistics.median(r[name][1] / r["bare_loop"][1] for r in rounds),
            "itl_vs_generate": statistics.median(r[name][1] / r["generate"][1] for r in rounds),
        }
    run_best = measure_bandwidth(lm.device)
    peak = max(reads + [run_best])  # the best read of this run
    ceil = ceilings(lm.device, refresh=True)  # stored: the best this machine has ever shown
    mid_context = len(ids) + args.tokens // 2
    decode_bytes = forward_work(lm.spec, 1, mid_context - 1).bytes
    for name in result:
        achieved = decode_bytes / (result[name]["itl_ms"] / 1000) / 1e9
        result[name]["decode_gb_s"] = achieved
        # MBU two ways: against the best bandwidth read in the whole run (strict: the goal's
        # figure), and against the better of the two reads bracketing the same run (median over
        # rounds; can still exceed 1 when the state changed in the middle of a run).
        result[name]["mbu_vs_peak"] = achieved / peak
        result[name]["mbu_bracketed"] = statistics.median(
            decode_bytes / (r[name][1] / 1000) / 1e9 / r[name][3] for r in rounds)
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                   f"threads {torch.get_num_threads()}",
        "device": str(lm.device),
        "prompt_tokens": len(ids),
        "new_tokens": args.tokens,
        "rounds": args.rounds,
        "ceilings": {"bandwidth_gb_s": ceil.bandwidth_gb_s, "matmul_tflop_s": ceil.matmul_tflop_s},
        "bandwidth_reads_gb_s": reads,
        "peak_bandwidth_gb_s": peak,
        "decode_bytes_per_step": decode_bytes,
        "load_cold_s": cold,
        "load_warm_s": warm,
        "compile_s": compile_s,
        "native_build_and_pack_s": native_s,
        "variants": result,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print("\n| variant | tokens | TTFT ms | ITL ms (median) | ITL / bare loop | ITL / generate "
          "| decode GB/s | MBU vs peak | MBU bracketed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in result.items():
        print(f"| {name} | {r['tokens']} | {r['ttft_ms']:.1f} | {r['itl_ms']:.1f} | "
              f"{r['itl_vs_bare']:.3f} | {r['itl_vs_generate']:.3f} | {r['decode_gb_s']:.2f} | "
              f"{r['mbu_vs_peak']:.2f} | {r['mbu_bracketed']:.2f} |")
    print(f"\nbandwidth reads {min(reads):.1f}–{max(reads):.1f} GB/s (median "
          f"{statistics.median(reads):.1f}), peak of this run {peak:.1f} GB/s, best ever stored "
          f"{ceil.bandwidth_gb_s:.1f} GB/s; matmul {ceil.matmul_tflop_s * 1e3:.0f} GFLOP/s; decode moves "
          f"{decode_bytes / 1e6:.0f} MB per step")
    print(f"\ncold load (GGUF) {cold:.1f} s, warm load (cache) {warm:.2f} s; compiling the decode "
          f"step {compile_s:.0f} s, building and packing the native step {native_s:.1f} s "
          "(static-cache and native variants: greedy tokens equal generate's)")


if __name__ == "__main__":
    main()
