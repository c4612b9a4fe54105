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
TIME_AXIS = "time since the stream started (ms)"
WINDOW_MS = 1000.0  # the throughput line: tokens made in the last second of the stream


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
    rows = [f"request {r.id}" for r in run.requests]
    bars = {"queue": Bars("queue wait", QUEUE_COLOR), "prefill": Bars("prefill", PREFILL_COLOR),
            "decode": Bars("decode", DECODE_COLOR)}
    for r, row in zip(run.requests, rows):
        p = phases(r, now)
        notes = {"queue": f"waited {_span(p.queue):.0f} ms",
                 "prefill": f"{len(r.spec.prompt_token_ids)} prompt tokens"
                            + (f" ({r.cached_tokens} from shared blocks)" if r.cached_tokens else ""),
                 "decode": f"{len(r.token_ids)} tokens · finish: {as_text(r.finish)}"}
        for name, span in (("queue", p.queue), ("prefill", p.prefill), ("decode", p.decode)):
            if span is not None and span[1] >= span[0]:
                bars[name].add(span[0], max(span[1] - span[0], 0.0), row,
                               f"request {r.id} · {name}<br>{span[0]:.0f} → {span[1]:.0f} ms "
                               f"({span[1] - span[0]:.0f} ms)<br>{notes[name]}")
    done = [(r, row) for r, row in zip(run.requests, rows) if phases(r, now).end is not None]
    marks = [
        Marks("done", [r.token_ms[-1] for r, _ in done] or [None],
              [row for _, row in done] or [None],
              [f"request {r.id} done at {r.token_ms[-1]:.0f} ms ({r.finish}): "
               f"{len(r.token_ids)} tokens, TTFT {r.ttft_ms:.0f} ms" for r, _ in done],
              {"symbol": "line-ns-open", "size": 16, "color": "#000000", "line": {"width": 2}}),
        Marks("arrival (the request's colour)", [r.spec.arrival_ms for r in run.requests], rows,
              [f"request {r.id} arrived at {r.spec.arrival_ms:.0f} ms" for r in run.requests],
              {"symbol": "square", "size": 11,
               "color": [request_color(r.id) for r in run.requests],
               "line": {"color": "#000000", "width": 1}}),
    ]
    return gantt_figure(rows, list(bars.values()), marks, title="Every request over time",
                        height=min(140 + 26 * len(rows), 720), legend_entries=5,
                        time_axis=TIME_AXIS)


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
        title = "Block pool (no step yet)"
    else:
        chosen = run.steps[-1 if step is None else step]
        owners = block_owners(chosen, size)
        title = (f"Block pool after step {chosen.index} ({chosen.kind}, batch {chosen.batch_size}): "
                 f"{chosen.blocks_used} used, {chosen.free_blocks} free of {run.config.num_blocks}")
    cells: dict[object, tuple[list, list, list, list]] = {}
    for block in range(pool):
        held = owners.get(block)
        key = "free" if not held else held[0][0]
        xs, ys, hover, pattern = cells.setdefault(key, ([], [], [], []))
        xs.append(block % cols)
        ys.append(block // cols)
        pattern.append(SHARED_PATTERN if held and len(held) > 1 else "")
        if not held:
            hover.append(f"block {block}: free")
        elif len(held) == 1:
            r, logical, tokens = held[0]
            hover.append(f"block {block}: request {r} (logical block {logical}) · "
                         f"{tokens}/{size} tokens")
        else:
            hover.append(f"block {block}: shared by requests {', '.join(str(h[0]) for h in held)} "
                         f"· {held[0][2]}/{size} tokens")
    for key in sorted((k for k in cells if k != "free"), key=int):
        _cells(fig, cells[key], f"request {key}", request_color(int(key)))
    if "free" in cells:
        _cells(fig, cells["free"], "free", FREE_COLOR)
    if any(SHARED_PATTERN in c[3] for c in cells.values()):  # a legend entry for the hatching
        fig.add_trace(go.Bar(x=[None], y=[None], orientation="h", name="shared (hatched)",
                             marker={"color": "#ffffff", "line": {"color": "#000000", "width": 1},
                                     "pattern": {"shape": SHARED_PATTERN, "fgcolor": "#000000"}},
                             hoverinfo="skip"))
    rows = (pool + cols - 1) // cols
    fig.update_layout(height=110 + 26 * rows, barmode="overlay", bargap=0.12, title_text=title,
                      margin={"l": 10, "r": 10, "b": 10}, hovermode="closest")
    top_legend(fig, len(fig.data), per_row=8)
    fig.update_layout(legend_title_text="block of:")
    ticks = list(range(0, cols, 4 if cols > 8 else 1))
    fig.update_xaxes(title_text=f"physical block id: row start + column (each cell: {size} token "
                                "slots)", range=[0, cols], tickvals=[t + 0.5 for t in ticks],
                     ticktext=[f"+{t}" for t in ticks], showgrid=False)
    fig.update_yaxes(title_text="row start", range=[rows - 0.5, -0.5],
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
    rate (its tokens ÷ its time) as faint points, and the batch size, at each step's end: a full
    batch makes many tokens in a step that costs about what one token does."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    ends = [s.start_ms + s.ms for s in run.steps]
    made = tokens_per_step(run)
    rate = [1000.0 * n / s.ms if s.ms > 0 else None for n, s in zip(made, run.steps)]
    start = min((r.spec.arrival_ms for r in run.requests), default=0.0)
    window = [1000.0 * sum(n for e, n in zip(ends, made) if t - WINDOW_MS < e <= t)
              / max(min(WINDOW_MS, t - start), 1e-9) for t in ends]
    fig.add_trace(go.Scatter(
        x=ends, y=rate, mode="markers", name="one step: its tokens ÷ its time",
        marker={"color": DECODE_COLOR, "size": 5, "opacity": 0.35},
        customdata=[[s.index, n, s.ms, s.kind] for s, n in zip(run.steps, made)],
        hovertemplate="step %{customdata[0]} (%{customdata[3]})<br>%{customdata[1]} tokens in "
                      "%{customdata[2]:.1f} ms<br>%{y:.0f} tokens/s<extra></extra>"),
        secondary_y=False)
    fig.add_trace(go.Scatter(
        x=ends, y=window, mode="lines", name="tokens/s over the last second",
        line={"color": DECODE_COLOR, "width": 3},
        hovertemplate="%{y:.1f} tokens/s over the second before %{x:.0f} ms<extra></extra>"),
        secondary_y=False)
    fig.add_trace(go.Scatter(
        x=ends, y=[s.batch_size for s in run.steps], mode="lines", line={"color": BATCH_COLOR,
                                                                         "shape": "hv"},
        name="batch size (requests in the step)",
        hovertemplate="%{y} requests in the step<extra></extra>"), secondary_y=True)
    fig.update_layout(height=340, margin={"l": 10, "r": 10, "b": 10},
                      title_text="Tokens per second and batch size")
    top_legend(fig, 3)
    fig.update_xaxes(title_text=TIME_AXIS, rangemode="tozero")
    fig.update_yaxes(title_text="output tokens/s", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="batch size (requests)", secondary_y=True, showgrid=False,
                     range=[0, run.config.max_batch + 0.5], dtick=max(1, run.config.max_batch // 8))
    return fig


def _grouped(fig: go.Figure, runs: dict[str, ServingRun], colors: dict[str, str],
             panels: list[tuple[str, list[tuple[str, str]]]]) -> go.Figure:
    """Bars per panel (a metric group with one unit), one colour per run, values on the bars."""
    stats = {name: summarize_stream(run) for name, run in runs.items()}
    for name, summary in stats.items():
        for col, (_, metrics) in enumerate(panels, start=1):
            ys = [getattr(summary, field) for field, _ in metrics]
            fig.add_trace(go.Bar(x=[label for _, label in metrics], y=ys, name=name,
                                 legendgroup=name, showlegend=col == 1,
                                 marker_color=colors[name],
                                 text=[f"{y:,.0f}" if y is not None else "–" for y in ys],
                                 textposition="outside", cliponaxis=False,
                                 hovertemplate=f"{name}<br>%{{x}}: %{{y:,.1f}}<extra></extra>"),
                          row=1, col=col)
    for col, (unit, _) in enumerate(panels, start=1):
        fig.update_yaxes(title_text=unit, rangemode="tozero", row=1, col=col)
    fig.update_layout(height=380, barmode="group", margin={"l": 10, "r": 10, "b": 10})
    top_legend(fig, len(runs))
    return fig


def batching_chart(static: ServingRun, continuous: ServingRun) -> go.Figure:
    """Static vs continuous batching on one stream: throughput, TTFT and ITL p50/p90."""
    panels = [("output tokens/s", [("throughput_tok_s", "throughput")]),
              ("time to first token (ms)", [("ttft_p50", "TTFT p50"), ("ttft_p90", "TTFT p90")]),
              ("inter-token latency (ms)", [("itl_p50", "ITL p50"), ("itl_p90", "ITL p90")])]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09)
    _grouped(fig, {"static": static, "continuous": continuous}, SCHEDULER_COLORS, panels)
    fig.update_layout(title_text="Static vs continuous batching, same stream")
    return fig


def per_request_chart(runs: dict[str, ServingRun], colors: dict[str, str]) -> go.Figure:
    """Each request's TTFT and end-to-end latency under each run (markers: TTFT, bars: e2e)."""
    fig = go.Figure()
    for name, run in runs.items():
        done = [r for r in run.requests if r.token_ms]
        fig.add_trace(go.Bar(x=[f"request {r.id}" for r in done], y=[r.e2e_ms for r in done],
                             name=f"{name}: end to end", marker_color=colors[name], opacity=0.45,
                             hovertemplate=f"{name} · %{{x}}<br>end to end %{{y:,.0f}} ms"
                                           "<extra></extra>"))
        fig.add_trace(go.Scatter(x=[f"request {r.id}" for r in done], y=[r.ttft_ms for r in done],
                                 mode="markers", name=f"{name}: TTFT",
                                 marker={"color": colors[name], "size": 10, "symbol": "diamond"},
                                 hovertemplate=f"{name} · %{{x}}<br>TTFT %{{y:,.0f}} ms"
                                               "<extra></extra>"))
    fig.update_layout(height=360, barmode="group", margin={"l": 10, "r": 10, "b": 10},
                      title_text="Per request: time to first token and end to end")
    top_legend(fig, len(fig.data))
    fig.update_yaxes(title_text="latency since arrival (ms)", rangemode="tozero")
    fig.update_xaxes(title_text="request")
    return fig


def sharing_chart(off: ServingRun, on: ServingRun) -> go.Figure:
    """Prefix sharing off vs on, same stream: blocks at the peak, prompt tokens computed and the
    prefill steps' time."""
    panels = [("blocks (peak in use)", [("peak_blocks", "peak blocks")]),
              ("prompt tokens", [("prompt_tokens", "in the prompts"),
                                 ("computed_prompt_tokens", "computed by prefill")]),
              ("prefill steps' time (ms)", [("prefill_ms", "prefill ms")])]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09)
    _grouped(fig, {"sharing off": off, "sharing on": on},
             {"sharing off": SHARING_COLORS["off"], "sharing on": SHARING_COLORS["on"]}, panels)
    fig.update_layout(title_text="Prefix sharing off vs on, same stream")
    return fig


def drafted_chips_html(pieces: list[str], drafted: list[bool]) -> str:
    """The output tokens as chips; those that came from an accepted draft are highlighted."""
    parts = []
    for i, (piece, from_draft) in enumerate(zip(pieces, drafted)):
        title = f"output token {i} · " + ("accepted from the draft" if from_draft
                                           else "computed by the model (no accepted draft)")
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
        fig.add_trace(go.Bar(x=labels, y=ys, name=name, marker_color=SPECULATION_COLORS[name],
                             text=[f"{y:,.1f}" for y in ys], textposition="outside",
                             cliponaxis=False,
                             hovertemplate=f"{name}<br>%{{x}}: %{{y:,.1f}} tokens/s<extra></extra>"))
    top = max((max(r[1], r[2]) for r in rows), default=1.0)
    for label, _, _, accept, speedup in rows:
        fig.add_annotation(x=label, y=top * 1.22, showarrow=False,
                           text=f"{speedup:.2f}× · {accept:.0%} of drafts accepted")
    fig.update_layout(height=360, barmode="group", margin={"l": 10, "r": 10, "b": 10},
                      title_text="Speculative decoding vs plain greedy, measured")
    top_legend(fig, 2)
    fig.update_yaxes(title_text="output tokens/s", range=[0, top * 1.35])
    fig.update_xaxes(title_text="prompt")
    return fig
