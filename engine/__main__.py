"""`python -m engine run|show|story|compare|lens|dtypes|quality|quantize|batch|together|loadtest|
examples|export|gguf-info|models|branch|ablate|patch|tokens|kv-shrink`: generate a trace from the shell,
inspect one (its story lines, a comparison with another, the logit lens), compare dtypes, measure
a weights variant's quality or the whole quantization study, serve a stream on the batched engine,
record several runs decoded together as the hosted demo batches its visitors, load-test
a serving engine (vLLM), record the shipped examples, export a weights variant as a GGUF file or
print a GGUF file's tensor table, list the GGUF files already on this machine, ask what the same
sentence costs in several languages, and ask "what if" of a run (branch it, switch heads off,
patch activations). The engine draws no charts: a trace's HTML report is `python -m charts.report`.

User mistakes (bad arguments, unknown model, damaged trace) exit with status 2 and one line on
stderr, never a traceback.
"""

from __future__ import annotations

import os

# Offline by default: hub ids load only from the local Hugging Face cache unless the user sets
# HF_HUB_OFFLINE=0 themselves. Set before anything imports huggingface_hub, which reads it once
# (the `engine` package itself imports nothing heavy).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from typing import Any, NoReturn, Sequence  # noqa: E402

from .cli_run import add_run_parser, run_command  # noqa: E402
from .errors import EngineError  # noqa: E402
from .gguf import cli as gguf_cli  # noqa: E402
from .gguf import models_cli  # noqa: E402
from .kv.shrink import cli as shrink_cli  # noqa: E402
from .lens import tokens_cli  # noqa: E402
from .quant import VARIANT_NAMES  # noqa: E402
from .quant import cli as quant_cli  # noqa: E402
from .records.trace import Trace  # noqa: E402
from .remote import cli as remote_cli  # noqa: E402
from .serving import cli as serving_cli  # noqa: E402
from .serving import together_cli  # noqa: E402
from .settings import FLOAT_WEIGHTS  # noqa: E402
from .timing.disturbance import assess  # noqa: E402
from .timing.metrics import percentile, summarize  # noqa: E402
from .whatif import cli as whatif_cli  # noqa: E402


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m engine", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_run_parser(sub)
    examples = sub.add_parser("examples", help="record the example traces the app ships "
                                                "(assets/examples/examples.json)")
    examples.add_argument("--model", default=None, help="hub id or local folder (default: "
                                                        "SmolLM2-135M, as shipped)")
    lens = sub.add_parser("lens", help="the logit lens of a trace step: what each layer would "
                                       "predict (needs the trace's model)")
    lens.add_argument("file")
    lens.add_argument("--step", type=int, default=0, help="step index (default 0, the prefill)")
    lens.add_argument("--model", default=None, help="the model that made the trace (default: "
                                                    "SmolLM2-135M)")
    story = sub.add_parser("story", help="the guided story's 'what to notice' line of every stage, "
                                         "computed from a trace (no model needed)")
    story.add_argument("file")
    compare = sub.add_parser("compare", help="two traces side by side as JSON: settings that "
                                             "differ, first differing token, TTFT / ITL / KV bytes")
    compare.add_argument("a")
    compare.add_argument("b")
    dtypes = sub.add_parser("dtypes", help="decode the same greedy tokens with float32, float16 "
                                           "and bfloat16 weights, in paired rounds")
    dtypes.add_argument("prompt")
    dtypes.add_argument("--model", default=None)
    dtypes.add_argument("--new-tokens", type=int, default=16)
    dtypes.add_argument("--rounds", type=int, default=3)
    quality = sub.add_parser("quality", help="a weights variant against float32 on a fixed text: "
                                             "bytes, perplexity, mean KL, top-1 agreement (JSON)")
    quality.add_argument("--weights", required=True, choices=VARIANT_NAMES,
                         help="what the decoder Linear weights are stored as")
    quality.add_argument("--text", default=None, help="a UTF-8 text file (default: the "
                                                      "Gettysburg Address, assets/texts/)")
    quality.add_argument("--model", default=None, help="hub id or local folder (default: "
                                                       "SmolLM2-135M)")
    quality.add_argument("--per-layer", action="store_true",
                         help="also where the error enters: cosine of the residual stream and KL "
                              "of the logit lens against float32 at every layer")
    quant_cli.add_parser(sub)
    whatif_cli.add_parsers(sub)
    gguf_cli.add_parsers(sub)
    models_cli.add_parser(sub)
    serving_cli.add_parser(sub)
    together_cli.add_parser(sub)
    remote_cli.add_parser(sub)
    tokens_cli.add_parser(sub)
    shrink_cli.add_parser(sub)
    show = sub.add_parser("show", help="summarize a trace file")
    show.add_argument("file")
    show.add_argument("--json", action="store_true", help="machine-readable JSON")
    return parser


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def _print_summary(trace: Trace) -> None:
    summary = summarize(trace)
    rate = summary.decode_tokens_per_s
    print(f"model        {trace.model.name} ({trace.device}, {trace.model.dtype})")
    print(f"tokens       {summary.prompt_tokens} prompt, {summary.output_tokens} generated "
          f"(stop: {trace.stop_reason})")
    print(f"TTFT         {_ms(summary.ttft_ms)}")
    print(f"ITL p50/p90  {_ms(summary.itl_p50_ms)} / {_ms(summary.itl_p90_ms)}")
    for line in _speculation_lines(trace):
        print(line)
    print(f"decode       {'n/a' if rate is None else f'{rate:.1f}'} tokens/s")
    print(f"KV cache     {trace.kv_bytes:,} bytes")
    warning = assess(trace).warning()
    if warning is not None:
        print(f"timing       {warning}")
    print(f"text         {trace.output_text}")


