"""Speculative decoding benchmark: plain greedy vs prompt-lookup speculation on the loaded model.

Two samples (engine/serving/speculative.py, the Serving page uses the same): a "rewrite" prompt
whose answer copies long spans of the prompt (drafts are accepted; the issue's goal is ≥ 1.5×
tokens/s there, equal output) and free writing (drafts are rare and mostly rejected; speculation
should cost little). For each, `compare_speculation` runs both in one process, in paired rounds
whose order alternates, after a warm-up; the speedup is the median of the per-round tokens/s
ratios. Both decoders are transformers' forward on a DynamicCache (plain: one token a forward;
speculative: the last token + k drafts a forward), so the ratio is speculation's alone. Before
timing, plain greedy's tokens are checked against `model.generate`.

    python -m bench.spec_bench [--tokens 96] [--rounds 5] [--draft-tokens 4] [--ngram 3]
                               [--out bench/out/spec.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # an entry point: offline unless asked, as the app

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from engine import load_model  # noqa: E402
from engine.forward import prepare_prompt  # noqa: E402
from engine.serving.speculative import (  # noqa: E402
    FREE_PROMPT,
    REWRITE_PROMPT,
    compare_speculation,
    plain_greedy,
)

SAMPLES = {"rewrite": REWRITE_PROMPT, "free": FREE_PROMPT}
GOAL_SPEEDUP = 1.5  # issue 17: prompt lookup on the rewrite sample, equal output


def run(tokens: int = 96, rounds: int = 5, draft_tokens: int = 4, ngram: int = 3,
        out: str | None = "bench/out/spec.json") -> dict[str, Any]:
    """Measure both samples; return (and write to `out`) the report."""
    lm = load_model()
    rows: dict[str, Any] = {}
    for name, prompt in SAMPLES.items():
        ids = prepare_prompt(lm.tokenizer, prompt, True)
        with torch.inference_mode():
            reference = lm.model.generate(torch.tensor([ids], device=lm.device),
                                          max_new_tokens=tokens, do_sample=False)[0, len(ids):]
        if plain_greedy(lm, ids, tokens).token_ids != tuple(reference.tolist()):
            raise SystemExit(f"{name}: plain greedy differs from generate")
        result = compare_speculation(lm, ids, tokens, draft_tokens, ngram, rounds)
        spec = result.result.speculation
        rows[name] = {
            "prompt_tokens": len(ids), "output_tokens": len(result.plain_token_ids),
            "plain_tok_s": result.plain_tokens_per_s,
            "speculative_tok_s": result.speculative_tokens_per_s,
            "speedup": result.speedup, "equal_output": result.equal,
            "acceptance_rate": spec.acceptance_rate,
            "tokens_per_verify_step": spec.tokens_per_verify_step,
            "verify_steps": spec.verify_steps, "accepted": spec.accepted,
            "proposed": spec.proposed, "plain_ms": list(result.plain_ms),
            "speculative_ms": list(result.speculative_ms),
        }
    rewrite = rows["rewrite"]
    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
                   f"threads {torch.get_num_threads()}, device {lm.device}",
        "new_tokens": tokens, "rounds": rounds, "draft_tokens": draft_tokens, "ngram": ngram,
        "samples": rows,
        "goal": f"rewrite speedup >= {GOAL_SPEEDUP} with equal output",
        "goal_met": bool(rewrite["equal_output"] and rewrite["speedup"] >= GOAL_SPEEDUP),
    }
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print("\n| sample | plain tok/s | speculative tok/s | speedup | equal | acceptance | "
          "tokens / verify step |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        rate = "–" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.0%}"
        each = "–" if r["tokens_per_verify_step"] is None else f"{r['tokens_per_verify_step']:.2f}"
        print(f"| {name} | {r['plain_tok_s']:.1f} | {r['speculative_tok_s']:.1f} | "
              f"{r['speedup']:.2f}× | {'yes' if r['equal_output'] else 'NO'} | {rate} | {each} |")
    print(f"\ngoal ({report['goal']}): {'met' if report['goal_met'] else 'NOT met'}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--out", default="bench/out/spec.json")
    args = parser.parse_args()
    run(args.tokens, args.rounds, args.draft_tokens, args.ngram, args.out)


if __name__ == "__main__":
    main()
