"""Figures for the Serving engine page: a load on a serving engine behind an OpenAI-compatible
API (engine/remote/), as the client timed it and as the server's /metrics counted it.

Pure functions of a `LoadRun`: no Streamlit. Time runs in seconds since the load started (the
first /metrics sample, taken before any request was sent, is at 0). The Gantt keeps the Serving
page's colours: grey = waiting (here: not yet sent, the client's concurrency limit or arrival
time), red = up to the first token (TTFT: prefill plus the server's queue and HTTP), blue =
decode. Every colour is in charts/present.py's PROJECTOR map.
"""

from __future__ import annotations

from dataclasses import replace

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.remote.loadtest import arrival_times_s
from engine.remote.record import LoadRun, MetricsSample, RemoteRequest
from engine.remote.summary import tokens_per_second_window
from i18n import N_, _

from .gantt import Bars, Marks, gantt_figure, top_legend
from .live import DECODE_COLOR, KV_COLOR, PREFILL_COLOR
from .serving import QUEUE_COLOR
from .text import as_text

TIME_AXIS = N_("time since the load started (s)")
RUNNING_COLOR = DECODE_COLOR  # requests the server is decoding
WAITING_COLOR = "#ff7f0e"  # requests queued inside the server
SERVER_RATE_COLOR = "#9467bd"  # the server's own generation-token counter
MEAN_COLOR = "#7f7f7f"
DONE, ERROR, STOPPED = "#000000", "#d62728", "#7f7f7f"
MAX_PROMPT_HOVER = 60
END_MARKS = {"done": N_("done"), "error": N_("error"), "stopped": N_("stopped")}  # legend names
# A request's finish (engine/remote/record.py FINISHES) as shown; the record keeps the English id.
FINISH_NAMES = {"length": N_("length"), "stop": N_("stop"), "error": N_("error"),
                "stopped": N_("stopped"), "running": N_("running"), "waiting": N_("waiting")}


def finish_name(finish: str) -> str:
    """A request's finish in the session's language (an unknown one as it is)."""
    return _(FINISH_NAMES[finish]) if finish in FINISH_NAMES else finish


def now_ms(run: LoadRun) -> float:
    """The latest moment the record knows: its last /metrics sample, chunk or send (a live
    snapshot's 'now', where running bars end)."""
    times = [s.t_ms for s in run.samples] + [t for r in run.requests for t in r.chunk_ms] \
        + [r.sent_ms for r in run.requests if r.sent_ms is not None]
    return max(times, default=0.0)


def _short(text: str, n: int = MAX_PROMPT_HOVER) -> str:
    """A file's text (a prompt, an error) for hover text: one line, cut, and shown as text."""
    text = " ".join(text.split())
    return as_text(text if len(text) <= n else text[:n - 1] + "…")


def request_spans(r: RemoteRequest, arrival_ms: float, now: float
                  ) -> dict[str, tuple[float, float] | None]:
    """One request's bars in ms: `waiting` arrival → sent (or → now while unsent), `ttft` sent →
    first token (→ now while it waits for one), `decode` first → last token (→ now while it
    streams). An errored request without tokens has no TTFT bar (when it failed is unknown)."""
    live = r.finish in ("running", "stopped")
    if r.sent_ms is None:
        waiting = (arrival_ms, now) if r.finish in ("waiting", "stopped") and now > arrival_ms \
            else None
        return {"waiting": waiting, "ttft": None, "decode": None}
    waiting = (arrival_ms, r.sent_ms) if r.sent_ms > arrival_ms else None
    if not r.chunk_ms:
        return {"waiting": waiting, "ttft": (r.sent_ms, max(now, r.sent_ms)) if live else None,
                "decode": None}
    end = max(now, r.chunk_ms[-1]) if r.finish == "running" else r.chunk_ms[-1]
    return {"waiting": waiting, "ttft": (r.sent_ms, r.chunk_ms[0]), "decode": (r.chunk_ms[0], end)}


def end_mark(r: RemoteRequest, now: float) -> tuple[str, float] | None:
    """(kind, ms) of a request's end mark: done / error / stopped; None while it runs."""
    if r.finish in ("length", "stop"):
        return "done", r.chunk_ms[-1] if r.chunk_ms else (r.sent_ms or 0.0)
    if r.finish == "error":
        return "error", r.chunk_ms[-1] if r.chunk_ms else (r.sent_ms or 0.0)
    if r.finish == "stopped":
        return "stopped", r.chunk_ms[-1] if r.chunk_ms else now
    return None


