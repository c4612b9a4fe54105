"""`python -m engine kv-shrink PROMPT --method M --budget B`: shrink the KV cache of a live run.

The loaded model generates greedily after PROMPT (the unmodified run: the tokens the user would
see), then the method reads the same tokens teacher-forced (engine/kv/shrink/run.py) and the
command prints bytes held and read, quality against the unmodified model and decode time — the
numbers of one point of the KV cache page's "Shrink the cache" chart. `--method` and `--budget`
take several values: one line (or JSON object) per pair. `--needle TOKENS --depth D` hides the
needle in a haystack of that length and reads it with each pair (the page's needle table);
`--lengths N …` measures the unmodified model's KV bytes, TTFT and ITL at each prompt length
(the page's long-context chart). Registered by engine/__main__.py; importing this module loads no
torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ...errors import InputError
from .budget import METHODS, Shrink, parse_budget

MAX_PAIRS = 32


def add_parser(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser("kv-shrink", help="shrink the KV cache of a live run (latent, top-k, "
                                              "H2O, SnapKV, window, key norm): bytes vs quality")
    parser.add_argument("prompt", metavar="PROMPT", nargs="?", default=None)
    parser.add_argument("--held-out", action="store_true",
                        help="read the held-out text (the Gettysburg Address: its first 32 "
                             "tokens as the prompt, the next 96 read) instead of a run of PROMPT")
    parser.add_argument("--needle", type=int, default=None, metavar="TOKENS",
                        help="read a needle in a haystack of about TOKENS tokens instead")
    parser.add_argument("--depth", type=float, default=0.25,
                        help="where the needle sits in the haystack, 0 (start) to 1 (end)")
    parser.add_argument("--lengths", type=int, nargs="+", default=None, metavar="N",
                        help="measure the unmodified model's KV bytes, TTFT and ITL after "
                             "prompts of these lengths (no --method)")
    parser.add_argument("--method", nargs="+", default=None, choices=list(METHODS))
    parser.add_argument("--budget", nargs="+", default=None,
                        help="'full' (the method off), a whole number (a latent rank, keys per "
                             "head, or tokens kept) or a percentage such as 25%%")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--layer", type=int, default=None,
                        help="the layer whose attention rows are kept (default: the middle one)")
    parser.add_argument("--raw", action="store_true", help="no chat template")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--model", default=None, help="hub id, local folder or .gguf file "
                                                      "(default: SmolLM2-135M)")
    return parser


def line(summary: dict[str, Any]) -> str:
    return (f"{summary['method']:>8} {summary['budget']:>6}  KV {summary['kv_bytes']:>10,} B "
            f"({summary['kv_bytes'] / max(1, summary['dense_kv_bytes']):4.0%})  read/step "
            f"{summary['read_bytes_per_step']:>10,} B  KL {summary['kl']:.4f}  top-1 "
            f"{summary['top1_agreement']:.1%}  ppl {summary['ppl']:.3f} (unmodified "
            f"{summary['dense_ppl']:.3f})  decode {summary['decode_ms']:.1f} ms (unmodified "
            f"{summary['dense_decode_ms']:.1f})")


def run(args: argparse.Namespace) -> int:
    from ...loader import load_model
    from ...runner import generate_trace
    from ...settings import GenerationSettings
    from .run import held_out_sequence, shrink_runs

    modes = [args.prompt is not None, args.held_out, args.needle is not None,
             args.lengths is not None]
    if sum(modes) != 1:
        raise InputError("give one of PROMPT, --held-out, --needle TOKENS or --lengths N …")
    if args.lengths is not None:
        return _lengths(args)
    if not args.method or not args.budget:
        raise InputError("give --method and --budget")
    if args.prompt is not None and not args.prompt.strip():
        raise InputError("the prompt is empty")
    if not 1 <= args.max_new_tokens <= 4096:
        raise InputError("--max-new-tokens must be between 1 and 4096")
    shrinks = [Shrink(m, parse_budget(b)) for m in args.method for b in args.budget]
    if len(shrinks) > MAX_PAIRS:
        raise InputError(f"at most {MAX_PAIRS} method × budget pairs, got {len(shrinks)}")
    if args.needle is not None:
        return _needle(args, shrinks)
    lm = load_model(args.model)
    if args.layer is not None and not 0 <= args.layer < lm.spec.layers:
        raise InputError(f"--layer must be between 0 and {lm.spec.layers - 1}")
    if args.held_out:
        ids, n = held_out_sequence(lm)
    else:
        trace = generate_trace(lm, args.prompt, GenerationSettings(
            max_new_tokens=args.max_new_tokens, chat_template=not args.raw,
            record_attention=False, record_hidden=False))
        n = len(trace.prompt_token_ids)
        ids = list(trace.prompt_token_ids) + list(trace.output_token_ids)
    if len(ids) <= n:
        raise InputError("the run generated no token to score")
    for found in shrink_runs(lm, ids, n, shrinks, args.layer,
                             source="held-out" if args.held_out else "run"):
        summary = found.summary()
        print(json.dumps(summary) if args.json else line(summary), flush=True)
    if not args.json:
        print("KV: cache bytes held at the end (tensors' nbytes); read/step: bytes of cache one "
              "decode step's attention reads (median); KL(unmodified ‖ method) and top-1 over "
              "every position after the prompt, teacher-forced; ppl of the run's own tokens",
              file=sys.stderr)
    return 0


def _needle(args: argparse.Namespace, shrinks: list[Shrink]) -> int:
    from ...loader import load_model
    from .needle import needle_probe

    if not 16 <= args.needle <= 131_072:
        raise InputError("--needle must be between 16 and 131072 tokens")
    lm = load_model(args.model)
    for r in needle_probe(lm, shrinks, args.needle, args.depth):
        found = {"method": r.method or "unmodified", "budget": r.budget, "found": r.found,
                 "answer_logprob": round(r.answer_logprob, 4), "kv_bytes": r.kv_bytes,
                 "tokens": args.needle, "depth": args.depth}
        print(json.dumps(found) if args.json else
              f"{found['method']:>10} {found['budget']:>6}  {'finds' if r.found else 'misses':<6} "
              f"the needle  log p(answer) {r.answer_logprob:8.3f}  KV {r.kv_bytes:>12,} B",
              flush=True)
    return 0


def _lengths(args: argparse.Namespace) -> int:
    from ...loader import load_model
    from .needle import long_context

    if args.method or args.budget:
        raise InputError("--lengths measures the unmodified model: no --method or --budget")
    if not all(16 <= n <= 131_072 for n in args.lengths) or len(args.lengths) > 16:
        raise InputError("--lengths takes up to 16 lengths between 16 and 131072 tokens")
    lm = load_model(args.model)
    if lm.spec.max_context and max(args.lengths) > lm.spec.max_context:
        raise InputError(f"the model's context is {lm.spec.max_context:,} tokens")
    for p in long_context(lm, list(args.lengths)):
        found = {"tokens": p.tokens, "kv_bytes": p.kv_bytes, "ttft_ms": round(p.ttft_ms, 2),
                 "itl_ms": round(p.itl_ms, 3), "delayed": p.delayed}
        print(json.dumps(found) if args.json else
              f"{p.tokens:>7,} tokens  KV {p.kv_bytes:>12,} B  TTFT {p.ttft_ms:9.1f} ms  "
              f"ITL {p.itl_ms:7.2f} ms" + ("  (delayed by other work)" if p.delayed else ""),
              flush=True)
    return 0
