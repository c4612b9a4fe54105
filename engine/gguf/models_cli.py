"""`python -m engine models [--folder F ...] [--json]`: the GGUF files on this machine
(engine/gguf/discover.py), as the sidebar's "Models on this machine" lists them. Kept apart from
engine/__main__.py, which registers it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..errors import InputError
from .discover import MODELS_ENV, describe, find_models, search_places


def add_parser(sub: Any) -> None:
    models = sub.add_parser("models", help="the GGUF files already on this machine (Ollama, LM "
                                           "Studio, the Hugging Face cache, your folders): "
                                           "architecture, parameters, types, size, and whether "
                                           "each fits in the memory available")
    models.add_argument("--folder", action="append", default=[], metavar="F",
                        help=f"also search this folder (repeat for several; ${MODELS_ENV} "
                             "adds more, separated by the path separator)")
    models.add_argument("--json", action="store_true", help="machine-readable JSON")


def run(args: argparse.Namespace) -> int:
    for folder in args.folder:
        try:
            usable = folder.isprintable() and os.path.exists(folder)
        except ValueError:  # a NUL byte
            usable = False
        if not usable:
            raise InputError(f"--folder {folder[:200]!r} does not exist")
    found = find_models(args.folder)
    if args.json:
        json.dump([m.to_json() for m in found], sys.stdout, indent=1, ensure_ascii=False)
        print()
        return 0
    if not found:
        places = ", ".join(str(p) for _source, p in search_places(args.folder))
        print(f"no GGUF files found in {places}")
    for model in found:
        print(describe(model))
        print(f"    {model.path}")
    return 0
