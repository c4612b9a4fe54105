"""A run as one self-contained HTML file, for handouts: the model, the prompt and settings, the
answer, the numbers the app shows (with their definitions), the token chips, and the main figures
as interactive plotly — readable from file:// with no network (plotly.js inlined once, no web
fonts, no external URL).

Pure: a Trace (and the experiment results saved with it) in, an HTML string out; no Streamlit.
Every number comes from the engine's own functions (`summarize`, `assess`, `ModelSpec.kv_bytes`)
and is written as the app writes it (charts/formatting.py); every figure is the app's own chart
function. Every user string (prompt, token pieces, model name) is HTML-escaped here, and plotly
writes `<` as `\\u003c` in the figures' JSON, so a prompt holding `</script>` stays text.

Its command, outside the engine (which draws no charts): `python -m charts.report TRACE [-o OUT]`.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from engine import __version__ as ENGINE_VERSION
from engine.assets import asset
from engine.errors import EngineError
from engine.experiments import Experiments
from engine.files import read_trace_file
from engine.lens.attention_stats import full_attention, has_attention, head_summary
from engine.lens.weights_notice import run_weights
from engine.outfile import add_out_options, out_file
from engine.records.trace import Trace
from engine.records.tracefile import FORMAT_NAME, FORMAT_VERSION
from engine.timing.disturbance import RULE, assess
from engine.timing.metrics import summarize
from i18n import _, language

from .attention import downsample, heatmap, sequence_labels
from .formatting import count, duration, moment, rate, size, stop_reason
from .kvcache import live_memory_chart
from .live import step_chart
from .report_parts import (
    Figures,
    emphasis,
    esc,
    experiments_html,
    get_plotlyjs,
    key_value_table,
)
from .timing import timeline_chart
from .tokens import token_chips_html

HEATMAP_LIMIT = 96  # cells per side before blocks are averaged, as on the Attention page
# The report's own layout (assets/report.css) and print step (assets/report.js: charts redrawn at
# the A4 page's width); the token chips are styled by the app's own assets/style.css. All three
# are copied into the page when it is made (the report must stand alone).
APP_CSS, STYLE, PRINT_SCRIPT = asset("style.css"), asset("report.css"), asset("report.js")


@dataclass(frozen=True, slots=True)
class Number:
    """One number of the report: its key, exact value, the text shown and how it is made."""

    key: str
    name: str
    value: float | int | None
    shown: str
    how: str


def numbers(trace: Trace) -> list[Number]:
    """The run's numbers as the pages show them: summarize()'s values, the prefill and decode
    time, and the KV cache at the end (measured from the tensors) with its formula."""
    s = summarize(trace)
    m = trace.model
    prefill_ms = trace.prefill.latency_ms if trace.prefill is not None else None
    decode_ms = sum(trace.itl_ms) if trace.itl_ms else None
    context = trace.steps[-1].context_len if trace.steps else 0
    formula = _("2 · {layers} layers · {kv_heads} KV heads · {head_dim} head_dim · "
                "{dtype_bytes} B · {context} tokens = {bytes} B").format(
        layers=m.layers, kv_heads=m.kv_heads, head_dim=m.head_dim, dtype_bytes=m.dtype_bytes,
        context=context, bytes=f"{m.kv_bytes(context):,}")
    kv_how = (_("Measured from the cache tensors (keys + values, every layer): {bytes} B. "
                "Formula: {formula}.").format(bytes=f"{trace.kv_bytes:,}", formula=formula)
              if trace.settings.kv_cache else
              _("Cache off: nothing is kept (with it: {formula}).").format(formula=formula))
    return [
        Number("ttft_ms", "TTFT", s.ttft_ms, duration(s.ttft_ms),
               _("Time to first token: tokenization + prefill of the whole prompt.")),
        Number("itl_p50_ms", _("ITL median (p50)"), s.itl_p50_ms, duration(s.itl_p50_ms),
               _("Inter-token latency: the gap between two consecutive output tokens, one per "
                 "decode step; the median of them.")),
        Number("itl_mean_ms", _("ITL mean"), s.itl_mean_ms, duration(s.itl_mean_ms),
               _("The mean of the decode steps' ITL.")),
        Number("itl_p90_ms", "ITL p90", s.itl_p90_ms, duration(s.itl_p90_ms),
               _("90th percentile (linear interpolation, as vLLM reports).")),
        Number("itl_p99_ms", "ITL p99", s.itl_p99_ms, duration(s.itl_p99_ms),
               _("99th percentile.")),
        Number("tpot_ms", "TPOT", s.tpot_ms, duration(s.tpot_ms),
               _("(end-to-end − TTFT) / (output tokens − 1).")),
        Number("decode_tokens_per_s", _("Decode rate"), s.decode_tokens_per_s,
               rate(s.decode_tokens_per_s), _("Decode steps ÷ their total time.")),
        Number("prefill_tokens_per_s", _("Prefill rate"), s.prefill_tokens_per_s,
               rate(s.prefill_tokens_per_s), _("Prompt tokens ÷ the prefill step's time.")),
        Number("tokenize_ms", _("Tokenize"), trace.tokenize_ms, duration(trace.tokenize_ms),
               _("Turning the prompt (and chat template) into token ids.")),
        Number("prefill_ms", _("Prefill time"), prefill_ms, duration(prefill_ms),
               _("The prefill step: the whole prompt in one forward pass, and the first token.")),
        Number("decode_ms", _("Decode time"), decode_ms, duration(decode_ms),
               _("All decode steps together: one token per step, reusing the KV cache.")),
        Number("e2e_ms", _("End to end"), s.e2e_ms, duration(s.e2e_ms),
               _("Request to last token: tokenize + prefill + every decode step.")),
        Number("prompt_tokens", _("Prompt tokens"), s.prompt_tokens, count(s.prompt_tokens),
               _("After the chat template, special tokens included.")),
        Number("output_tokens", _("Generated tokens"), s.output_tokens, count(s.output_tokens),
               _("Stopped because: {reason}.").format(reason=stop_reason(trace.stop_reason))),
        Number("kv_bytes", _("KV cache at the end"), trace.kv_bytes, size(trace.kv_bytes), kv_how),
    ]


def _number_rows(found: list[Number]) -> str:
    rows = []
    for n in found:
        value = "" if n.value is None else repr(n.value)
        rows.append(f'<tr><th>{esc(n.name)}</th><td class="num" data-key="{esc(n.key)}" '
                    f'data-value="{esc(value)}">{esc(n.shown)}</td>'
                    f'<td class="how">{esc(n.how)}</td></tr>')
    return "<table>" + "".join(rows) + "</table>"


def _decoder_row(trace: Trace) -> list[tuple[str, object]]:
    """Which weights and decoder ran the decode steps (traces since format 4); a GGUF file's own
    blocks are recorded as the weights as loaded, fp32, and named GGUF here."""
    d = trace.decoder
    if d is None:
        return []
    return [(_("Decode steps"), _("{decoder}; {weights} weights, {size} read ({bytes} B)").format(
        decoder=d.label, weights=run_weights(trace), size=size(d.weight_bytes), bytes=f"{d.weight_bytes:,}"))]


def _model(trace: Trace) -> str:
    m = trace.model
    return key_value_table([
        (_("Model"), m.name), (_("Architecture"), m.model_type),
        (_("Parameters"), f"{count(m.param_count)} ({m.param_count:,})"),
        (_("Weights"), f"{m.dtype}, {size(m.weight_bytes)} ({m.weight_bytes:,} B)"
         if m.stored_bits is None else
         _("the GGUF file's own blocks, {size} ({bytes} B): {bits:.3g} bits per weight").format(
             size=size(m.weight_bytes), bytes=f"{m.weight_bytes:,}", bits=m.stored_bits)),
        *_decoder_row(trace),
        (_("Device"), trace.device),
        (_("Layers · heads · KV heads · head_dim"), f"{m.layers} · {m.heads} · {m.kv_heads} · "
                                                   f"{m.head_dim}"),
        (_("Hidden size · vocabulary"), f"{m.hidden_size:,} · {m.vocab_size:,}")])


def _settings(trace: Trace) -> str:
    g = trace.settings
    on, off = _("on"), _("off")
    layers = (_("all {n} layers").format(n=trace.model.layers)
              if len(trace.attention_layers) == trace.model.layers
              else _("layers {list}").format(list=", ".join(map(str, trace.attention_layers))))
    temperature = (_("{temperature} (greedy)") if g.greedy else "{temperature}").format(
        temperature=f"{g.temperature:g}")
    return key_value_table([
        (_("Max new tokens"), g.max_new_tokens),
        (_("Temperature"), temperature),
        ("Top-k", g.top_k or off), ("Top-p", off if g.top_p >= 1 else f"{g.top_p:g}"),
        (_("Seed"), _("none") if g.seed is None else g.seed),
        (_("Chat template"), on if g.chat_template else off),
        ("KV cache", on if g.kv_cache else _("off (recompute everything each step)")),
        (_("Attention recorded"), layers if trace.attention_layers else _("no")),
        (_("Stop reason"), stop_reason(trace.stop_reason))])


def _machine(trace: Trace) -> str:
    """The machine around the run and what the disturbance rule says about it."""
    found = assess(trace)
    machine = trace.machine
    rows = []
    if machine is not None:
        load = (_("not recorded") if machine.load_before is None or machine.load_after is None
                else _("{before} before, {after} after").format(
                    before=f"{machine.load_before:.2f}", after=f"{machine.load_after:.2f}"))
        others = (_("not recorded") if machine.others_share is None
                  else _("{share} of all CPUs' time").format(share=f"{machine.others_share:.1%}"))
        rows = [(_("Threads · cores"), f"{machine.threads} · {machine.cores}"),
                (_("Load average (1 min)"), load), (_("Other programs during the run"), others)]
    table = (key_value_table(rows) if rows else
             '<p class="note">{}</p>'.format(esc(_("This trace does not record the machine."))))
    warning = found.warning()
    if warning is not None:
        delayed = ", ".join(map(str, found.delayed_steps))
        delayed = _("Delayed steps: {steps}.").format(steps=delayed)
        verdict = f'<div class="warn" id="disturbance">{esc(warning)} {esc(delayed)}</div>'
    elif found.measured:
        verdict = '<p id="disturbance">{}</p>'.format(esc(_(
            "No step was delayed by other work on this machine ({n} steps checked).").format(
                n=found.steps)))
    else:
        verdict = '<p id="disturbance">{}</p>'.format(esc(_(
            "This trace does not record CPU time per step (an older file), so the rule below "
            "cannot say whether other work delayed it.")))
    return f'{table}{verdict}<p class="note">{emphasis(_(RULE))}</p>'


def attention_focus(trace: Trace) -> tuple[int, int, float] | None:
    """(layer, head, weight on the previous token) of the recorded head that attends most to
    the previous token over the prompt: a clear diagonal that reads well on paper."""
    if not has_attention(trace):
        return None
    previous = head_summary(trace)["previous"]  # (recorded layers, heads)
    slot, head = divmod(int(previous.argmax()), previous.shape[1])
    return trace.attention_layers[slot], head, float(previous[slot, head])


def _attention(trace: Trace, figure: Figures) -> str:
    focus = attention_focus(trace)
    if focus is None:
        return '<p class="note">{}</p>'.format(esc(_("This run was recorded without attention.")))
    layer, head, previous = focus
    t = len(trace.prompt_token_ids)
    weights = full_attention(trace, layer)[head, :t, :t]  # (T, T): the prompt's rows (prefill)
    matrix, names, block = downsample(weights, sequence_labels(trace)[:t], HEATMAP_LIMIT)
    if block > 1:
        caption = _("Layer {layer}, head {head}: of the recorded heads, the one that puts the most "
                    "weight on the previous token ({share} on average over the prompt's "
                    "rows). Each row is one query token's attention over the keys up to itself "
                    "(it sums to 1); grey cells are future tokens, masked out by causal attention. "
                    "{t} tokens shown as {block}×{block}-token blocks (mean weight per block). "
                    "Every layer and head is on the app's Attention page.")
    else:
        caption = _("Layer {layer}, head {head}: of the recorded heads, the one that puts the most "
                    "weight on the previous token ({share} on average over the prompt's "
                    "rows). Each row is one query token's attention over the keys up to itself "
                    "(it sums to 1); grey cells are future tokens, masked out by causal attention. "
                    "Every layer and head is on the app's Attention page.")
    title = _("layer {layer}, head {head}").format(layer=layer, head=head)
    return figure(heatmap(matrix, names, title), caption.format(
        layer=layer, head=head, share=f"{previous:.0%}", t=t, block=block))


def report_html(trace: Trace, experiments: Experiments | None = None,
                made_at: str | None = None) -> str:
    """The whole report as one HTML document (UTF-8), plotly.js inlined once in its head."""
    made_at = made_at or datetime.now(timezone.utc).isoformat(timespec="seconds")
    figure = Figures()
    m = trace.model
    no_answer = esc(_("No answer: the run ended before its first token."))
    answer = (f'<pre class="text" id="answer">{esc(trace.output_text)}</pre>' if trace.output_text
              else f'<p class="note" id="answer">{no_answer}</p>')
    charts = ""
    if trace.steps:
        charts = (
            figure(step_chart(trace), _("Every step's latency (prefill red, decode blue; hatched: "
                   "delayed by other work on the machine) and the KV cache after it (green)."))
            + figure(timeline_chart(trace), _("The run on a time axis: tokenize, the prefill (it "
                     "sets the TTFT), then one decode step per token (each one ITL)."))
            + figure(live_memory_chart(trace), _("KV cache bytes after each step, measured from "
                     "the tensors, against the formula 2 · layers · KV heads · head_dim · bytes · "
                     "tokens.")))
    extra = experiments_html(experiments, figure) if experiments is not None and not experiments.empty \
        else ""
    title = _("Inference Explorer report — {model}").format(model=m.name)
    # The page's words, translated here (outside the f-string below, where no extractor sees them);
    # a message holding markup gets its values escaped, the others are escaped whole.
    h = {key: esc(text) for key, text in {
        "report": _("Inference Explorer report"), "model": _("Model"), "settings": _("Settings"),
        "prompt": _("Prompt"), "answer": _("Answer"), "numbers": _("Numbers"),
        "machine": _("Machine load"), "tokens": _("Tokens"), "figures": _("Figures"),
        "attention": _("Attention"), "experiments": _("Experiments")}.items()}
    meta = _("Run recorded {created} by engine {engine} ·\nreport made {made} by engine {version} "
             "from trace format\n<span class=\"nowrap\">{format} version {format_version}</span>"
             ).format(created=esc(moment(trace.created_at)), engine=esc(trace.engine_version),
                      made=esc(moment(made_at)), version=esc(ENGINE_VERSION), format=esc(FORMAT_NAME),
                      format_version=FORMAT_VERSION)
    model_line = _("{model} · {params} parameters ·\n{dtype} · {device}").format(
        model=esc(m.name), params=esc(count(m.param_count)), dtype=esc(m.dtype),
        device=esc(trace.device))
    tokens_note = _('The prompt as the model saw it (<span class="ie-chip ie-prompt">prompt</span>\n'
                    '<span class="ie-chip ie-special">special</span>), then every generated token\n'
                    '(<span class="ie-chip ie-gen">generated</span>). Hover a chip: id, step, '
                    'latency, probability.\nWhitespace is made visible: · space, ↵ newline.')
    figures_note = _("Interactive: hover for values, drag to zoom, double-click to reset; the "
                     "camera\nicon saves a PNG.")
    made_by = _("Made by Inference Explorer: every number above was measured on this run or\n"
                "computed by the formula shown next to it.")
    experiments_part = f"<h2>{h['experiments']}</h2>{extra}" if extra else ""
    return f"""<!DOCTYPE html>
