"""One measurement of this engine on a GGUF file, in a fresh process (bench/gguf_bench.py starts
one per round; the `big_model` tests one per file), printed as one JSON line.

Why a fresh process each time: the open time, the peak RSS and what the mapping faults in belong
to one model only if nothing was loaded before it, and each round then starts from the same
state (the file in the page cache or not, as the parent records).

    .venv/bin/python -m bench.gguf_ours FILE [--threads 2] [--prompt 64] [--long 512]
        [--steps 32] [--agree 16] [--logits-out first.npy]

In order: the imports, those load_model would make lazily included (their time and RSS reported
apart), `load_model` (the open time), the C decode
step's setup, then a greedy run of `--agree` tokens after the `--prompt` ids (the first prefill
after opening, which faults the mapped weights in, timed apart as the cold TTFT; its logits
saved to `--logits-out` for the agreement with llama.cpp), then the timed window: TTFT of the
short prompt (prefill to the first token's logits and its argmax), `--steps` decode steps after
it (a plain read of the bytes a step streams right before and right after them), TTFT of the
`--long` prompt. Over that window the process's CPU time and the machine's other
work are read as the app reads them for each step (engine/clock.py), and the app's rule
(engine/timing/disturbance.py) says whether other work disturbed it.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # an entry point: offline unless asked, as the app

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

# What load_model imports on its first GGUF (engine/gguf/reader.py, vocab.py, mapped.py), imported
# before the clock starts: the open time is the model's, as llama.cpp's load_s excludes its own
# import. Timed apart as imports_s; a module missing here only moves its time into the open.
LAZY_IMPORTS = ("gguf", "tokenizers", "transformers.models.llama.modeling_llama",
                "transformers.integrations.gguf.gguf_tokenizer_mapping",
                "transformers.integrations.gguf.reader", "transformers.tokenization_utils_tokenizers")


def peak_rss_bytes() -> int:
    """This process's peak resident set: VmHWM, the high-water mark of its own address space.
    Not ru_maxrss where VmHWM exists: Linux carries the larger of the parent's RSS at the fork
    into a child's ru_maxrss across exec, so a child of a parent holding a GB (the benchmark's
    bandwidth buffer) would report that GB. ru_maxrss (KiB on Linux) elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def read_bytes_per_step(decoder, lm) -> int:
    """Bytes of stored weights one decode step reads: the decoder's matrices, except that an
    untied embedding table is read for one row only (decoder.weight_bytes counts it whole)."""
    embed, head = lm.model.model.embed_tokens.matrix, getattr(lm.model.lm_head, "matrix", None)
    if head is embed:
        return decoder.weight_bytes
    return decoder.weight_bytes - embed.nbytes + embed.row_bytes


def same_bytes_gb_s(decoder, threads: int, times: int = 2) -> float:
    """GB/s of the best of `times` plain reads of the matrices a decode step streams, with the
    step's threads: the bandwidth of this moment, taken right before and after the timed steps
    (the bracketed MBU: bench/gguf_bench.py)."""
    from engine.gguf.stored import plain_read_s

    total = sum(n for _, n in decoder.streamed)
    return max(total / plain_read_s(decoder.streamed, threads) for _ in range(times)) / 1e9


