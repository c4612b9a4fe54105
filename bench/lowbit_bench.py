"""Low-bit benchmark: the native decode step reading fp32, int8, Q8_0, Q4_0, Q4_1, Q4_K and
Q4_K_M weights, the live run's recording on the native step, and llama.cpp as the peer on the same
GGUF files: the shipped Q4_1 file, and this model exported as Q4_K_M by `python -m engine export`
(the same blocks the native q4_k_m step reads; llama.cpp's own quantizer writes them byte for
byte, tests/test_gguf_llamacpp.py).

Every contestant runs once per round, in a shuffled order, over several rounds in one process
(llama.cpp in a worker process driven from here, same prompt token ids, same thread count);
ratios are taken within a round and their median reported — the machine is shared and noisy.
Greedy tokens of each native variant are checked against `generate` of the model holding the
same dequantized weights before timing. The llama.cpp row needs `make llamacpp` (its own venv);
without it the row says so.

    python -m bench.lowbit_bench [--tokens 32] [--rounds 10] [--out bench/out/lowbit.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # an entry point: offline unless asked, as the app

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from engine import GenerationSettings, Run, load_model  # noqa: E402
from engine.forward import prepare_prompt  # noqa: E402
from engine.kernels.microbench import bandwidth_buffer, read_gb_s  # noqa: E402
from engine.kernels.native import NativeDecoder  # noqa: E402
from engine.loader import default_gguf_path  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper and a storm."
VARIANTS = ("fp32", "int8", "q8_0", "q4_0", "q4_1", "q4_k", "q4_k_m")
Q41_PEER, QKM_PEER = "llama.cpp Q4_1 (same GGUF)", "llama.cpp Q4_K_M (same GGUF)"
PEER_PYTHON = Path(".venv-llamacpp/bin/python")


class Peer:
    """llama.cpp in its own venv, one worker process for the whole benchmark."""

    def __init__(self, path: Path, threads: int) -> None:
        self.proc = subprocess.Popen(
            [str(PEER_PYTHON), "bench/llamacpp_peer.py", str(path), str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.version = json.loads(self.proc.stdout.readline())["version"]

    def greedy(self, ids: list[int], n: int) -> dict:
        self.proc.stdin.write(json.dumps({"ids": ids, "tokens": n}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=30)


def run_live(lm, native: NativeDecoder, n: int, record: bool) -> list[float]:
    """The live run (engine.Run) on the native step; decode steps' wall ms."""
    settings = GenerationSettings(max_new_tokens=n, record_attention=record, record_hidden=record)
    trace = Run(lm, PROMPT, settings, native=native).run_all()
    assert trace.decoder is not None and trace.decoder.name == "native", trace.decoder
    return list(trace.itl_ms)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", default="bench/out/lowbit.json")
    args = parser.parse_args()
    lm = load_model()
    ids = prepare_prompt(lm.tokenizer, PROMPT, True)
    threads = torch.get_num_threads()
    decoders, build_s, same = {}, {}, {}
    for name in VARIANTS:
        t = time.perf_counter()
        # from the float32 model: the decoder packs its weights when they lie on the format's
        # grid (q4_1 on this Q4_1-born model) and otherwise makes the variant's copy itself (a
        # K-quant copy does not requantize to its own blocks: packing a copy would round twice)
        decoders[name] = NativeDecoder(lm, max_tokens=256, weights=name)
        model = decoders[name].model
        build_s[name] = time.perf_counter() - t
        reference = model.generate(torch.tensor([ids]), max_new_tokens=args.tokens,
                                   min_new_tokens=args.tokens, do_sample=False)[0, len(ids):]
        same[name] = decoders[name].greedy(ids, args.tokens)[0] == reference.tolist()
        if not same[name]:
            raise SystemExit(f"native {name}: tokens differ from generate on its weights")
    runs = {f"native {n}": (lambda d=d: d.greedy(ids, args.tokens)[1]) for n, d in decoders.items()}
    runs["live, full recording"] = lambda: run_live(lm, decoders["fp32"], args.tokens, True)
    runs["live, no recording"] = lambda: run_live(lm, decoders["fp32"], args.tokens, False)
    peer, peer_note, peer_tokens, peer_km, km_tokens = None, "", None, None, None
    if PEER_PYTHON.exists():
        peer = Peer(default_gguf_path(), threads)
        runs[Q41_PEER] = lambda: peer.greedy(ids, args.tokens)["step_ms"]
        peer_tokens = peer.greedy(ids, args.tokens)["tokens"]
        folder = tempfile.mkdtemp(prefix="lowbit-")
        km_file = Path(folder) / "q4_k_m.gguf"
        subprocess.run([sys.executable, "-m", "engine", "export", "--format", "gguf", "--weights",
                        "q4_k_m", "-o", str(km_file)], check=True, stdout=subprocess.DEVNULL)
        peer_km = Peer(km_file, threads)
        runs[QKM_PEER] = lambda: peer_km.greedy(ids, args.tokens)["step_ms"]
        km_tokens = peer_km.greedy(ids, args.tokens)["tokens"]
    else:
        peer_note = "llama.cpp not installed: `make llamacpp` adds its row"
    for fn in runs.values():  # warm-up
        fn()
    rng = random.Random(0)
    buffer = bandwidth_buffer(lm.device)
    rounds, reads = [], []
    for _ in range(args.rounds):
        order = list(runs)
        rng.shuffle(order)
        measured = {}
        for name in order:
            reads.append(read_gb_s(buffer))
            measured[name] = statistics.median(runs[name]())
        rounds.append(measured)
    del buffer
    for worker in (peer, peer_km):
        if worker is not None:
            worker.close()
    peak = max(reads)
    result = {}
    for name in runs:
        itl = statistics.median(r[name] for r in rounds)
        row = {"itl_ms": itl,
               "vs_native_fp32": statistics.median(r[name] / r["native fp32"] for r in rounds)}
        key = name.removeprefix("native ")
        if key in decoders:
            row["weight_bytes"] = decoders[key].weight_bytes
            row["mbu"] = decoders[key].weight_bytes / (itl / 1000) / 1e9 / peak
        result[name] = row
    if peer is not None:
        result[Q41_PEER]["native_q4_1_vs_llamacpp"] = statistics.median(
            r["native q4_1"] / r[Q41_PEER] for r in rounds)
        result[Q41_PEER]["native_q4_0_vs_llamacpp"] = statistics.median(
            r["native q4_0"] / r[Q41_PEER] for r in rounds)
        result[QKM_PEER]["native_q4_k_m_vs_llamacpp"] = statistics.median(
            r["native q4_k_m"] / r[QKM_PEER] for r in rounds)
    q4_k_vs_q4_0 = statistics.median(r["native q4_k"] / r["native q4_0"] for r in rounds)
    recording = statistics.median(r["live, full recording"] / r["live, no recording"]
                                  for r in rounds)
    native_tokens = decoders["q4_1"].greedy(ids, args.tokens)[0]
    native_km = decoders["q4_k_m"].greedy(ids, args.tokens)[0]
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                   f"threads {threads}",
        "prompt_tokens": len(ids), "new_tokens": args.tokens, "rounds": args.rounds,
        "peak_bandwidth_gb_s": peak, "build_s": build_s, "tokens_equal_generate": same,
        "recording_ratio": recording, "peer": peer.version if peer else peer_note,
        "peer_tokens_equal_native_q4_1": (sum(a == b for a, b in zip(peer_tokens, native_tokens))
                                          if peer_tokens else None),
        "peer_q4_k_m_tokens_equal_native": (
            next((i for i, (a, b) in enumerate(zip(km_tokens, native_km)) if a != b),
                 len(native_km)) if km_tokens else None),
        "native_q4_k_vs_q4_0": q4_k_vs_q4_0,
        "runs": result,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print("\n| decode | weight MB per step | ITL ms (median) | ITL / native fp32 | MBU |")
    print("|---|---|---|---|---|")
    for name, r in result.items():
        mb = f"{r['weight_bytes'] / 1e6:.0f}" if "weight_bytes" in r else "–"
        mbu = f"{r['mbu']:.2f}" if "mbu" in r else "–"
        print(f"| {name} | {mb} | {r['itl_ms']:.2f} | {r['vs_native_fp32']:.3f} | {mbu} |")
    print(f"\nnative q4_k ITL / native q4_0 ITL (median of rounds): {q4_k_vs_q4_0:.3f}")
    print(f"\nlive run on the native step, full recording / none: {recording:.3f}; peak bandwidth "
          f"read {peak:.1f} GB/s; {peer_note or 'peer: llama-cpp-python ' + peer.version}")


if __name__ == "__main__":
    main()
