"""`python -m engine batch PROMPT [PROMPT ...]`: a stream of requests served by the batched engine
— every request's tokens and timings, every step's batch and blocks — as a table or JSON, and the
serving record as a file. Registered by engine/__main__.py; importing this module loads no torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import InputError
from ..outfile import OutFile, add_out_options, out_file

DEFAULTS = {"max_new_tokens": 32, "max_batch": 8, "block_size": 16, "num_blocks": 256}


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def write_record(out: OutFile, data: bytes, json_on_stdout: bool) -> None:
    """Write a record file and say where (on stderr when stdout carries JSON)."""
    out.write(data)
    print(f"record       {out.path}", file=sys.stderr if json_on_stdout else sys.stdout)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser("batch", help="serve several prompts together on the batched engine "
                                          "(continuous or static batching, paged KV blocks)")
    parser.add_argument("prompts", nargs="+", metavar="PROMPT")
    parser.add_argument("--max-new-tokens", type=positive_int, default=DEFAULTS["max_new_tokens"])
    parser.add_argument("--scheduler", choices=("continuous", "static"), default="continuous")
    parser.add_argument("--max-batch", type=positive_int, default=DEFAULTS["max_batch"],
                        help="requests decoded together at most (default 8)")
    parser.add_argument("--block-size", type=positive_int, default=DEFAULTS["block_size"],
                        help="token slots per KV block (default 16)")
    parser.add_argument("--num-blocks", type=positive_int, default=DEFAULTS["num_blocks"],
                        help="blocks in the pool (default 256)")
    parser.add_argument("--prefix-sharing", action=argparse.BooleanOptionalAction, default=True,
                        help="share full blocks of equal prompt prefixes (default on)")
    parser.add_argument("--arrival", choices=("all", "poisson"), default="all")
    parser.add_argument("--rate", type=float, default=2.0, help="requests per second (poisson)")
    parser.add_argument("--raw", action="store_true", help="no chat template")
    add_out_options(parser, "the serving record (JSON)")
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    parser.add_argument("--model", default=None, help="hub id or local folder (default: "
                                                      "SmolLM2-135M)")
    return parser


def summary(run: Any) -> dict[str, Any]:
    """The --json shape: per request ids and timings, per step batch and blocks, throughput."""
    return {
        "requests": [{"prompt": r.spec.prompt, "prompt_token_ids": list(r.spec.prompt_token_ids),
                      "output_token_ids": list(r.token_ids), "ttft_ms": r.ttft_ms,
                      "itl_ms": list(r.itl_ms), "queue_ms": r.queue_ms, "finish": r.finish,
                      "cached_tokens": r.cached_tokens} for r in run.requests],
        "steps": [{"batch_size": s.batch_size, "blocks_used": s.blocks_used, "ms": s.ms,
                   "kind": s.kind} for s in run.steps],
        "throughput_tok_s": run.throughput_tok_s,
    }


def table(run: Any) -> str:
    lines = [f"{'req':>3} {'prompt tok':>10} {'cached':>6} {'out':>4} {'queue ms':>9} "
             f"{'TTFT ms':>8} {'TPOT ms':>8}  finish  text"]
    for r in run.requests:
        def ms(value: float | None) -> str:
            return "–" if value is None else f"{value:.1f}"
        lines.append(f"{r.id:3d} {len(r.spec.prompt_token_ids):10d} {r.cached_tokens:6d} "
                     f"{len(r.token_ids):4d} {ms(r.queue_ms):>9} {ms(r.ttft_ms):>8} "
                     f"{ms(r.tpot_ms):>8}  {r.finish:6}  {r.text[:40]!r}")
    batches = [s.batch_size for s in run.steps]
    mean_batch = sum(batches) / len(batches) if batches else 0.0
    lines.append(f"{run.output_tokens} tokens in {run.duration_ms:.0f} ms: "
                 f"{run.throughput_tok_s:.1f} tokens/s; {len(run.steps)} steps, mean batch "
                 f"{mean_batch:.2f}, most blocks in use {max((s.blocks_used for s in run.steps), default=0)}"
                 f" of {run.config.num_blocks}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..loader import load_model
    from .engine import serve
    from .record import ServingConfig
    from .requests import make_requests
    from .servingfile import serving_to_bytes

    if any(not p.strip() for p in args.prompts):
        raise InputError("a prompt is empty")
    out = out_file(args.out, args.force)
    try:
        config = ServingConfig(args.scheduler, args.max_batch, args.block_size, args.num_blocks,
                               args.prefix_sharing)
    except ValueError as error:
        raise InputError(str(error)) from None
    if not sys.stderr.isatty():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    lm = load_model(args.model)
    requests = make_requests(lm.tokenizer, args.prompts, args.max_new_tokens, args.arrival,
                             args.rate, chat_template=not args.raw)
    record = serve(lm, requests, config)
    refused = [r for r in record.requests if r.finish == "refused"]
    for r in refused:
        print(f"request {r.id} refused: it can never fit this pool or the model's context",
              file=sys.stderr)
    if args.json:
        json.dump(summary(record), sys.stdout, indent=1)
        print()
    else:
        print(table(record))
    if out is not None:
        write_record(out, serving_to_bytes(record), args.json)
    return 0
