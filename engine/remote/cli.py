"""`python -m engine loadtest --base-url URL ...`: a streamed load on an OpenAI-compatible serving
engine (vLLM above all) — per request TTFT, every inter-token gap, TPOT and end-to-end, measured
on the client; totals with p50/p90/p99; and the server's /metrics sampled during the run — as a
table or JSON, and the load-test record as a file. `--compare-local` runs the same load on this
app's batched engine and reports both, and whether their greedy tokens agree.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from ..errors import InputError
from ..outfile import add_out_options, out_file
from ..serving.cli import positive_int, write_record

DEFAULT_PROMPTS = (
    "What is the capital of France?",
    "Explain what a GPU is in two sentences.",
    "Write a haiku about rain.",
    "List three uses of a paper clip.",
    "Why is the sky blue?",
    "Give me a short tip for learning to cook.",
    "What does a compiler do?",
    "Describe the sea to someone who has never seen it.",
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser("loadtest", help="stream a load of greedy requests to an "
                                             "OpenAI-compatible server (vLLM) and time it")
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8011/v1")
    parser.add_argument("--model", default=None, help="served model id (default: the first listed)")
    parser.add_argument("--requests", type=positive_int, default=8)
    parser.add_argument("--concurrency", type=positive_int, default=8,
                        help="requests in flight at most (default 8)")
    parser.add_argument("--rate", type=float, default=None,
                        help="send as a Poisson process of this many requests/s")
    parser.add_argument("--max-new-tokens", type=positive_int, default=32)
    parser.add_argument("--prompt", action="append", default=None, metavar="TEXT",
                        help="a prompt (repeat; default: eight sample questions, cycled)")
    parser.add_argument("--raw", action="store_true",
                        help="send prompts as typed (default: the default model's chat template)")
    parser.add_argument("--compare-local", action="store_true",
                        help="also run the same load on this app's batched engine")
    add_out_options(parser, "the load-test record (JSON)")
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    return parser


def summary(run: Any, local: Any = None, agree: Any = None) -> dict[str, Any]:
    """The --json shape: per request, totals, the server's view, and its /metrics samples."""
    from .summary import client_stats, server_stats

    client, server = client_stats(run), server_stats(run)
    out: dict[str, Any] = {
        "model": run.server, "base_url": run.config.base_url, "error": run.error,
        "kv_block_size": run.kv_block_size, "kv_blocks": run.kv_blocks,
        "metrics_error": run.metrics_error,
        "requests": [{"ttft_ms": r.ttft_ms, "itl_ms": list(r.itl_ms), "e2e_ms": r.e2e_ms,
                      "tpot_ms": r.tpot_ms, "output_tokens": r.output_tokens,
                      "prompt_tokens": r.prompt_tokens, "finish": r.finish, "error": r.error,
                      "text": r.text} for r in run.requests],
        "totals": {"requests_done": client.requests_done, "output_tokens": client.output_tokens,
                   "duration_ms": run.duration_ms, "throughput_tok_s": client.throughput_tok_s,
                   "ttft_ms": client.ttft, "itl_ms": client.itl, "tpot_ms": client.tpot,
                   "e2e_ms": client.e2e},
        "server": None if server is None else {
            **{k: v for k, v in asdict(server).items()},
            "prefix_hit_rate": server.prefix_hit_rate, "acceptance": server.acceptance},
        "metrics_samples": [{k: v for k, v in asdict(s).items() if k not in ("ttft", "itl")}
                            for s in run.samples],
    }
    if local is not None:
        from .compare import side_by_side

        out["side_by_side"] = [asdict(row) for row in side_by_side(local, run, run.server)]
        out["agreement"] = [{**asdict(a), "explained": a.explained} for a in agree or []]
    return out


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def table(run: Any) -> str:
    from .summary import client_stats, server_stats

    lines = [f"{'req':>3} {'out':>4} {'TTFT ms':>8} {'TPOT ms':>8} {'e2e ms':>8}  finish  text"]
    for r in run.requests:
        lines.append(f"{r.id:3d} {r.output_tokens:4d} {_ms(r.ttft_ms):>8} {_ms(r.tpot_ms):>8} "
                     f"{_ms(r.e2e_ms):>8}  {r.finish:6}  {(r.error or r.text)[:40]!r}")
    c = client_stats(run)
    lines.append(f"{c.output_tokens} tokens in {run.duration_ms:.0f} ms: {c.throughput_tok_s:.1f} "
                 f"tokens/s; TTFT p50 {_ms(c.ttft['p50'])} p90 {_ms(c.ttft['p90'])} p99 "
                 f"{_ms(c.ttft['p99'])} ms; ITL p50 {_ms(c.itl['p50'])} p90 {_ms(c.itl['p90'])} "
                 f"p99 {_ms(c.itl['p99'])} ms")
    s = server_stats(run)
    pool = f" of {run.kv_blocks} blocks of {run.kv_block_size} tokens" if run.kv_blocks else ""
    if s is not None:
        lines.append(f"server: TTFT mean {_ms(s.ttft['mean'])} ms (client {_ms(c.ttft['mean'])}), "
                     f"ITL mean {_ms(s.itl['mean'])} ms (client {_ms(c.itl['mean'])}); peak "
                     f"running {s.peak_running}, waiting {s.peak_waiting}, KV usage "
                     f"{'–' if s.peak_kv_usage is None else f'{100 * s.peak_kv_usage:.1f} %'}"
                     f"{pool}; "
                     f"preemptions {s.preemptions}; prefix hits {s.prefix_hits} of "
                     f"{s.prefix_queries} tokens")
    elif run.metrics_error:
        lines.append(run.metrics_error)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..loader import load_model
    from .client import normalize_base_url
    from .compare import agreement, chat_text, default_tokenizer, run_local
    from .loadfile import load_to_bytes
    from .loadtest import LoadTest
    from .record import LoadConfig

    out = out_file(args.out, args.force)
    try:
        config = LoadConfig(normalize_base_url(args.base_url), args.model or "",
                            tuple(args.prompt or DEFAULT_PROMPTS), args.requests,
                            args.max_new_tokens, args.concurrency, args.rate, not args.raw)
    except ValueError as error:
        raise InputError(str(error)) from None
    lm = load_model() if args.compare_local else None
    tokenizer = None if args.raw else lm.tokenizer if lm is not None else default_tokenizer()
    render = None if tokenizer is None else (lambda p: chat_text(tokenizer, p))
    record = LoadTest(config, render).run_all()
    local = agree = None
    if args.compare_local and lm is not None:
        local = run_local(lm, config)
        agree = agreement(lm, local, record)
    if args.json:
        json.dump(summary(record, local, agree), sys.stdout, indent=1)
        print()
    else:
        print(table(record))
        if local is not None:
            from ..serving.cli import table as local_table

            print("\nthe same load on this app's engine:\n" + local_table(local))
            equal = sum(1 for a in agree if a.equal)
            print(f"greedy tokens equal for {equal} of {len(agree)} requests"
                  + "".join(f"; request {a.id} parts at token {a.first_diff} (top-2 gap "
                            f"{a.gap:.3f}{', a near-tie' if a.explained else ', NOT a near-tie'})"
                            for a in agree if a.equal is False))
    if out is not None:
        write_record(out, load_to_bytes(record), args.json)
    if record.error:
        print(f"error: {record.error}", file=sys.stderr)
        return 1
    return 0
