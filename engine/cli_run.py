"""`python -m engine run`: its arguments and the run itself, weights variant and decoder included.

Kept apart from engine/__main__.py (the other commands) because choosing the weights and the
decoder is most of its work: float weights load the model in that dtype; an integer variant is
`apply_variant`'s copy of the float32 model with a native decoder over it (engine/models.py
`build_variant`, the same the app uses), and the run says on stderr which decoder ran and why.
`--speculate prompt-lookup` runs engine/serving/speculative_trace.py's SpeculativeRun instead
(greedy, KV cache on, verify forwards in transformers); its trace carries the speculation record.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from .errors import EngineError
from .outfile import OutFile, add_out_options, out_file
from .quant import VARIANT_NAMES
from .records.trace import Trace
from .settings import (
    DECODERS,
    FLOAT_DTYPES,
    MAX_NEW_TOKENS_LIMIT,
    WEIGHT_ALIASES,
    GenerationSettings,
)

SPECULATE_CHOICES = ("prompt-lookup",)  # engine/serving/speculative.py METHODS
DEFAULT_DRAFT_TOKENS, DEFAULT_NGRAM = 4, 3
NOT_RECORDED = ("speculation: attention and hidden states are not recorded on a speculative run "
                "(a verify forward scores several positions at once)")

# --weights: every variant, and the spelling of 4-bit. fp32 / fp16 / bf16 load the model
# in that dtype; the others are quantized copies of the float32 model.
WEIGHT_CHOICES = (*VARIANT_NAMES, *WEIGHT_ALIASES)


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="generate from a prompt and print the timings")
    run.add_argument("prompt")
    run.add_argument("--model", default=None, help="hub id, local folder or .gguf file "
                                                      "(default: SmolLM2-135M)")
    run.add_argument("--device", default=None, help="cpu, cuda or auto (default)")
    run.add_argument("--dtype", default=None, help="float32, float16 or bfloat16 (CUDA); "
                                                   "--weights fp16 / bf16 say the same")
    run.add_argument("--weights", default=None, choices=WEIGHT_CHOICES, metavar="VARIANT",
                     help=f"how the weights are stored: {', '.join(VARIANT_NAMES)}; int4 is an "
                          "alias of q4_0 (default fp32, or --dtype's). fp16 / bf16 run the model "
                          "in that dtype; the integer variants are quantized copies of the "
                          "float32 model, decoded by the native step on their stored codes")
    run.add_argument("--decoder", default="native", choices=DECODERS,
                     help="native: the hand-written C decode step wherever it can run (float32 "
                          "and int8 / q4_0 / q4_1 weights, KV cache on), else torch, with the "
                          "reason on stderr (default); torch: always transformers")
    run.add_argument("--max-new-tokens", type=int, default=64,
                     help=f"1..{MAX_NEW_TOKENS_LIMIT} (default 64)")
    run.add_argument("--max-prompt-tokens", type=int, default=2048)
    run.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    run.add_argument("--top-k", type=int, default=0, help="0 = off")
    run.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--raw", action="store_true", help="no chat template")
    run.add_argument("--no-kv-cache", action="store_true", help="recompute everything each step")
    run.add_argument("--no-attention", action="store_true", help="do not record attention")
    run.add_argument("--no-hidden", action="store_true", help="do not record hidden states")
    add_out_options(run, "the trace (.npz)")
    run.add_argument("--speculate", default=None, choices=SPECULATE_CHOICES,
                     help="speculative decoding: prompt-lookup drafts (the context's last n-gram "
                          "found earlier, the tokens after it) verified k + 1 positions a forward "
                          "in transformers; greedy, KV cache on, no attention / hidden recorded")
    run.add_argument("--draft-tokens", type=int, default=None, metavar="K",
                     help="drafts per verify step with --speculate (default 4)")
    run.add_argument("--ngram", type=int, default=None, metavar="N",
                     help="longest n-gram prompt lookup matches with --speculate (default 3)")


def chosen_weights(weights: str | None, dtype: str | None) -> tuple[str, str | None]:
    """(variant, dtype to load the model in) from --weights and --dtype, which must agree."""
    by_dtype = {v: k for k, v in FLOAT_DTYPES.items()}
    if weights is None:
        return by_dtype.get(dtype or "", "fp32"), dtype
    weights = WEIGHT_ALIASES.get(weights, weights)
    load = FLOAT_DTYPES.get(weights, "float32")
    if dtype is not None and dtype != load:
        raise EngineError(f"--weights {weights} runs on {load} weights, not --dtype {dtype}: "
                          "give --weights alone")
    return weights, load


def run_command(args: argparse.Namespace, print_summary) -> int:
    from .forward import prepare_prompt
    from .loader import load_model
    from .models import build_variant
    from .runner import Run

    settings = GenerationSettings(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed, chat_template=not args.raw,
        kv_cache=not args.no_kv_cache, record_attention=not args.no_attention,
        record_hidden=not args.no_hidden, max_prompt_tokens=args.max_prompt_tokens,
        decoder=args.decoder)
    if not args.prompt.strip():
        raise EngineError("the prompt is empty")
    weights, dtype = chosen_weights(args.weights, args.dtype)
    speculate = speculation_options(args)
    out = out_file(args.out, args.force)  # refused before the model loads
    interactive = sys.stderr.isatty()
    if not interactive:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    lm = load_model(args.model, device=args.device, dtype=dtype,
                    progress=(lambda msg: print(msg, file=sys.stderr)) if interactive else None)
    if speculate is not None:
        return _speculative_run(args, lm, settings, weights, speculate, out, print_summary)
    options: dict = {"weights": weights}
    stored_as = None
    if weights in FLOAT_DTYPES and weights != "fp32" or lm.spec.dtype != "float32":
        options["native_problem"] = (f"the native step reads float32 and integer weights; this "
                                     f"model runs in {lm.spec.dtype}")
    else:
        need = len(prepare_prompt(lm.tokenizer, args.prompt, settings.chat_template))
        native = settings.decoder == "native" and settings.kv_cache
        built = build_variant(lm, weights, need + settings.max_new_tokens, with_native=native)
        lm = built.lm
        options.update(native=built.native, native_problem=built.native_problem)
        stored_as = getattr(built.native, "stored_as", None)
    trace = Run(lm, args.prompt, settings, **options).run_all()
    return _report(trace, out, print_summary, stored_as)


def decoder_line(trace: Trace) -> str:
    used = trace.decoder
    if used is None:
        return "not recorded (a trace from before format 4)"
    return f"{used.label} ({used.weights} weights, {used.weight_bytes:,} bytes)"


def speculation_options(args: argparse.Namespace) -> tuple[int, int] | None:
    """(draft tokens, n-gram) for `--speculate`, None without it; a combination that means
    nothing is one line (exit 2) before the model loads."""
    if args.speculate is None:
        if args.draft_tokens is not None or args.ngram is not None:
            raise EngineError("--draft-tokens and --ngram need --speculate prompt-lookup")
        return None
    draft = DEFAULT_DRAFT_TOKENS if args.draft_tokens is None else args.draft_tokens
    ngram = DEFAULT_NGRAM if args.ngram is None else args.ngram
    if args.temperature != 0:
        raise EngineError("--speculate decodes greedily (drafts are accepted where they equal the "
                          "model's argmax): drop --temperature")
    if args.no_kv_cache:
        raise EngineError("--speculate verifies drafts against the KV cache: drop --no-kv-cache")
    from .serving.speculative import check_options

    check_options(draft, ngram)
    return draft, ngram


def _speculative_run(args: argparse.Namespace, lm, settings: GenerationSettings, weights: str,
                     options: tuple[int, int], out: OutFile | None, print_summary) -> int:
    """`run --speculate`: the weights as asked (an integer variant's copy runs in torch, whose
    forwards verify the drafts), then a SpeculativeRun; its trace carries the speculation."""
    from .models import build_variant
    from .serving.speculative_trace import SpeculativeRun

    if not (args.no_attention and args.no_hidden):
        print(NOT_RECORDED, file=sys.stderr)
    if weights not in FLOAT_DTYPES:
        lm = build_variant(lm, weights, with_native=False).lm
    draft, ngram = options
    trace = SpeculativeRun(lm, args.prompt, settings, draft, ngram, weights=weights).run_all()
    return _report(trace, out, print_summary)


def _report(trace: Trace, out: OutFile | None, print_summary: Callable[[Trace], None],
            stored_as: str | None = None) -> int:
    """What every run prints: which decoder ran (stderr) — and, when the native step ran on a
    GGUF file's blocks, which (`stored_as`: the trace names only the weights as loaded, fp32) —
    the summary, where the trace went."""
    from .records.tracefile import trace_to_bytes

    line = decoder_line(trace)
    if stored_as and trace.decoder is not None and trace.decoder.name == "native":
        line += f" on {stored_as}"
    print(f"decoder: {line}", file=sys.stderr)
    print_summary(trace)
    if out is not None:
        out.write(trace_to_bytes(trace))
        print(f"trace        {out.path}")
    return 0
