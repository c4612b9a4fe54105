"""Figures of the What if page: the branch tree, each token's probability in two runs, the
head-ablation sweep and the activation-patching grid.

Pure functions of engine records (no Streamlit, no model). Colours: the two runs of a pair blue
(first) and orange (second) as on Compare runs; the sweep's KL one sequential scale (0 = white:
switching the head off changed nothing); the patching grid a diverging scale centred on the
corrupted run's value (red toward the clean answer, blue away from it).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from engine.records.trace import Trace
from i18n import _

from .tokens import shown_piece

A_COLOR, B_COLOR = "#1f77b4", "#e6550d"  # as run A and run B on Compare runs
TREE_WORDS = 6  # tokens of a branch's own text shown in its tree node


def node_name(index: int) -> str:
    return _("the run") if index == 0 else _("branch {index}").format(index=index)


def node_label(tree: Sequence[Trace], index: int) -> str:
    """'branch 2 · at 3: ·Paris → ·Lyon' (the run: its first tokens)."""
    trace = tree[index]
    if trace.branch is None:
        words = "".join(shown_piece(s.piece) for s in trace.steps[:TREE_WORDS])
        return _("the run · {words}…").format(words=words)
    b = trace.branch
    before = shown_piece(_piece_of(trace, b.parent_tokens[b.at]))
    return _("{name} · at {at}: “{before}” → “{after}”").format(
        name=node_name(index), at=b.at, before=before, after=shown_piece(trace.steps[b.at].piece))


def _piece_of(trace: Trace, token: int) -> str:
    """The parent's piece at the branch point: the branch point step lists it among its top-k
    when the parent chose it there (a sampled choice outside the top-k: its id)."""
    step = trace.steps[trace.branch.at] if trace.branch is not None else None
    if step is not None:
        for i, p in zip(step.top_ids.tolist(), step.top_pieces):
            if i == token:
                return p
    return f"#{token}"


def tree_dot(tree: Sequence[Trace], parents: Sequence[int], selected: Sequence[int] = (),
             font: int = 14) -> str:
    """The branch tree as Graphviz DOT, left to right: one box per run (its label and the text
    after its branch point), one arrow per branch from the run it branched; `selected` boxes
    drawn bold; `font` in points (a projector's: larger; assets/style.css and present.css set
    the same sizes, which win over the SVG's own)."""
    lines = ['digraph branches {', 'rankdir=LR; bgcolor="transparent";',
             'node [shape=box, style="rounded,filled", fillcolor="#fff1dc", color="#f1c98a", '
             f'fontname="sans-serif", fontsize={font}];',
             f'edge [color="#888888", fontsize={font - 2}];']
    for i, trace in enumerate(tree):
        at = trace.branch.at if trace.branch is not None else 0
        tail = "".join(shown_piece(s.piece) for s in trace.steps[at:at + TREE_WORDS])
        label = node_label(tree, i)
        text = label if i == 0 else f"{label}\n{tail}…"
        extra = ', penwidth=3, color="#d62728"' if i in selected else ""
        lines.append(f'n{i} [label="{_dot(text)}"{extra}];')
    for i, parent in enumerate(parents):
        if parent >= 0:
            edge = _dot(_("token {at}").format(at=tree[i].branch.at))
            lines.append(f'n{parent} -> n{i} [label="{edge}"];')
    lines.append("}")
    return "\n".join(lines)


def _dot(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def probability_chart(a: Trace, b: Trace, names: tuple[str, str]) -> go.Figure:
    """Each generated token's probability (the model's, for the token chosen) in both runs, one
    line each, the first difference marked."""
    fig = go.Figure()
    for trace, name, color in ((a, names[0], A_COLOR), (b, names[1], B_COLOR)):
        fig.add_trace(go.Scatter(
            x=[s.index for s in trace.steps], y=[s.chosen_prob for s in trace.steps], name=name,
            mode="lines+markers", line={"color": color, "width": 3},
            customdata=[shown_piece(s.piece) for s in trace.steps],
            hovertemplate=_("{name} · token %{x} “%{customdata}”: p = %{y:.3f}<extra></extra>")
            .replace("{name}", html.escape(name))))
    first = next((i for i, (x, y) in enumerate(zip(a.output_token_ids, b.output_token_ids))
                  if x != y), None)
    if first is not None:
        fig.add_vline(x=first, line={"color": "#d62728", "dash": "dash", "width": 2},
                      annotation_text=_("first difference"), annotation_position="top right")
    fig.update_layout(height=320, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      legend={"orientation": "h", "y": 1.02, "x": 0, "yanchor": "bottom"})
    fig.update_xaxes(title_text=_("generated token (0 = the first)"), rangemode="tozero")
    fig.update_yaxes(title_text=_("probability"), range=[0, 1.05])
    return fig


def sweep_heatmap(kl: np.ndarray) -> go.Figure:
    """(L, H) KL(baseline ‖ head h of layer l off) in nats, layer on y (0 at the top), head on
    x; rows not swept are blank."""
    if kl.ndim != 2:
        raise ValueError(f"the sweep is (layers, heads), got shape {kl.shape}")
    layers, heads = kl.shape
    finite = kl[np.isfinite(kl)]
    fig = go.Figure(go.Heatmap(
        z=kl, x=list(range(heads)), y=list(range(layers)), colorscale="Reds", zmin=0,
        zmax=float(finite.max()) if finite.size and finite.max() > 0 else 1.0, hoverongaps=False,
        colorbar={"title": {"text": _("KL (nats)")}},
        hovertemplate=_("layer %{y}, head %{x} off: KL %{z:.4g} nats<extra></extra>")))
    fig.update_layout(height=max(300, min(760, 22 * layers + 120)),
                      margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      title=_("How much the next token's distribution moves with each head off"))
    fig.update_xaxes(title_text=_("head"), dtick=1 if heads <= 16 else 3, showgrid=False)
    fig.update_yaxes(title_text=_("layer"), autorange="reversed", showgrid=False,
                     dtick=1 if layers <= 16 else 5)
    return fig


def patch_heatmap(grid: np.ndarray, labels: Sequence[str], normalized: bool,
                  center: float = 0.0) -> go.Figure:
    """(L, S) patching results, layer on y (0 = the embedding output, at the top), the prompt's
    positions on x with their tokens; `normalized`: 0 = as the corrupted run, 1 = as the clean
    one; otherwise logit(clean) − logit(corrupt) around `center` (the corrupted run's)."""
    if grid.ndim != 2 or grid.shape[1] != len(labels):
        raise ValueError(f"{len(labels)} labels for a grid of shape {grid.shape}")
    finite = grid[np.isfinite(grid)]
    span = float(np.abs(finite - center).max()) if finite.size else 1.0
    span = span or 1.0
    hover = (_("layer %{y}, position %{x} (%{customdata}): recovered %{z:.3f}<extra></extra>")
             if normalized else
             _("layer %{y}, position %{x} (%{customdata}): logit difference %{z:.3f} (logits)"
               "<extra></extra>"))
    fig = go.Figure(go.Heatmap(
        z=grid, x=list(range(len(labels))), y=list(range(grid.shape[0])), colorscale="RdBu_r",
        zmid=center, zmin=center - span, zmax=center + span, hoverongaps=False,
        customdata=np.broadcast_to(np.asarray(labels, dtype=object), grid.shape),
        colorbar={"title": {"text": (_("0 = corrupt<br>1 = clean") if normalized
                                     else _("logit(clean)<br>− logit(corrupt)"))}},
        hovertemplate=hover))
    fig.update_layout(height=max(360, min(820, 20 * grid.shape[0] + 160)),
                      margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      title=(_("Share of the clean answer's lead restored") if normalized else
                             _("logit(clean answer) − logit(corrupt answer), one patch per cell")))
    fig.update_xaxes(title_text=_("prompt position patched"), tickmode="array",
                     tickvals=list(range(len(labels))), ticktext=list(labels), tickangle=-45,
                     showgrid=False)
    fig.update_yaxes(title_text=_("layer whose input is patched"), autorange="reversed",
                     showgrid=False, dtick=5 if grid.shape[0] > 16 else 1)
    return fig
