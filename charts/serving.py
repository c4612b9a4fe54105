"""Figures for the Serving page: a stream of requests on the batched engine (engine/serving/).

Pure functions of a `ServingRun` (and of speculative-decoding results): no Streamlit. Colours: one
colour per request (`request_color`), the same in the Gantt (its arrival mark) and the block grid;
in the Gantt prefill stays red and decode blue, as on every page; free blocks are the grey of
unused cache slots. Every colour here is in charts/present.py's PROJECTOR map.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.serving.metrics import summarize_stream, tokens_per_step
from engine.serving.record import RequestRecord, ServingRun, StepRecord
from i18n import N_, _

from .gantt import Bars, Marks, gantt_figure, top_legend
from .live import DECODE_COLOR, PREFILL_COLOR
from .text import as_text
from .tokens import piece_text, visible

# Requests cycle through these (never prefill red or decode blue, which the Gantt's bars use).
REQUEST_COLORS = ["#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
                  "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"]
FREE_COLOR = "#e6e6e6"  # free blocks: the grey of unused cache slots (charts/kvcache.py)
QUEUE_COLOR = "#bdbdbd"  # waiting in the queue (arrived, not admitted)
BATCH_COLOR = "#6b6ecf"  # batch size over time
SCHEDULER_COLORS = {"static": "#8c6d31", "continuous": "#17becf"}
SHARING_COLORS = {"off": "#8c564b", "on": "#2ca02c"}
SPECULATION_COLORS = {"plain greedy": DECODE_COLOR, "speculative": "#ff7f0e"}
SHARED_PATTERN = "/"  # a block referenced by more than one request (prefix sharing)
DRAFTED_STYLE = "background: #d9f2d0; border-color: #2ca02c; font-weight: 600"
GRID_COLUMNS = 32
MAX_GRID_BLOCKS = 1024  # cells drawn; a larger pool shows its first blocks (the caption says so)
TIME_AXIS = N_("time since the stream started (ms)")
WINDOW_MS = 1000.0  # the throughput line: tokens made in the last second of the stream
# what is shown for the record's values (the values themselves stay English identifiers)
FINISH_NAMES = {"eos": N_("eos"), "length": N_("length"), "stopped": N_("stopped"),
                "running": N_("running"), "waiting": N_("waiting"), "refused": N_("refused")}
STEP_NAMES = {"prefill": N_("prefill"), "decode": N_("decode"), "mixed": N_("mixed")}
SCHEDULER_NAMES = {"static": N_("static"), "continuous": N_("continuous")}
SPECULATION_NAMES = {"plain greedy": N_("plain greedy"), "speculative": N_("speculative")}


def finish_name(finish: str) -> str:
    """A request's finish reason as shown."""
    return _(FINISH_NAMES[finish]) if finish in FINISH_NAMES else finish


def step_name(kind: str) -> str:
    """A step's kind as shown."""
    return _(STEP_NAMES[kind]) if kind in STEP_NAMES else kind


def scheduler_name(scheduler: str) -> str:
    """A scheduler as shown."""
    return _(SCHEDULER_NAMES[scheduler]) if scheduler in SCHEDULER_NAMES else scheduler


def request_color(request: int) -> str:
    return REQUEST_COLORS[request % len(REQUEST_COLORS)]


def _now_ms(run: ServingRun) -> float:
    """The end of the last recorded step: where a running request's bar stops in a live view."""
    return max((s.start_ms + s.ms for s in run.steps), default=0.0)


@dataclass(frozen=True, slots=True)
class Phases:
    """One request's bars: (start, end) ms of its queue wait, prefill and decode (None: not yet)."""

    queue: tuple[float, float] | None
    prefill: tuple[float, float] | None
    decode: tuple[float, float] | None
    end: float | None  # its last token, when it has finished


def phases(r: RequestRecord, now: float) -> Phases:
    """Queue = arrival → admission (prefill start); prefill = admission → first token; decode =
    first token → last token. A request still waiting or prefilling runs to `now`."""
    arrival = r.spec.arrival_ms
    if r.admitted_ms is None:
        waiting = r.finish == "waiting" and now >= arrival  # (not yet arrived: no bar)
        return Phases((arrival, now) if waiting else None, None, None, None)
    queue = (arrival, r.admitted_ms)
    if not r.token_ms:
        return Phases(queue, (r.admitted_ms, max(now, r.admitted_ms)), None, None)
    prefill = (r.admitted_ms, r.token_ms[0])
    running = r.finish in ("running", "waiting")
    decode = (r.token_ms[0], now if running else r.token_ms[-1])
    return Phases(queue, prefill, decode, None if running else r.token_ms[-1])