<html lang="{language()}"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="Inference Explorer {esc(ENGINE_VERSION)}">
<title>{esc(title)}</title>
<style>{STYLE.read_text()}{APP_CSS.read_text()}</style>
<script type="text/javascript">window.PlotlyConfig = {{MathJaxConfig: 'local'}};</script>
<script type="text/javascript">{get_plotlyjs()}</script>
<script type="text/javascript">{PRINT_SCRIPT.read_text()}</script>
</head><body><main>
<h1>{h["report"]}</h1>
<p class="meta">{meta}</p>
<p class="meta" id="model-line">{model_line}</p>
<div class="grid"><section><h2>{h["model"]}</h2>{_model(trace)}</section>
<section><h2>{h["settings"]}</h2>{_settings(trace)}</section></div>
<h2>{h["prompt"]}</h2><pre class="text" id="prompt">{esc(trace.prompt)}</pre>
<h2>{h["answer"]}</h2>{answer}
<h2>{h["numbers"]}</h2>{_number_rows(numbers(trace))}
<h2>{h["machine"]}</h2>{_machine(trace)}
<h2>{h["tokens"]}</h2>
<p class="note">{tokens_note}</p>
{token_chips_html(trace)}
<h2>{h["figures"]}</h2>
<p class="note">{figures_note}</p>
{charts}
<h2>{h["attention"]}</h2>{_attention(trace, figure) if trace.steps else ""}
{experiments_part}
<p class="note">{made_by}</p>
</main></body></html>
"""


def main(argv: list[str] | None = None) -> int:
    """`python -m charts.report TRACE [-o OUT]`: write a trace file's run as one self-contained
    HTML page. A user mistake (no such file, damaged trace, unwritable folder, an --out that is
    the trace itself or exists without --force: engine/outfile.py) is one line on stderr and exit
    status 2."""
    parser = argparse.ArgumentParser(prog="python -m charts.report", description="write a trace "
                                     "file's run as one self-contained HTML page (opens offline)")
    parser.add_argument("file")
    add_out_options(parser, "the HTML page (default: the trace's name with .html)")
    args = parser.parse_args(argv)
    try:
        opened = read_trace_file(args.file)
        out = out_file(args.out or Path(args.file).with_suffix(".html"), args.force, [args.file])
        data = report_html(opened.trace, opened.experiments).encode("utf-8")
        out.write(data)
    except EngineError as err:
        if os.environ.get("INFERENCE_EXPLORER_DEBUG") == "1":
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"report       {out.path} ({len(data):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
