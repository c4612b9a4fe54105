"""`python -m engine branch|ablate|patch`: the What if page's three questions from the shell.

Registered by engine/__main__.py; importing this module loads no torch. Each prints one line per
finding, or with `--json` one JSON document (token ids, probabilities, logit differences).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import InputError
from ..settings import MAX_NEW_TOKENS_LIMIT


def _heads(text: str) -> tuple[int, ...]:
    try:
        heads = tuple(int(h) for h in text.split(",") if h.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"heads must be comma-separated numbers: {text[:40]!r}") from None
    return heads


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--raw", action="store_true", help="no chat template")
    parser.add_argument("--model", default=None, help="hub id or local folder (default: "
                                                      "SmolLM2-135M)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")


def add_parsers(sub: Any) -> None:
    branch = sub.add_parser("branch", help="generate, then branch at token K with another token: "
                                           "the prefix's KV cache is reused")
    branch.add_argument("prompt")
    branch.add_argument("--at", type=int, required=True, help="index K of the generated token "
                                                              "to replace (0 = the first)")
    branch.add_argument("--token", type=int, required=True, help="the token id put there")
    branch.add_argument("--max-new-tokens", type=int, default=32,
                        help=f"tokens of each generation in all, 1..{MAX_NEW_TOKENS_LIMIT} "
                             "(default 32)")
    branch.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    branch.add_argument("--top-k", type=int, default=0, help="0 = off")
    branch.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    branch.add_argument("--seed", type=int, default=0)
    _common(branch)
    ablate = sub.add_parser("ablate", help="switch heads (or a layer's MLP) off: the next "
                                           "token's distribution and the text, before and after")
    ablate.add_argument("prompt")
    ablate.add_argument("--layer", type=int, required=True)
    ablate.add_argument("--heads", type=_heads, default=(), help="comma-separated head indexes")
    ablate.add_argument("--mlp", action="store_true", help="also zero the layer's MLP output")
    ablate.add_argument("--mean", action="store_true",
                        help="heads set to their mean over the prompt instead of zero")
    ablate.add_argument("--max-new-tokens", type=int, default=16)
    _common(ablate)
    patch = sub.add_parser("patch", help="activation patching: the clean prompt's residual "
                                         "stream put into the corrupted one, per layer and "
                                         "position")
    patch.add_argument("clean")
    patch.add_argument("corrupt")
    _common(patch)


def _load(args: argparse.Namespace) -> Any:
    from ..loader import load_model

    if not sys.stderr.isatty():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return load_model(args.model)


def _ids(lm: Any, prompt: str, raw: bool) -> list[int]:
    from ..forward import prepare_prompt

    if not prompt.strip():
        raise InputError("the prompt is empty")
    return prepare_prompt(lm.tokenizer, prompt, not raw)


def _new_tokens(n: int) -> int:
    if not 1 <= n <= MAX_NEW_TOKENS_LIMIT:
        raise InputError(f"--max-new-tokens must be 1..{MAX_NEW_TOKENS_LIMIT}")
    return n


def _settings(args: argparse.Namespace, n: int) -> Any:
    from .branch import greedy_settings

    return greedy_settings(n, not args.raw)


def run_branch(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..runner import Run
    from .branch import branch, check_branch_point, run_snapshot

    n = _new_tokens(args.max_new_tokens)
    if args.at >= n:
        raise InputError(f"--at {args.at} must be below --max-new-tokens {n}")
    lm = _load(args)
    settings = replace(_settings(args, n), temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, seed=args.seed)
    run = Run(lm, args.prompt, settings).run_all()
    check_branch_point(run, args.at, args.token)
    snapshot, _ = run_snapshot(lm, run)
    found = branch(lm, run, args.at, args.token, snapshot).trace
    b = found.branch
    assert b is not None
    if args.json:
        print(json.dumps({"original": list(run.output_token_ids),
                          "branch": list(found.output_token_ids), **b.to_dict()}))
        return 0
    decode = lm.tokenizer.decode
    print(f"original  {decode(run.output_token_ids)!r}")
    print(f"branch    {decode(found.output_token_ids)!r}  (token {args.at} → "
          f"{decode([args.token])!r})")
    rerun = "no full re-run" if b.rerun_ms is None else f"{b.rerun_ms:.0f} ms for a full re-run"
    print(f"reused {b.reused_tokens} cached positions, computed {b.computed_tokens}: "
          f"{b.branch_ms:.0f} ms vs {rerun}")
    return 0


def run_ablate(args: argparse.Namespace) -> int:
    from .ablate import Ablation, ablate, check_ablation

    a = Ablation(args.layer, args.heads, args.mlp, args.mean)
    if not a.heads and not a.mlp:
        raise InputError("nothing to switch off: give --heads and/or --mlp")
    n = _new_tokens(args.max_new_tokens)
    lm = _load(args)
    check_ablation(lm, a)
    if not args.prompt.strip():
        raise InputError("the prompt is empty")
    found = ablate(lm, args.prompt, a, _settings(args, n), n)
    doc = found.to_json(lm.tokenizer.decode)
    if args.json:
        print(json.dumps(doc))
        return 0
    top = lm.tokenizer.decode
    print(f"{a.describe()}: KL {found.kl:.4g} nats, top-1 "
          f"{'changed' if found.top1_changed else 'unchanged'}")
    for side in ("baseline", "ablated"):
        first = doc[side]["top"][0]
        print(f"{side:9} {top([first['id']])!r} {first['prob']:.1%}  text {doc[side]['text']!r}")
    return 0


def run_patch(args: argparse.Namespace) -> int:
    from .patch import check_pair, patch_grid

    lm = _load(args)
    clean, corrupt = _ids(lm, args.clean, args.raw), _ids(lm, args.corrupt, args.raw)
    check_pair(lm, clean, corrupt)
    found = patch_grid(lm, clean, corrupt)
    if args.json:
        print(json.dumps(found.to_json()))
        return 0
    decode = lm.tokenizer.decode
    best = found.normalized
    layer, pos = divmod(int(abs(best - 1).argmin()), best.shape[1])
    print(f"clean answer {decode([found.clean_token])!r}, corrupted {decode([found.corrupt_token])!r}"
          f" (logit difference {found.clean_diff:.2f} vs {found.corrupt_diff:.2f})")
    print(f"closest to clean: layer {layer}, position {pos} "
          f"({lm.tokenizer.convert_ids_to_tokens(corrupt[pos])!r}), {best[layer, pos]:.0%} "
          f"of the way; {found.seconds:.1f} s for {best.size} patched runs")
    return 0


COMMANDS = {"branch": run_branch, "ablate": run_ablate, "patch": run_patch}