def gantt_chart(run: ServingRun) -> go.Figure:
    """One row per request: queue wait (grey), prefill (red), decode (blue), a mark where it
    finished; its arrival marked in the request's own colour (the block grid's)."""
    now = _now_ms(run)
    rows = [_("request {id}").format(id=r.id) for r in run.requests]
    bars = {"queue": Bars(_("queue wait"), QUEUE_COLOR),
            "prefill": Bars(_("prefill"), PREFILL_COLOR),
            "decode": Bars(_("decode"), DECODE_COLOR)}
    phase_names = {"queue": _("queue"), "prefill": _("prefill"), "decode": _("decode")}
    for r, row in zip(run.requests, rows):
        p = phases(r, now)
        prompt = len(r.spec.prompt_token_ids)
        notes = {"queue": _("waited {ms:.0f} ms").format(ms=_span(p.queue)),
                 "prefill": (_("{n} prompt tokens ({cached} from shared blocks)").format(
                     n=prompt, cached=r.cached_tokens) if r.cached_tokens
                     else _("{n} prompt tokens").format(n=prompt)),
                 "decode": _("{n} tokens · finish: {finish}").format(
                     n=len(r.token_ids), finish=as_text(finish_name(r.finish)))}
        for name, span in (("queue", p.queue), ("prefill", p.prefill), ("decode", p.decode)):
            if span is not None and span[1] >= span[0]:
                bars[name].add(span[0], max(span[1] - span[0], 0.0), row,
                               _("request {id} · {phase}<br>{start:.0f} → {end:.0f} ms "
                                 "({ms:.0f} ms)<br>{note}").format(
                                   id=r.id, phase=phase_names[name], start=span[0], end=span[1],
                                   ms=span[1] - span[0], note=notes[name]))
    done = [(r, row) for r, row in zip(run.requests, rows) if phases(r, now).end is not None]
    marks = [
        Marks(_("done"), [r.token_ms[-1] for r, __ in done] or [None],
              [row for __, row in done] or [None],
              [_("request {id} done at {ms:.0f} ms ({finish}): {n} tokens, TTFT {ttft:.0f} ms")
               .format(id=r.id, ms=r.token_ms[-1], finish=finish_name(r.finish),
                       n=len(r.token_ids), ttft=r.ttft_ms) for r, __ in done],
              {"symbol": "line-ns-open", "size": 16, "color": "#000000", "line": {"width": 2}}),
        Marks(_("arrival (the request's colour)"), [r.spec.arrival_ms for r in run.requests],
              rows,
              [_("request {id} arrived at {ms:.0f} ms").format(id=r.id, ms=r.spec.arrival_ms)
               for r in run.requests],
              {"symbol": "square", "size": 11,
               "color": [request_color(r.id) for r in run.requests],
               "line": {"color": "#000000", "width": 1}}),
    ]
    return gantt_figure(rows, list(bars.values()), marks, title=_("Every request over time"),
                        height=min(140 + 26 * len(rows), 720), legend_entries=5,
                        time_axis=_(TIME_AXIS))


def _span(span: tuple[float, float] | None) -> float:
    return 0.0 if span is None else span[1] - span[0]


def block_owners(step: StepRecord, block_size: int) -> dict[int, list[tuple[int, int, int]]]:
    """Physical block → [(request, logical block, tokens it holds)] after a step."""
    owners: dict[int, list[tuple[int, int, int]]] = {}
    for row in step.tables:
        for logical, physical in enumerate(row.blocks):
            held = max(min(block_size, row.tokens - logical * block_size), 0)
            owners.setdefault(physical, []).append((row.request, logical, held))
    return owners