def measure(path: Path, threads: int, prompt: int, long: int, steps: int, agree: int,
            logits_out: Path | None) -> dict:
    import torch

    torch.set_num_threads(threads)
    from bench.gguf_files import prompt_ids
    from engine.clock import MachineSample, clock_ms, others_share
    from engine.forward import timed_greedy
    from engine.loader import load_model
    from engine.models import native_decoder
    from engine.timing.disturbance import CPU_SHARE_LIMIT, OTHERS_LIMIT

    start = time.perf_counter()
    for name in LAZY_IMPORTS:
        importlib.import_module(name)
    imports_s = time.perf_counter() - start
    rss_imports = peak_rss_bytes()
    start = time.perf_counter()
    lm = load_model(str(path))
    open_s = time.perf_counter() - start
    rss_open = peak_rss_bytes()
    start = time.perf_counter()
    decoder = native_decoder(lm, "fp32", max(prompt + max(steps, agree), long) + 1)
    setup_s = time.perf_counter() - start
    device = lm.device
    ids = prompt_ids(max(prompt, long))
    short = ids[:prompt]
    with torch.inference_mode():
        start = clock_ms(device)
        logits = decoder.prefill(short)
        first = int(logits.argmax())
        cold_ttft_ms = clock_ms(device) - start
        if logits_out is not None:
            import numpy as np

            np.save(logits_out, logits.float().numpy())
        tokens = [first]
        if agree > 1:
            tokens, _ = timed_greedy(logits, lambda t, i: decoder.step_logits(t, prompt + i),
                                     agree, device)
        before = MachineSample.now(device)
        start = clock_ms(device)
        logits = decoder.prefill(short)
        logits.argmax()
        ttft_ms = clock_ms(device) - start
        read_before = same_bytes_gb_s(decoder, threads)
        _, step_ms = timed_greedy(logits, lambda t, i: decoder.step_logits(t, prompt + i),
                                  steps + 1, device)
        read_after = same_bytes_gb_s(decoder, threads)
        ttft_long_ms = None
        if long:
            start = clock_ms(device)
            decoder.prefill(ids[:long]).argmax()
            ttft_long_ms = clock_ms(device) - start
        after = MachineSample.now(device)
    wall = after.wall_ms - before.wall_ms
    cpu_share = (after.cpu_ms - before.cpu_ms) / (threads * wall)
    others = others_share(before, after)
    cfg, c = lm.model.config, decoder.config
    # the float32 K and V rows a step reads, at the timed steps' middle position
    kv_step = 2 * c.layers * c.kv_heads * c.head_dim * 4 * (prompt + (steps + 1) // 2)
    return {
        "file_bytes": path.stat().st_size, "threads": threads, "vocab": int(logits.numel()),
        "layers": cfg.num_hidden_layers, "imports_s": imports_s, "open_s": open_s,
        "setup_s": setup_s,
        "rss_after_imports": rss_imports, "rss_after_open": rss_open, "peak_rss": peak_rss_bytes(),
        "weight_bytes": decoder.weight_bytes, "read_bytes": read_bytes_per_step(decoder, lm),
        "step_read_bytes": read_bytes_per_step(decoder, lm) + kv_step,
        "kv_bytes": decoder.keys.nbytes + decoder.values.nbytes,
        "kv_positions": decoder.max_tokens, "kv_heads": c.kv_heads, "head_dim": c.head_dim,
        "stored_as": decoder.stored_as, "cold_ttft_ms": cold_ttft_ms, "tokens": tokens,
        "ttft_ms": ttft_ms, "ttft_long_ms": ttft_long_ms, "step_ms": step_ms,
        "itl_ms": statistics.median(step_ms) if step_ms else None,
        "read_gb_s_around_steps": [read_before, read_after],
        "window": {"wall_ms": wall, "cpu_share": cpu_share, "others_share": others,
                   "disturbed": others is not None and others >= OTHERS_LIMIT
                   and cpu_share < CPU_SHARE_LIMIT},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt", type=int, default=64, help="the short prompt's tokens")
    p.add_argument("--long", type=int, default=512, help="the long prompt's tokens (0: none)")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps after the prompt")
    p.add_argument("--agree", type=int, default=16, help="greedy tokens for the agreement")
    p.add_argument("--logits-out", type=Path, help="save the first step's logits here (.npy)")
    a = p.parse_args(argv)
    if a.prompt < 1 or a.long < 0 or a.steps < 1 or a.agree < 1:
        p.error("--prompt, --steps and --agree must be positive, --long not negative")
    print(json.dumps(measure(a.file, a.threads, a.prompt, a.long, a.steps, a.agree,
                             a.logits_out)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
