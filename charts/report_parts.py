"""The HTML report's parts (charts/report.py): escaping, tables, figures drawn for paper with
plotly.js inlined once, and the experiment results saved with a trace, each with the app's own
chart. Pure: no Streamlit."""

from __future__ import annotations

import functools
import html
import re

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs as _read_plotlyjs

from engine.experiments import Experiments
from engine.kv.shrink.budget import METHODS
from i18n import N_, _

from .formatting import duration, size
from .kv_shrink import shrink_chart
from .kvcache import on_off_chart, variant_chart
from .layout import legend_above
from .timing import dtype_chart, sweep_chart

FIGURE_CONFIG = {"displaylogo": False, "responsive": True}
PAPER_TEMPLATE = "plotly_white"  # plotly's, white for paper, with automargin: not the process default
# key → (title, x axis, y axis, plot tokens/s): as the Prefill vs decode page labels its sweeps
# (the titles marked for translation, translated where they are drawn)
SWEEP_TITLES = {
    "prompt_length": (N_("Prompt length → TTFT"), N_("prompt tokens"), N_("prefill time (ms)"), False),
    "context": (N_("Context → ITL"), N_("tokens already in the KV cache"), N_("decode step (ms)"),
                False),
    "batch": (N_("Batch → throughput"), N_("sequences decoded together (batch)"),
              N_("decode tokens/s (all sequences)"), True),
}

@functools.cache
def get_plotlyjs() -> str:
    """plotly.js (~4.7 MB), read from the package once per process, not once per report."""
    return _read_plotlyjs()


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def emphasis(markdown: str) -> str:
    """The `**bold**` and `*italic*` of a rule written for the pages, as HTML (escaped first)."""
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", esc(markdown))
    return re.sub(r"\*(.+?)\*", r"<em>\1</em>", text)


def key_value_table(rows: list[tuple[str, object]]) -> str:
    return "<table>" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>"
                               for k, v in rows) + "</table>"


def on_paper(fig: go.Figure) -> go.Figure:
    """Margins from plotly's automargin whatever process makes the report: the charts' 10 px
    margins are for a theme to grow, and in the app's process Streamlit's plotly template (no
    automargin) is the default, which cuts the labels of a report made there (Generate's
    download). A legend above a plot grows upward (when it wraps), as on screen (`legend_above`)."""
    fig = legend_above(fig)
    fig.update_layout(template=PAPER_TEMPLATE)
    return fig.update_xaxes(automargin=True).update_yaxes(automargin=True)


class Figures:
    """Figures as HTML fragments with numbered div ids; plotly.js is in the page's head, once."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, fig: go.Figure, caption: str) -> str:
        self.count += 1
        fig = on_paper(fig)
        body = fig.to_html(full_html=False, include_plotlyjs=False, config=FIGURE_CONFIG,
                           div_id=f"figure-{self.count}")
        return f"<figure>{body}<figcaption>{esc(caption)}</figcaption></figure>"


def experiments_html(found: Experiments, figure: Figures) -> str:
    """The experiment results saved with the trace, each with the app's own chart."""
    parts = []
    for key, points in found.sweeps.items():
        title, x_title, y_title, as_rate = SWEEP_TITLES[key]
        parts.append(f"<h3>{esc(_(title))}</h3>" + figure(
            sweep_chart(points, _(x_title), _(y_title), as_rate),
            _("Each point is the median of its repeats, measured round-robin over the sizes; "
              "the bars span the fastest and slowest repeat.")))
    if found.cache_on_off:
        same, differ = (_("cache on {on} ms, off {off} ms: {speedup}× faster with it; tokens "
                          "identical"),
                        _("cache on {on} ms, off {off} ms: {speedup}× faster with it; tokens differ"))
        rows = [(_("{n} new tokens").format(n=r.new_tokens), (same if r.same_tokens else differ).format(
            on=f"{r.on_ms.sum():,.0f}", off=f"{r.off_ms.sum():,.0f}", speedup=f"{r.speedup:.2f}"))
            for r in found.cache_on_off]
        last = found.cache_on_off[-1]
        heading = esc(_("KV cache on vs off"))
        parts.append(f"<h3>{heading}</h3>" + key_value_table(rows) + figure(
            on_off_chart(last.on_ms, last.off_ms),
            _("Per-step time for {n} new tokens: without the cache each step is a "
              "prefill of the whole sequence.").format(n=last.new_tokens)))
    if found.cache_variants:
        runs = found.cache_variants
        rows = [(r.config.label, _("{size} at the end, top-1 agreement with the full cache "
                                   "{agreement}").format(size=size(int(r.kv_bytes[-1])),
                                                         agreement=f"{r.agreement:.0%}"))
                for r in runs]
        heading = esc(_("Shrinking the KV cache"))
        parts.append(f"<h3>{heading}</h3>" + key_value_table(rows) + figure(
            variant_chart(runs, "kv_bytes", _("KV cache (KiB)"), 1024),
            _("Measured memory held by each cache variant after each generated token.")))
    if found.cache_shrink:
        runs = list(found.cache_shrink)
        rows = [(f"{_(METHODS[r.method])} · {r.budget}",
                 _("{held} held ({share} of the unmodified), KL {kl} nats, top-1 agreement "
                   "{agreement}, perplexity {ppl} (unmodified {dense})").format(
                     held=size(int(r.kv_bytes[-1])),
                     share=f"{r.kv_bytes[-1] / max(1, r.dense_kv_bytes[-1]):.0%}",
                     kl=f"{r.mean_kl:.4f}", agreement=f"{r.top1_agreement:.0%}",
                     ppl=f"{r.ppl:.3f}", dense=f"{r.dense_ppl:.3f}"))
                for r in runs]
        heading = esc(_("Shrinking the cache itself"))
        parts.append(f"<h3>{heading}</h3>" + key_value_table(rows) + figure(
            shrink_chart(runs), _("Each method and budget against the unmodified model, "
                                  "teacher-forced on this run's tokens.")))
    if found.dtype_comparison is not None:
        result = found.dtype_comparison
        heading = esc(_("Weights dtype"))
        parts.append(f"<h3>{heading}</h3>" + figure(
            dtype_chart(result),
            _("The same greedy continuation ({n} tokens after a {prompt}-token prompt) with each "
              "dtype's weights, {rounds} paired rounds.").format(
                n=result.new_tokens, prompt=result.prompt_tokens, rounds=result.rounds)))
    if found.decode_comparison is not None:
        result = found.decode_comparison
        rows = [(name, _("{duration} per token ({speedup}× eager)").format(
            duration=duration(ms), speedup=f"{result.speedup(name):.2f}"))
                for name, ms in result.steps.items()]
        heading = esc(_("Decode kernels"))
        tokens = esc(_("Greedy tokens identical in every round.") if result.same_tokens
                     else _("Greedy tokens differ."))
        parts.append(f"<h3>{heading}</h3>" + key_value_table(rows) + f'<p class="note">{tokens}</p>')
    return "".join(parts)