def block_grid_chart(run: ServingRun, step: int | None = None) -> go.Figure:
    """The block pool after one step (default: the last): one cell per physical block, in the
    colour of the request that holds it (a shared block, hatched, in its first holder's colour),
    free blocks grey. Cells are horizontal bar segments, so they scale with the chart's width."""
    size = run.config.block_size
    pool = min(run.config.num_blocks, MAX_GRID_BLOCKS)
    cols = min(GRID_COLUMNS, pool)
    fig = go.Figure()
    if not run.steps:
        owners: dict[int, list[tuple[int, int, int]]] = {}
        title = _("Block pool (no step yet)")
    else:
        chosen = run.steps[-1 if step is None else step]
        owners = block_owners(chosen, size)
        title = _("Block pool after step {step} ({kind}, batch {batch}): {used} used, {free} free "
                  "of {total}").format(step=chosen.index, kind=step_name(chosen.kind),
                                       batch=chosen.batch_size, used=chosen.blocks_used,
                                       free=chosen.free_blocks, total=run.config.num_blocks)
    cells: dict[object, tuple[list, list, list, list]] = {}
    for block in range(pool):
        held = owners.get(block)
        key = "free" if not held else held[0][0]
        xs, ys, hover, pattern = cells.setdefault(key, ([], [], [], []))
        xs.append(block % cols)
        ys.append(block // cols)
        pattern.append(SHARED_PATTERN if held and len(held) > 1 else "")
        if not held:
            hover.append(_("block {block}: free").format(block=block))
        elif len(held) == 1:
            r, logical, tokens = held[0]
            hover.append(_("block {block}: request {request} (logical block {logical}) · "
                           "{tokens}/{size} tokens").format(block=block, request=r, logical=logical,
                                                            tokens=tokens, size=size))
        else:
            hover.append(_("block {block}: shared by requests {requests} · {tokens}/{size} tokens")
                         .format(block=block, requests=", ".join(str(h[0]) for h in held),
                                 tokens=held[0][2], size=size))
    for key in sorted((k for k in cells if k != "free"), key=int):
        _cells(fig, cells[key], _("request {id}").format(id=key), request_color(int(key)))
    if "free" in cells:
        _cells(fig, cells["free"], _("free"), FREE_COLOR)
    if any(SHARED_PATTERN in c[3] for c in cells.values()):  # a legend entry for the hatching
        fig.add_trace(go.Bar(x=[None], y=[None], orientation="h", name=_("shared (hatched)"),
                             marker={"color": "#ffffff", "line": {"color": "#000000", "width": 1},
                                     "pattern": {"shape": SHARED_PATTERN, "fgcolor": "#000000"}},
                             hoverinfo="skip"))
    rows = (pool + cols - 1) // cols
    fig.update_layout(height=110 + 26 * rows, barmode="overlay", bargap=0.12, title_text=title,
                      margin={"l": 10, "r": 10, "b": 10}, hovermode="closest")
    top_legend(fig, len(fig.data), per_row=8)
    fig.update_layout(legend_title_text=_("block of:"))
    ticks = list(range(0, cols, 4 if cols > 8 else 1))
    fig.update_xaxes(title_text=_("physical block id: row start + column (each cell: {size} token "
                                  "slots)").format(size=size), range=[0, cols],
                     tickvals=[t + 0.5 for t in ticks],
                     ticktext=[f"+{t}" for t in ticks], showgrid=False)
    fig.update_yaxes(title_text=_("row start"), range=[rows - 0.5, -0.5],
                     tickvals=list(range(rows)), ticktext=[str(r * cols) for r in range(rows)],
                     showgrid=False)
    return fig


def _cells(fig: go.Figure, cells: tuple[list, list, list, list], name: str, color: str) -> None:
    xs, ys, hover, pattern = cells
    fig.add_trace(go.Bar(x=[1] * len(xs), base=xs, y=ys, orientation="h", name=name,
                         marker={"color": color, "line": {"color": "#ffffff", "width": 1},
                                 "pattern": {"shape": pattern, "fgcolor": "#000000", "size": 6,
                                             "fillmode": "overlay"}},
                         hovertext=hover, hoverinfo="text"))


def throughput_chart(run: ServingRun) -> go.Figure:
    """Output tokens per second over the last second of the stream (WINDOW_MS), each step's own
    rate (its tokens ÷ its time) as faint points at each step's end, and the batch size over
    each step, from its start: a full batch makes many tokens in a step that costs about what
    one token does."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    ends = [s.start_ms + s.ms for s in run.steps]
    made = tokens_per_step(run)
    rate = [1000.0 * n / s.ms if s.ms > 0 else None for n, s in zip(made, run.steps)]
    start = min((r.spec.arrival_ms for r in run.requests), default=0.0)
    window = [1000.0 * sum(n for e, n in zip(ends, made) if t - WINDOW_MS < e <= t)
              / max(min(WINDOW_MS, t - start), 1e-9) for t in ends]
    fig.add_trace(go.Scatter(
        x=ends, y=rate, mode="markers", name=_("one step: its tokens ÷ its time"),
        marker={"color": DECODE_COLOR, "size": 5, "opacity": 0.35},
        customdata=[[s.index, n, s.ms, step_name(s.kind)] for s, n in zip(run.steps, made)],
        hovertemplate=_("step %{customdata[0]} (%{customdata[3]})<br>%{customdata[1]} tokens in "
                        "%{customdata[2]:.1f} ms<br>%{y:.0f} tokens/s<extra></extra>")),
        secondary_y=False)
    fig.add_trace(go.Scatter(
        x=ends, y=window, mode="lines", name=_("tokens/s over the last second"),
        line={"color": DECODE_COLOR, "width": 3},
        hovertemplate=_("%{y:.1f} tokens/s over the second before %{x:.0f} ms<extra></extra>")),
        secondary_y=False)
    sizes = [s.batch_size for s in run.steps]
    fig.add_trace(go.Scatter(  # each step's size held from its start to its end (the next start)
        x=[s.start_ms for s in run.steps] + ends[-1:], y=sizes + sizes[-1:], mode="lines",
        line={"color": BATCH_COLOR, "shape": "hv"}, name=_("batch size (requests in the step)"),
        hovertemplate=_("%{y} requests in the step<extra></extra>")), secondary_y=True)
    fig.update_layout(height=340, margin={"l": 10, "r": 10, "b": 10},
                      title_text=_("Tokens per second and batch size"))
    top_legend(fig, 3)
    fig.update_xaxes(title_text=_(TIME_AXIS), rangemode="tozero")
    fig.update_yaxes(title_text=_("output tokens/s"), rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text=_("batch size (requests)"), secondary_y=True, showgrid=False,
                     range=[0, run.config.max_batch + 0.5], dtick=max(1, run.config.max_batch // 8))
    return fig


def _grouped(fig: go.Figure, runs: dict[str, ServingRun], colors: dict[str, str],
             panels: list[tuple[str, list[tuple[str, str]]]]) -> go.Figure:
    """Bars per panel (a metric group with one unit), one colour per run, values on the bars.
    Run names, units and labels come marked (`N_`) and are translated here; `colors` is keyed by
    the runs' (English) names."""
    stats = {name: summarize_stream(run) for name, run in runs.items()}
    for name, summary in stats.items():
        shown = _(name)
        for col, (__, metrics) in enumerate(panels, start=1):
            ys = [getattr(summary, field) for field, __ in metrics]
            fig.add_trace(go.Bar(x=[_(label) for __, label in metrics], y=ys, name=shown,
                                 legendgroup=name, showlegend=col == 1,
                                 marker_color=colors[name],
                                 text=[f"{y:,.0f}" if y is not None else "–" for y in ys],
                                 textposition="outside", cliponaxis=False,
                                 hovertemplate=shown
                                 + "<br>%{x}: %{y:,.1f}<extra></extra>"),
                          row=1, col=col)
    for col, (unit, __) in enumerate(panels, start=1):
        fig.update_yaxes(title_text=_(unit), rangemode="tozero", row=1, col=col)
    fig.update_layout(height=380, barmode="group", margin={"l": 10, "r": 10, "b": 10})
    top_legend(fig, len(runs))
    return fig


def batching_chart(static: ServingRun, continuous: ServingRun) -> go.Figure:
    """Static vs continuous batching on one stream: throughput, TTFT and ITL p50/p90."""
    panels = [(N_("output tokens/s"), [("throughput_tok_s", N_("throughput"))]),
              (N_("time to first token (ms)"), [("ttft_p50", N_("TTFT p50")),
                                                ("ttft_p90", N_("TTFT p90"))]),
              (N_("inter-token latency (ms)"), [("itl_p50", N_("ITL p50")),
                                                ("itl_p90", N_("ITL p90"))])]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09)
    _grouped(fig, {N_("static"): static, N_("continuous"): continuous}, SCHEDULER_COLORS, panels)
    fig.update_layout(title_text=_("Static vs continuous batching, same stream"))
    return fig


