"""What if, timed: a branch on the cached prefix against generating the same number of tokens,
and the full activation-patching sweep on a 12-token pair.

Per round, interleaved so a busy moment hits both: a Run generating `--tokens` tokens from the
prompt (prefill + decode steps, on the native step as the app runs it); then a branch of the
run at token 2 with the runner-up candidate, which computes `--tokens` tokens after the branch
point from the cached prefix (no prefill), and the same branch recomputed from nothing (both
recorded by engine/whatif/branch.py). Then the patching sweep (30 layers × 12 positions) per
round. Medians with min–max; the load average before and after each round.

From the repository root:

    python -m bench.whatif_bench [--rounds 3] [--tokens 32] [--out bench/out/whatif.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

from engine import GenerationSettings, Run, load_model  # noqa: E402
from engine.clock import load_average  # noqa: E402
from engine.forward import prepare_prompt  # noqa: E402
from engine.models import native_decoder  # noqa: E402
from engine.whatif.branch import branch, run_snapshot  # noqa: E402
from engine.whatif.patch import patch_grid  # noqa: E402

PROMPT = "Write a long story about a robot who learns to paint."
CLEAN = "The Eiffel Tower is in the city of Paris and the"
CORRUPT = "The Colosseum is in the city of Rome and the"
AT = 2


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("bench/out/whatif.json"))
    args = parser.parse_args(argv)
    lm = load_model(None)
    native = native_decoder(lm)
    n = args.tokens
    gen = GenerationSettings(max_new_tokens=n, temperature=0.0, seed=0)
    parent_settings = GenerationSettings(max_new_tokens=AT + 1 + n, temperature=0.0, seed=0)
    Run(lm, PROMPT, gen, native=native).run_all()  # warm-up: threads, caches, the first step
    rounds = []
    for r in range(args.rounds):
        load_before = load_average()
        start = time.perf_counter()
        generated = Run(lm, PROMPT, gen, native=native).run_all()
        generate_ms = (time.perf_counter() - start) * 1000.0
        parent = Run(lm, PROMPT, parent_settings, native=native).run_all()
        snapshot, _ = run_snapshot(lm, parent)
        token = int(parent.steps[AT].top_ids[1])
        b = branch(lm, parent, AT, token, snapshot, native=native).trace
        rounds.append({"round": r, "generate_ms": generate_ms, "generated": len(generated.steps),
                       "prompt_tokens": len(generated.prompt_token_ids),
                       "branch_ms": b.branch.branch_ms, "rerun_ms": b.branch.rerun_ms,
                       "computed": b.branch.computed_tokens, "reused": b.branch.reused_tokens,
                       "same_as_rerun": b.branch.same_as_rerun, "decoder": b.decoder.name,
                       "load_before": load_before, "load_after": load_average()})
    clean, corrupt = (prepare_prompt(lm.tokenizer, p, False) for p in (CLEAN, CORRUPT))
    patch_s = []
    for _ in range(args.rounds):
        found = patch_grid(lm, clean, corrupt)
        patch_s.append(found.seconds)
    result = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "tokens": n, "rounds": rounds,
        "generate_ms": _spread([r["generate_ms"] for r in rounds]),
        "branch_ms": _spread([r["branch_ms"] for r in rounds]),
        "rerun_ms": _spread([r["rerun_ms"] for r in rounds]),
        "patch": {"positions": len(clean), "layers": lm.spec.layers, "seconds": _spread(patch_s)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    g, b, rr = result["generate_ms"], result["branch_ms"], result["rerun_ms"]
    print(f"generating {n} tokens ({rounds[0]['prompt_tokens']}-token prompt): "
          f"{g['median']:.0f} ms ({g['min']:.0f}–{g['max']:.0f})")
    print(f"branch at token {AT}, {rounds[0]['computed']} tokens computed, {rounds[0]['reused']} "
          f"positions reused: {b['median']:.0f} ms ({b['min']:.0f}–{b['max']:.0f}); the same "
          f"branch re-run from nothing {rr['median']:.0f} ms ({rr['min']:.0f}–{rr['max']:.0f})")
    p = result["patch"]
    print(f"patching sweep, {p['layers']} layers × {p['positions']} positions: "
          f"{p['seconds']['median']:.2f} s ({p['seconds']['min']:.2f}–{p['seconds']['max']:.2f})")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