def _speculation_lines(trace: Trace) -> list[str]:
    """A speculative run's verify steps, and why its ITL percentiles are no per-step cost."""
    spec = trace.speculation
    if spec is None:
        return []
    rate = "n/a" if spec.acceptance_rate is None else f"{spec.acceptance_rate:.0%}"
    each = "n/a" if spec.tokens_per_verify_step is None else f"{spec.tokens_per_verify_step:.2f}"
    median = percentile(spec.step_ms, 50)
    return [f"speculation  {spec.method}, up to {spec.draft_tokens} drafts: {spec.accepted} of "
            f"{spec.proposed} accepted ({rate}), {spec.verify_steps} verify steps, {each} tokens "
            f"each, verify step p50 {_ms(median)}",
            "note         a verify step's tokens arrive together (its first carries the step's "
            "time, the others only their own bookkeeping), so ITL percentiles are arrival gaps, "
            "not a step's cost: compare runs by decode tokens/s"]


def speculation_json(trace: Trace) -> dict[str, Any] | None:
    """show --json's "speculation" block: the issue's five keys, then the detail."""
    spec = trace.speculation
    if spec is None:
        return None
    return {"method": spec.method, "draft_tokens": spec.draft_tokens, "accepted": spec.accepted,
            "proposed": spec.proposed, "verify_steps": spec.verify_steps, "ngram": spec.ngram,
            "acceptance_rate": spec.acceptance_rate,
            "tokens_per_verify_step": spec.tokens_per_verify_step,
            "verify_ms": list(spec.step_ms), "step_proposed": list(spec.step_proposed),
            "step_accepted": list(spec.step_accepted), "step_tokens": list(spec.step_tokens),
            "drafted": list(spec.drafted(len(trace.steps)))}


def show_json(trace: Trace) -> dict[str, Any]:
    """The `show --json` document (stable keys; see docs/cli.md)."""
    m = trace.model
    used = trace.decoder  # None in format 1–3 files: torch decoded them on the loaded dtype
    return {
        "model": {"name": m.name, "layers": m.layers, "heads": m.heads, "kv_heads": m.kv_heads,
                  "head_dim": m.head_dim, "dtype": m.dtype, "param_count": m.param_count,
                  "weights": used.weights if used else FLOAT_WEIGHTS.get(m.dtype, m.dtype),
                  "weight_bytes": used.weight_bytes if used else m.weight_bytes},
        "decoder": used.to_dict() if used else None,
        "speculation": speculation_json(trace),
        "device": trace.device,
        "settings": trace.settings.to_dict(),
        "prompt": trace.prompt,
        "prompt_token_ids": list(trace.prompt_token_ids),
        "output_token_ids": list(trace.output_token_ids),
        "output_text": trace.output_text,
        "stop_reason": trace.stop_reason,
        "ttft_ms": trace.ttft_ms,
        "itl_ms": list(trace.itl_ms),
        "summary": summarize(trace).to_dict(),
        "machine": trace.machine.to_dict() if trace.machine is not None else None,
        "delayed_steps": list(assess(trace).delayed_steps),
        "steps": [{"phase": s.phase, "token_id": s.token_id, "token_text": s.text,
                   "piece": s.piece, "latency_ms": s.latency_ms, "forward_ms": s.forward_ms,
                   "cpu_ms": s.cpu_ms, "others_share": s.others_share, "kv_bytes": s.kv_bytes,
                   "context_len": s.context_len, "chosen_prob": s.chosen_prob}
                  for s in trace.steps],
    }


def _run(args: argparse.Namespace) -> int:
    return run_command(args, _print_summary)


def _show(args: argparse.Namespace) -> int:
    from .files import load_trace

    trace = load_trace(args.file)
    if args.json:
        json.dump(show_json(trace), sys.stdout, ensure_ascii=False, indent=1)
        print()
    else:
        _print_summary(trace)
    return 0