def per_request_chart(runs: dict[str, ServingRun], colors: dict[str, str]) -> go.Figure:
    """Each request's TTFT and end-to-end latency under each run (markers: TTFT, bars: e2e)."""
    fig = go.Figure()
    for name, run in runs.items():
        done = [r for r in run.requests if r.token_ms]
        shown = scheduler_name(name)
        requests = [_("request {id}").format(id=r.id) for r in done]
        fig.add_trace(go.Bar(x=requests, y=[r.e2e_ms for r in done],
                             name=_("{run}: end to end").format(run=shown),
                             marker_color=colors[name], opacity=0.45,
                             hovertemplate=_("{run} · %{x}<br>end to end %{y:,.0f} ms"
                                             "<extra></extra>").replace("{run}", shown)))
        fig.add_trace(go.Scatter(x=requests, y=[r.ttft_ms for r in done],
                                 mode="markers", name=_("{run}: TTFT").format(run=shown),
                                 marker={"color": colors[name], "size": 10, "symbol": "diamond"},
                                 hovertemplate=_("{run} · %{x}<br>TTFT %{y:,.0f} ms"
                                                 "<extra></extra>").replace("{run}", shown)))
    fig.update_layout(height=360, barmode="group", margin={"l": 10, "r": 10, "b": 10},
                      title_text=_("Per request: time to first token and end to end"))
    top_legend(fig, len(fig.data))
    fig.update_yaxes(title_text=_("latency since arrival (ms)"), rangemode="tozero")
    fig.update_xaxes(title_text=_("request"))
    return fig


