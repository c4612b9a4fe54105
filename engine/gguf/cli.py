"""`python -m engine export --format gguf --weights VARIANT --out FILE [--model M]` and
`python -m engine gguf-info FILE [--json]`. Kept apart from engine/__main__.py, which registers
them; importing this module loads no torch (the commands import what they need when they run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..outfile import out_file

# what `export --weights` takes, named without importing torch; engine/gguf/export.py's
# `exportable()` is the same list (tests/test_gguf_export.py checks it)
EXPORT_VARIANTS = ("fp32", "fp16", "bf16", "q8_0", "q4_0", "q4_1")


def _variants() -> tuple[str, ...]:
    from ..quant import VARIANT_NAMES

    return EXPORT_VARIANTS + tuple(v for v in ("q4_k", "q6_k", "q4_k_m") if v in VARIANT_NAMES)


def add_parsers(sub: Any) -> None:
    export = sub.add_parser("export", help="write the model with its weights in a variant as a "
                                           "GGUF file (llama.cpp's names, types and tokenizer)")
    export.add_argument("--format", choices=("gguf",), default="gguf",
                        help="the file format (gguf, the only one)")
    export.add_argument("--weights", required=True, choices=_variants(),
                        help="the GGML types of the decoder weights (integer variants store the "
                             "embedding as Q8_0; norms stay F32)")
    export.add_argument("-o", "--out", required=True, metavar="FILE",
                        help="the GGUF file to write (never over an existing file without "
                             "--force, never over the --model file)")
    export.add_argument("--force", action="store_true", help="replace the --out file if it exists")
    export.add_argument("--model", default=None, help="hub id, local folder or .gguf file "
                                                      "(default: SmolLM2-135M)")
    info = sub.add_parser("gguf-info", help="a GGUF file's tensor table: name, GGML type, shape, "
                                            "bytes and bits per weight (checks the file, loads "
                                            "no model)")
    info.add_argument("file")
    info.add_argument("--json", action="store_true", help="machine-readable JSON")


def run_export(args: argparse.Namespace) -> int:
    from ..loader import is_gguf_path, load_model
    from .export import export_gguf

    inputs = [args.model] if args.model and is_gguf_path(args.model) else []
    target = out_file(args.out, args.force, inputs)  # refused before the model loads
    if not sys.stderr.isatty():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    lm = load_model(args.model, device="cpu", dtype="float32", on_blocks=False)  # to quantize
    done = export_gguf(lm, args.weights, target)
    t = done.table
    types = ", ".join(f"{k} ×{v}" for k, v in t.type_counts().items())
    print(f"wrote {t.path}: {args.weights}, {len(t.tensors)} tensors ({types}), "
          f"{t.file_bytes:,} bytes, {t.bits_per_weight:.2f} bits/weight")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from .header import read_header

    table = read_header(args.file).table
    try:
        if args.json:
            json.dump(table.to_json(), sys.stdout, indent=1, ensure_ascii=False)
            print()
        else:
            print("\n".join(table.lines()))
        sys.stdout.flush()
    except BrokenPipeError:  # `gguf-info FILE | head`: the reader took what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python's docs' way)
    return 0