def _examples(args: argparse.Namespace) -> int:
    from .loader import load_model
    from .records.examples import EXAMPLES_DIR, record_examples

    lm = load_model(args.model)
    for example, size in record_examples(lm):
        print(f"{example.name:14} {size / 2**20:5.2f} MB  {EXAMPLES_DIR / (example.name + '.npz')}")
    return 0


def _lens(args: argparse.Namespace) -> int:
    from .files import load_trace
    from .lens.logit_lens import logit_lens
    from .loader import load_model

    trace = load_trace(args.file)
    if not 0 <= args.step < len(trace.steps):
        raise EngineError(f"--step must be between 0 and {len(trace.steps) - 1}")
    step = trace.steps[args.step]
    if step.hidden is None:
        raise EngineError("this trace was recorded without hidden states (--no-hidden)")
    lm = load_model(args.model)
    if lm.spec.name != trace.model.name:
        raise EngineError(f"the trace was made by {trace.model.name}, not {lm.spec.name}")
    print(f"step {step.index}: chose {step.piece!r}; layer, top-5 (probability), rank of the "
          "chosen token")
    for row in logit_lens(lm, step.hidden, step.token_id):
        top = ", ".join(f"{p!r} {q:.2f}" for p, q in zip(row.top_pieces, row.top_probs))
        print(f"{row.layer:5}  {top}  rank {row.chosen_rank + 1}")
    return 0


def _story(args: argparse.Namespace) -> int:
    from .files import load_trace
    from .lens import cost_notice, notice, weights_notice

    trace = load_trace(args.file)
    stages = (("Text → tokens", notice.tokens_notice), ("Embeddings + RoPE", notice.embeddings_notice),
              ("Attention", notice.attention_notice), ("FFN and residual", notice.ffn_notice),
              ("Next token and sampling", notice.sampling_notice),
              ("Prefill vs decode", cost_notice.phase_notice), ("The KV cache", cost_notice.kv_notice),
              ("Weights in fewer bits", weights_notice.weights_notice))
    for k, (title, compute) in enumerate(stages, 1):
        print(f"{k}. {title}: {compute(trace).text}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from .files import load_trace
    from .lens.compare import metric_rows, setting_rows, token_diff

    a, b = load_trace(args.a), load_trace(args.b)
    diff = token_diff(a, b)
    json.dump({
        "settings_that_differ": {r.name: [r.a, r.b] for r in setting_rows(a, b) if r.differs},
        "first_different_prompt_token": diff.prompt, "first_different_answer_token": diff.answer,
        "metrics": [{"name": r.name, "unit": r.unit, "a": r.a, "b": r.b,
                     "b_minus_a": r.difference, "how": r.formula} for r in metric_rows(a, b)],
    }, sys.stdout, indent=1, ensure_ascii=False)
    print()
    return 0


def _dtypes(args: argparse.Namespace) -> int:
    from .forward import prepare_prompt
    from .loader import load_model
    from .timing.dtype_compare import compare_dtypes

    if not args.prompt.strip():
        raise EngineError("the prompt is empty")
    lm = load_model(args.model)
    result = compare_dtypes(lm, prepare_prompt(lm.tokenizer, args.prompt, True),
                            args.new_tokens, args.rounds)
    for run in result.runs:
        print(f"{run.dtype:9} {run.itl_ms:7.1f} ms per token  {run.ratio:.2f}× float32's time  "
              f"tokens {'= float32' if run.same_tokens else 'differ from float32'}")
    return 0


def _quality(args: argparse.Namespace) -> int:
    from .loader import load_model
    from .quant.quality import measure_quality
    from .quant.texts import read_text

    text = read_text(args.text)  # a bad file is refused before the model loads
    if not sys.stderr.isatty():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    lm = load_model(args.model)
    found = measure_quality(lm, args.weights, text).to_json()
    if args.per_layer:
        from .quant.drift import drift_to_dict, measure_drift
        from .quant.texts import text_ids

        source = "the Gettysburg Address" if args.text is None else "the text file"
        # the positions the quality numbers score: its last layer's KL is their KL
        found["per_layer"] = drift_to_dict(measure_drift(lm, [args.weights], text_ids(lm, text),
                                                         source, scored=slice(0, -1)))
    json.dump(found, sys.stdout, indent=1)
    print()
    return 0


COMMANDS = {"run": _run, "show": _show, "examples": _examples, "lens": _lens, "dtypes": _dtypes,
            "quality": _quality, "story": _story, "compare": _compare,
            "quantize": quant_cli.run, "batch": serving_cli.run, "together": together_cli.run,
            "loadtest": remote_cli.run, **whatif_cli.COMMANDS, "export": gguf_cli.run_export,
            "gguf-info": gguf_cli.run_info, "models": models_cli.run, "tokens": tokens_cli.run,
            "kv-shrink": shrink_cli.run}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.environ.get("INFERENCE_EXPLORER_DEBUG") == "1":
        return COMMANDS[args.command](args)
    try:
        return COMMANDS[args.command](args)
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
