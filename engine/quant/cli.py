"""`python -m engine quantize [--weights a,b,...] [--out FILE]`: the quantization study of the
Quantization page from the command line — a table on stdout, the record as JSON in FILE.
Kept apart from engine/__main__.py (which registers it) so that file stays small; importing this
module loads no torch.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..outfile import add_out_options, out_file
from . import VARIANT_NAMES


def _variants(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in VARIANT_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown weights variant {unknown[0] if unknown else ''!r}:"
                                         f" use a comma-separated list of {', '.join(VARIANT_NAMES)}")
    return names


def add_parser(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser("quantize", help="every weights variant measured side by side: bytes, "
                                             "perplexity, KL, top-1, TTFT, ITL, MBU (the "
                                             "Quantization page's study)")
    parser.add_argument("--weights", type=_variants, default=None,
                        help="comma-separated variants (default: fp32, fp16, int8, q4_0, q4_1, "
                             f"q3 and the AWQ ones); any of {', '.join(VARIANT_NAMES)}")
    add_out_options(parser, "the study record (JSON)")
    parser.add_argument("--model", default=None, help="hub id or local folder (default: "
                                                      "SmolLM2-135M)")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="greedy tokens per sample prompt (default 24)")
    return parser


def table(study: Any) -> str:
    """The study as aligned text, one variant a line."""
    head = (f"{'variant':9} {'MB':>7} {'formula MB':>10} {'bits/w':>6} {'ppl':>8} {'KL':>8} "
            f"{'top-1':>6} {'TTFT ms':>8} {'ITL ms':>7} {'MB/step':>8} {'MBU':>5}  decoder")
    lines = [head]
    for v in study.variants:
        r, s = v.report, v.speed
        mbu = s.mbu(study.bandwidth_gb_s)
        lines.append(f"{v.name:9} {r.nbytes / 1e6:7.1f} {r.formula_bytes / 1e6:10.1f} "
                     f"{r.quantized_bits_per_weight:6.2f} {v.perplexity:8.3f} {v.kl_mean:8.4f} "
                     f"{v.top1_agreement:6.1%} {s.ttft_ms:8.1f} {s.itl_ms:7.2f} "
                     f"{s.bytes_per_step / 1e6:8.1f} {'–' if mbu is None else f'{mbu:.0%}':>5}  "
                     f"{s.decoder}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..kernels.microbench import ceilings
    from ..loader import load_model
    from .study import default_plan, run_study
    from .study_record import study_to_json

    out = out_file(args.out, args.force)
    if not sys.stderr.isatty():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    lm = load_model(args.model)
    plan = default_plan(False, lm.spec.layers)
    if args.weights:
        plan = replace(plan, variants=args.weights)
    if args.new_tokens is not None:
        plan = replace(plan, new_tokens=args.new_tokens)
    bandwidth = ceilings(lm.device).bandwidth_gb_s
    study = run_study(lm, plan, bandwidth,
                      say=lambda text, done: print(f"[{done:4.0%}] {text}", file=sys.stderr))
    print(table(study))
    if out is not None:
        out.write(study_to_json(study).encode("utf-8"))
        print(f"study        {out.path}")
    return 0
