"""`python -m engine together PROMPT [PROMPT ...]`: recorded runs decoded together, as the hosted
demo batches its visitors — each prompt its own Run (its own trace: tokens, timings, attention,
KV bytes) in a thread of its own, all started at once, every prefill and decode step one forward
of a StepBatcher (batcher.py). Prints each run's first-token time, inter-token latency and the
batch sizes its steps ran in, as a table or JSON; `--out-dir` writes each trace file.
Registered by engine/__main__.py; importing this module loads no torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
from pathlib import Path
from typing import Any

from ..errors import EngineError, InputError
from ..outfile import OutFile, out_file
from .cli import positive_int

MAX_RUNS = 64


def add_parser(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser("together", help="record several prompts' runs decoded together in "
                                             "one live batch, as the hosted demo serves a class")
    parser.add_argument("prompts", nargs="+", metavar="PROMPT")
    parser.add_argument("--max-new-tokens", type=positive_int, default=32)
    parser.add_argument("--max-batch", type=positive_int, default=32,
                        help="runs decoded together at most; the others wait for a place "
                             "(default 32)")
    parser.add_argument("--raw", action="store_true", help="no chat template")
    parser.add_argument("--out-dir", default=None, metavar="DIR",
                        help="write each run's trace to DIR/together-N.npz (never over an "
                             "existing file without --force)")
    parser.add_argument("--force", action="store_true", help="replace existing trace files")
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    parser.add_argument("--model", default=None, help="hub id or local folder (default: "
                                                      "SmolLM2-135M)")
    return parser


def trace_files(args: argparse.Namespace) -> list[OutFile] | None:
    """The trace files to write, each checked before any work (None without --out-dir)."""
    if args.out_dir is None:
        return None
    folder = Path(args.out_dir)
    if not folder.is_dir():
        raise InputError(f"--out-dir {str(folder)[:200]}: no such folder")
    return [out_file(str(folder / f"together-{i + 1}.npz"), args.force)
            for i in range(len(args.prompts))]


def summary(traces: list[Any]) -> list[dict[str, Any]]:
    """The --json shape: per run its tokens, times and the batch of every step."""
    return [{"prompt": t.prompt, "output_token_ids": list(t.output_token_ids),
             "text": t.output_text, "stop_reason": t.stop_reason,
             "ttft_ms": t.steps[0].latency_ms if t.steps else None,
             "itl_ms": [s.latency_ms for s in t.steps[1:]],
             "batches": [s.batch for s in t.steps], "decoder": t.decoder.name} for t in traces]


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'run':>3} {'out':>4} {'TTFT ms':>8} {'ITL ms':>7} {'prefill batch':>13} "
             f"{'decode batch':>12}  stop    text"]
    for i, r in enumerate(rows, 1):
        itl = f"{statistics.median(r['itl_ms']):.1f}" if r["itl_ms"] else "–"
        ttft = "–" if r["ttft_ms"] is None else f"{r['ttft_ms']:.0f}"
        first = r["batches"][0] if r["batches"] else "–"
        decode = f"{statistics.median(r['batches'][1:]):g}" if len(r["batches"]) > 1 else "–"
        lines.append(f"{i:3d} {len(r['output_token_ids']):4d} {ttft:>8} {itl:>7} {first!s:>13} "
                     f"{decode:>12}  {r['stop_reason']:6}  {r['text'][:40]!r}")
    lines.append("TTFT: the prefill step, from the moment the run had the model's turn; ITL: the "
                 "median decode step; batch: the runs in each step's forward (decode: median)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..forward import prepare_prompt
    from ..loader import load_model
    from ..records.tracefile import trace_to_bytes
    from ..runner import Run
    from ..settings import FLOAT_WEIGHTS, GenerationSettings
    from .batcher import BLOCK_SIZE, StepBatcher

    if any(not p.strip() for p in args.prompts):
        raise InputError("a prompt is empty")
    if len(args.prompts) > MAX_RUNS:
        raise InputError(f"at most {MAX_RUNS} prompts, got {len(args.prompts)}")
    files = trace_files(args)  # refused before the model loads
    if not sys.stderr.isatty():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    lm = load_model(args.model)
    settings = GenerationSettings(max_new_tokens=args.max_new_tokens,
                                  chat_template=not args.raw)
    longest = max(len(prepare_prompt(lm.tokenizer, p, settings.chat_template))
                  for p in args.prompts) + args.max_new_tokens
    seats = min(args.max_batch, len(args.prompts))
    batcher = StepBatcher(lm, lm.model, FLOAT_WEIGHTS.get(lm.spec.dtype, lm.spec.dtype),
                          lm.spec.weight_bytes, max_batch=args.max_batch, max_tokens=longest,
                          slots=seats * (-(-longest // BLOCK_SIZE)) * BLOCK_SIZE)
    traces: list[Any] = [None] * len(args.prompts)
    errors: list[BaseException] = []
    start = threading.Barrier(len(args.prompts))

    def one(i: int) -> None:
        try:
            start.wait()
            traces[i] = Run(lm, args.prompts[i], settings, native=batcher).run_all()
        except BaseException as error:  # noqa: BLE001 — reported once, below
            errors.append(error)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(args.prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0] if isinstance(errors[0], EngineError) else EngineError(
            f"a run failed: {type(errors[0]).__name__}: {errors[0]}")
    rows = summary(traces)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
    else:
        print(table(rows))
    for out, trace in zip(files or [], traces):
        out.write(trace_to_bytes(trace))
        print(f"trace        {out.path}", file=sys.stderr if args.json else sys.stdout)
    return 0