def gantt_chart(run: LoadRun) -> go.Figure:
    """One row per request: waiting to be sent (grey), sent → first token (red: the client's
    TTFT), decode (blue), and a mark where it ended: done (|), error (×) or stopped (○)."""
    now = now_ms(run)
    arrivals = [1000.0 * a for a in arrival_times_s(run.config)]
    rows = [_("request {id}").format(id=r.id) for r in run.requests]
    bars = {"waiting": Bars(_("waiting to be sent"), QUEUE_COLOR),
            "ttft": Bars(_("sent → first token (TTFT)"), PREFILL_COLOR),
            "decode": Bars(_("decode"), DECODE_COLOR)}
    for r, row, arrival in zip(run.requests, rows, arrivals):
        head = _("request {id} · “{prompt}”").format(id=r.id, prompt=_short(r.prompt))
        ttft = (_("sent → first token (TTFT, client) · {n} prompt tokens").format(
            n=r.prompt_tokens) if r.prompt_tokens else _("sent → first token (TTFT, client)"))
        notes = {"waiting": _("not yet sent (concurrency limit or arrival time)"),
                 "ttft": ttft,
                 "decode": _("{tokens} tokens in {chunks} chunks · finish: {finish}").format(
                     tokens=r.output_tokens, chunks=len(r.chunk_ms), finish=as_text(finish_name(r.finish)))}
        for name, span in request_spans(r, arrival, now).items():
            if span is not None:
                bars[name].add(span[0] / 1000.0, (span[1] - span[0]) / 1000.0, row,
                               f"{head}<br>{notes[name]}<br>{span[0] / 1000:.2f} → "
                               f"{span[1] / 1000:.2f} s ({span[1] - span[0]:,.0f} ms)")
    marks = []
    for kind, symbol, color in (("done", "line-ns-open", DONE), ("error", "x", ERROR),
                                ("stopped", "circle-open", STOPPED)):
        ended = [(r, row, mark[1]) for r, row in zip(run.requests, rows)
                 if (mark := end_mark(r, now)) is not None and mark[0] == kind]
        marks.append(Marks(
            _(END_MARKS[kind]), [t / 1000.0 for __, __, t in ended] or [None],
            [row for __, row, __ in ended] or [None], [_end_text(r, t) for r, __, t in ended],
            {"symbol": symbol, "size": 14 if kind == "done" else 11, "color": color,
             "line": {"width": 2, "color": color}}, showlegend=bool(ended) or kind == "done"))
    return gantt_figure(rows, list(bars.values()), marks,
                        title=_("Every request over time, as the client saw it"),
                        height=min(150 + 24 * len(rows), 760), legend_entries=6,
                        time_axis=_(TIME_AXIS))


def _end_text(r: RemoteRequest, t_ms: float) -> str:
    ttft = "–" if r.ttft_ms is None else f"{r.ttft_ms:,.0f} ms"
    text = _("request {id} {finish} at {t:.2f} s: {tokens} tokens, TTFT {ttft}").format(
        id=r.id, finish=as_text(finish_name(r.finish)), t=t_ms / 1000, tokens=r.output_tokens, ttft=ttft)
    return text + (f"<br>{_short(r.error, 120)}" if r.error else "")


def server_rate(samples: tuple[MetricsSample, ...]) -> list[tuple[float, float]]:
    """(t_ms, tokens/s) from the server's generation-token counter between consecutive samples,
    at the later sample: the server's own count of what it generated (the chart draws each value
    back to the sample before, over the interval it covers)."""
    points = []
    for a, b in zip(samples, samples[1:]):
        if a.generation_tokens is None or b.generation_tokens is None or b.t_ms <= a.t_ms:
            continue
        points.append((b.t_ms, 1000.0 * (b.generation_tokens - a.generation_tokens)
                       / (b.t_ms - a.t_ms)))
    return points


def throughput_chart(run: LoadRun) -> go.Figure:
    """Output tokens/s over the last second, counted from the chunks' arrival on the client; the
    server's generation-token counter per second between /metrics samples; and the load's mean
    (output tokens ÷ (last token − first request sent))."""
    fig = go.Figure()
    client = tokens_per_second_window(run)
    fig.add_trace(go.Scatter(
        x=[t / 1000.0 for t, __ in client], y=[v for __, v in client], mode="lines",
        name=_("client: tokens received in the last second"),
        line={"color": DECODE_COLOR, "width": 3},
        hovertemplate=_("%{y:.1f} tokens/s received in the second before %{x:.2f} s"
                        "<extra></extra>")))
    server = server_rate(run.samples)
    fig.add_trace(go.Scatter(
        x=[t / 1000.0 for t, __ in server], y=[v for __, v in server], mode="lines+markers",
        name=_("server: its generation-token counter ÷ time between samples"),
        line={"color": SERVER_RATE_COLOR, "width": 2, "dash": "dot", "shape": "vh"},
        marker={"size": 5},
        hovertemplate=_("%{y:.1f} tokens/s counted by the server up to %{x:.2f} s"
                        "<extra></extra>")))
    live = any(r.finish in ("running", "waiting") for r in run.requests)
    if run.throughput_tok_s > 0:
        fig.add_hline(y=run.throughput_tok_s, line={"color": MEAN_COLOR, "dash": "dash",
                                                     "width": 1},
                      annotation_text=(_("mean so far: {rate:.1f} tokens/s") if live else
                                       _("mean over the load: {rate:.1f} tokens/s")).format(
                                           rate=run.throughput_tok_s),
                      annotation_position="top left")
    fig.update_layout(height=330, margin={"l": 10, "r": 10, "b": 10},
                      title_text=_("Tokens per second"), hovermode="closest")
    top_legend(fig, 2, per_row=2)
    fig.update_xaxes(title_text=_(TIME_AXIS), rangemode="tozero")
    fig.update_yaxes(title_text=_("output tokens/s"), rangemode="tozero")
    return fig


