"""Serving benchmark: batched decode at batch 8 vs batch 1, continuous vs static batching on a
mixed-length stream, prefix sharing on vs off — all on the batched engine (engine/serving), in
paired rounds in one process (contestants alternate within a round, ratios taken per round, the
median reported: the machine is shared and noisy). Greedy outputs are checked equal between the
contestants of each comparison. Speculative decoding has its own bench (bench/spec_bench.py);
`--transformers-cb` adds transformers' own continuous batching (`generate_batch`) on a small
stream, the measurement behind building our own loop.

    python -m bench.serving_bench [--rounds 5] [--transformers-cb] [--out bench/out/serving.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # an entry point: offline unless asked, as the app

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from engine import load_model  # noqa: E402
from engine.serving.engine import serve  # noqa: E402
from engine.serving.record import RequestSpec, ServingConfig  # noqa: E402
from engine.serving.requests import make_requests  # noqa: E402

DECODE_PROMPT = "Write a long story about a lighthouse keeper and a storm."
MIXED = [("Write a long story about a dragon who learns to bake bread.", 96),
         ("What is 2 + 2?", 8), ("Name three colours.", 12),
         ("Explain in detail how a steam engine works.", 96), ("Say hi.", 6),
         ("List the planets of the solar system.", 24), ("What is the capital of Japan?", 10),
         ("Describe a walk through a forest in autumn, in detail.", 96),
         ("Translate 'good morning' into French.", 8), ("Give one tip for sleeping well.", 16),
         ("Write a poem about the sea.", 64), ("What does a CPU do?", 32)]
SYSTEM = ("You are a patient tutor for a university course on computer systems. Answer in plain "
          "words, give one example, keep answers short, never invent facts, say when you are not "
          "sure, and end with a question that checks understanding.")
SHARED_QUESTIONS = ["What is a cache?", "What is virtual memory?", "What is a thread?",
                    "What is a page fault?", "What is an interrupt?", "What is a TLB?",
                    "What is DMA?", "What is a context switch?"]


def decode_step_ms(lm, batch: int, tokens: int) -> tuple[float, list[list[int]]]:
    """Median ms of the decode steps that ran exactly `batch` requests (the same prompt each)."""
    requests = make_requests(lm.tokenizer, [DECODE_PROMPT] * batch, tokens)
    run = serve(lm, requests, ServingConfig("continuous", batch, 16, 256, False))
    steps = [s.ms for s in run.steps if s.kind == "decode" and s.batch_size == batch]
    return statistics.median(steps), [list(r.token_ids) for r in run.requests]


def stream_throughput(lm, requests, config: ServingConfig):
    run = serve(lm, requests, config)
    return run.throughput_tok_s, run


def with_system(lm, questions: list[str], tokens: int) -> tuple[RequestSpec, ...]:
    specs = []
    for q in questions:
        text = lm.tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            add_generation_prompt=True, tokenize=False)
        ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
        specs.append(RequestSpec(q, tuple(ids), tokens))
    return tuple(specs)


def transformers_cb(lm, requests) -> dict:
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=requests[0].max_new_tokens, do_sample=False,
                              eos_token_id=lm.model.generation_config.eos_token_id, pad_token_id=0)
    inputs = [list(r.prompt_token_ids) for r in requests]
    lm.model.generate_batch(inputs, generation_config=config)  # warm-up (it compiles graphs)
    start = time.perf_counter()
    out = lm.model.generate_batch(inputs, generation_config=config)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.generated_tokens) for o in out.values())
    ours = serve(lm, requests, ServingConfig("continuous", len(requests), 16, 256, True))
    return {"requests": len(requests), "tokens": tokens, "transformers_tok_s": tokens / seconds,
            "ours_tok_s": ours.throughput_tok_s,
            "same_tokens": [list(o.generated_tokens) for o in out.values()]
            == [list(r.token_ids) for r in ours.requests]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--transformers-cb", action="store_true")
    parser.add_argument("--out", default="bench/out/serving.json")
    args = parser.parse_args()
    lm = load_model()
    mixed = make_requests(lm.tokenizer, [p for p, _ in MIXED], [n for _, n in MIXED])
    shared = with_system(lm, SHARED_QUESTIONS, 8)
    batch_ratio, one_ms, eight_ms, cb_ratio, cont_tps, static_tps = [], [], [], [], [], []
    prefill_on, prefill_off, blocks_on, blocks_off = [], [], [], []
    same = True
    for _ in range(args.rounds):
        ms1, tok1 = decode_step_ms(lm, 1, args.tokens)
        ms8, tok8 = decode_step_ms(lm, 8, args.tokens)
        same &= all(t == tok1[0] for t in tok8)
        one_ms.append(ms1)
        eight_ms.append(ms8)
        batch_ratio.append((8 / ms8) / (1 / ms1))
        cont, run_c = stream_throughput(lm, mixed, ServingConfig("continuous", 4, 16, 256, False))
        stat, run_s = stream_throughput(lm, mixed, ServingConfig("static", 4, 16, 256, False))
        same &= [r.token_ids for r in run_c.requests] == [r.token_ids for r in run_s.requests]
        cont_tps.append(cont)
        static_tps.append(stat)
        cb_ratio.append(cont / stat)
        for sharing, prefill, blocks in ((True, prefill_on, blocks_on), (False, prefill_off, blocks_off)):
            run = serve(lm, shared, ServingConfig("continuous", 8, 16, 256, sharing))
            prefill.append(sum(s.ms for s in run.steps if s.kind != "decode"))
            blocks.append(max(s.blocks_used for s in run.steps))
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="minutes"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "threads": torch.get_num_threads(), "rounds": args.rounds,
        "decode_step_ms_batch1": statistics.median(one_ms),
        "decode_step_ms_batch8": statistics.median(eight_ms),
        "batch8_over_batch1_tok_s": statistics.median(batch_ratio),
        "continuous_tok_s": statistics.median(cont_tps), "static_tok_s": statistics.median(static_tps),
        "continuous_over_static": statistics.median(cb_ratio),
        "prefix_sharing_prefill_ms_on": statistics.median(prefill_on),
        "prefix_sharing_prefill_ms_off": statistics.median(prefill_off),
        "prefix_sharing_blocks_on": statistics.median(blocks_on),
        "prefix_sharing_blocks_off": statistics.median(blocks_off),
        "outputs_equal": same,
    }
    if args.transformers_cb:
        small = make_requests(lm.tokenizer, [p for p, _ in MIXED[:4]], 16)
        result["transformers_continuous_batching"] = transformers_cb(lm, small)
    print(f"decode step: batch 1 {result['decode_step_ms_batch1']:.1f} ms, batch 8 "
          f"{result['decode_step_ms_batch8']:.1f} ms → batch 8 / batch 1 tokens/s "
          f"{result['batch8_over_batch1_tok_s']:.2f}× (goal ≥ 4)")
    print(f"mixed stream (12 requests, max batch 4): continuous {result['continuous_tok_s']:.1f} "
          f"tok/s, static {result['static_tok_s']:.1f} → {result['continuous_over_static']:.2f}× "
          f"(goal ≥ 1.3)")
    print(f"shared system prompt (8 requests): prefill {result['prefix_sharing_prefill_ms_on']:.0f}"
          f" ms with sharing vs {result['prefix_sharing_prefill_ms_off']:.0f} without; blocks "
          f"{result['prefix_sharing_blocks_on']:.0f} vs {result['prefix_sharing_blocks_off']:.0f}")
    if "transformers_continuous_batching" in result:
        t = result["transformers_continuous_batching"]
        print(f"transformers generate_batch: {t['transformers_tok_s']:.1f} tok/s vs ours "
              f"{t['ours_tok_s']:.1f} on {t['requests']}×16 tokens (same tokens: {t['same_tokens']})")
    print(f"greedy outputs equal between contestants: {same}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