def sharing_chart(off: ServingRun, on: ServingRun) -> go.Figure:
    """Prefix sharing off vs on, same stream: blocks at the peak, prompt tokens computed and the
    prefill steps' time."""
    panels = [(N_("blocks (peak in use)"), [("peak_blocks", N_("peak blocks"))]),
              (N_("prompt tokens"), [("prompt_tokens", N_("in the prompts")),
                                     ("computed_prompt_tokens", N_("computed by prefill"))]),
              (N_("prefill steps' time (ms)"), [("prefill_ms", N_("prefill ms"))])]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09)
    _grouped(fig, {N_("sharing off"): off, N_("sharing on"): on},
             {"sharing off": SHARING_COLORS["off"], "sharing on": SHARING_COLORS["on"]}, panels)
    fig.update_layout(title_text=_("Prefix sharing off vs on, same stream"))
    return fig


def drafted_chips_html(pieces: list[str], drafted: list[bool]) -> str:
    """The output tokens as chips; those that came from an accepted draft are highlighted."""
    parts = []
    for i, (piece, from_draft) in enumerate(zip(pieces, drafted)):
        title = (_("output token {i} · accepted from the draft") if from_draft
                 else _("output token {i} · computed by the model (no accepted draft)")).format(i=i)
        style = f' style="{DRAFTED_STYLE}"' if from_draft else ""
        kind = "ie-gen ie-drafted" if from_draft else "ie-gen"
        parts.append(f'<span class="ie-chip {kind}"{style} title="{html.escape(title, quote=True)}">'
                     f"{as_text(visible(piece_text(piece)))}</span>")
    return '<div class="ie-chips">' + "".join(parts) + "</div>"


def speculation_chart(rows: list[tuple[str, float, float, float, float]]) -> go.Figure:
    """Plain greedy vs speculative tokens/s per prompt: rows of (prompt label, plain tok/s,
    speculative tok/s, acceptance rate, speedup = the median of per-round ratios, as the text
    beside the chart says), the speedup written on each pair."""
    fig = go.Figure()
    labels = [r[0] for r in rows]
    for i, name in enumerate(("plain greedy", "speculative")):
        ys = [r[1 + i] for r in rows]
        shown = _(SPECULATION_NAMES[name])
        fig.add_trace(go.Bar(x=labels, y=ys, name=shown, marker_color=SPECULATION_COLORS[name],
                             text=[f"{y:,.1f}" for y in ys], textposition="outside",
                             cliponaxis=False,
                             hovertemplate=_("{run}<br>%{x}: %{y:,.1f} tokens/s<extra></extra>")
                             .replace("{run}", shown)))
    top = max((max(r[1], r[2]) for r in rows), default=1.0)
    for label, __, ___, accept, speedup in rows:
        fig.add_annotation(x=label, y=top * 1.22, showarrow=False,
                           text=_("{speedup:.2f}× · {accept:.0%} of drafts accepted").format(
                               speedup=speedup, accept=accept))
    fig.update_layout(height=360, barmode="group", margin={"l": 10, "r": 10, "b": 10},
                      title_text=_("Speculative decoding vs plain greedy, measured"))
    top_legend(fig, 2)
    fig.update_yaxes(title_text=_("output tokens/s"), range=[0, top * 1.35])
    fig.update_xaxes(title_text=_("prompt"))
    return fig