def server_chart(run: LoadRun) -> go.Figure:
    """The server's own gauges at every /metrics sample: requests it is running and keeping
    waiting (top), and the share of its KV-cache blocks in use (bottom); preemptions, if any,
    marked where its counter rose."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        row_heights=[0.55, 0.45])
    samples = run.samples
    xs = [s.t_ms / 1000.0 for s in samples]
    for field, label, hover, color in (
            ("running", _("running (in the server's batch)"),
             _("%{y:.0f} requests running at %{x:.2f} s<extra></extra>"), RUNNING_COLOR),
            ("waiting", _("waiting (queued in the server)"),
             _("%{y:.0f} requests waiting at %{x:.2f} s<extra></extra>"), WAITING_COLOR)):
        fig.add_trace(go.Scatter(
            x=xs, y=[getattr(s, field) for s in samples], mode="lines+markers", name=label,
            line={"color": color, "shape": "hv", "width": 2}, marker={"size": 4},
            hovertemplate=hover), row=1, col=1)
    rises = [(b.t_ms, b.preemptions - a.preemptions) for a, b in zip(samples, samples[1:])
             if a.preemptions is not None and b.preemptions is not None
             and b.preemptions > a.preemptions]
    if rises:
        fig.add_trace(go.Scatter(
            x=[t / 1000.0 for t, __ in rises], y=[0] * len(rises), mode="markers",
            name=_("preemption(s)"), marker={"symbol": "x", "size": 11, "color": ERROR},
            customdata=[n for __, n in rises],
            hovertemplate=_("%{customdata:.0f} preemption(s) up to %{x:.2f} s"
                            "<extra></extra>")),
            row=1, col=1)
    usage = [None if s.kv_usage is None else 100.0 * s.kv_usage for s in samples]
    fig.add_trace(go.Scatter(
        x=xs, y=usage, mode="lines+markers", name=_("KV-cache usage"), fill="tozeroy",
        line={"color": KV_COLOR, "width": 2}, marker={"size": 4},
        hovertemplate=_("%{y:.2f} % of the KV-cache blocks in use at %{x:.2f} s"
                        "<extra></extra>")),
        row=2, col=1)
    top = max((v for v in usage if v is not None), default=0.0)
    counts = [v for s in samples for v in (s.running, s.waiting) if v is not None]
    fig.update_layout(height=420, margin={"l": 10, "r": 10, "b": 10}, hovermode="closest",
                      title_text=_("The server's own gauges (/metrics, about every 0.5 s)"))
    top_legend(fig, len(fig.data), per_row=4)
    fig.update_xaxes(title_text=_(TIME_AXIS), rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text=_("requests"), rangemode="tozero", row=1, col=1,
                     range=[0, max(counts, default=1.0) * 1.15 + 0.5])
    fig.update_yaxes(title_text=_("KV usage (% of blocks)"), row=2, col=1,
                     range=[0, max(top * 1.25, 1.0)])
    if not samples:
        fig.add_annotation(text=_("no /metrics samples from this server"), showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def load_at(run: LoadRun, t_ms: float) -> LoadRun:
    """The load as a live view showed it at `t_ms` (a replay's frame): chunks and samples up to
    then; requests not yet sent are waiting, those still streaming are running."""
    requests = []
    for r in run.requests:
        if r.sent_ms is None or r.sent_ms > t_ms:
            requests.append(replace(r, sent_ms=None, chunk_ms=(), chunk_tokens=(), token_ids=(),
                                    text="", finish="waiting", error=None))
            continue
        n = sum(1 for c in r.chunk_ms if c <= t_ms)
        # all its chunks in: it has ended as recorded (an error without tokens: when sent)
        ended = n == len(r.chunk_ms) and (n > 0 or r.finish == "error")
        tokens = sum(r.chunk_tokens[:n])
        requests.append(replace(
            r, chunk_ms=r.chunk_ms[:n], chunk_tokens=r.chunk_tokens[:n],
            token_ids=r.token_ids[:tokens], finish=r.finish if ended else "running",
            error=r.error if ended else None))
    return replace(run, requests=tuple(requests),
                   samples=tuple(s for s in run.samples if s.t_ms <= t_ms))
