"""Attention: every layer, every head, every decode step — the recorded weights, to the digit.

`page()` at the bottom reads like the page's table of contents: the layer and head selectors, then
one function per tab, each taking (trace, lm, focus).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
import streamlit as st

from charts.attention import (
    clicked_tile,
    decode_frame_steps,
    decode_steps_chart,
    downsample,
    head_view,
    heatmap,
    keys_per_head,
    mark_tile,
    model_view,
    sequence_labels,
    sequence_names,
)
from engine import Trace
from engine.lens.attention_stats import full_attention, gqa_groups, has_attention, head_roles, head_summary
from engine.lens.inspect_head import HeadInputs, capture_qkv, explain_head
from engine.loader import LoadedModel
from i18n import N_, _, language
from ui.common import require_trace, show_chart
from ui.config import config
from ui.experiment import run_experiment
from ui.keys import HEAD, LAYER, MODEL_VIEW
from ui.memo import memo
from ui.state import loaded_model
from ui.tables import show_table

LIMIT = 96  # heatmap cells per side before blocks are averaged (keeps the browser payload small)
TILE = 12  # model view: each head's prefill map as at most TILE × TILE block means
FRAME_MS = 300  # Play: one decode step per 0.3 s (at most MAX_FRAMES of them, so ≤ 30 s)
ROWS = {"prompt (prefill)": N_("prompt (prefill)"),  # the heatmap's rows: values stay English
        "prompt + generated (decode rows)": N_("prompt + generated (decode rows)")}
# engine/lens/attention_stats.head_roles's labels, translated where the table shows them
ROLES = (N_("mixed"), N_("self"), N_("previous-token"), N_("sink (first token)"))


@dataclass(frozen=True, slots=True)
class Focus:
    """What the selectors above the tabs chose; every tab reads it."""

    layer: int
    head: int
    weights: np.ndarray  # (H, S, S): this layer's prefill and decode rows (full_attention)
    labels: list[str]  # S position labels, "i:piece", for figures and widgets (charts/text.py)
    names: list[str]  # the same as plain text, for a table's cells


def selectors(trace: Trace) -> Focus:
    spec = trace.model
    c1, c2 = st.columns(2)
    layer = c1.selectbox(_("Layer"), trace.attention_layers, key=LAYER)
    head = c2.selectbox(_("Head"), range(spec.heads), key=HEAD)
    if len(trace.attention_layers) < spec.layers:
        st.caption(_("Recorded layers: {recorded} of {layers} — evenly spaced, to keep a long "
                     "prompt's attention within {budget} MB.").format(
            recorded=", ".join(map(str, trace.attention_layers)), layers=spec.layers,
            budget=trace.settings.attention_budget_mb))
    return Focus(layer, head, full_attention(trace, layer), sequence_labels(trace),
                 sequence_names(trace))


def heatmap_tab(trace: Trace, lm: LoadedModel | None, focus: Focus) -> None:
    t = len(trace.prompt_token_ids)
    rows = st.radio(_("Rows"), list(ROWS), horizontal=True, format_func=lambda r: _(ROWS[r]),
                    key="attn_rows")
    size = t if rows.startswith("prompt (") else len(focus.labels)
    matrix, names, block = downsample(focus.weights[focus.head, :size, :size], focus.labels[:size], LIMIT)
    if block > 1:
        st.caption(_("Aggregated view: {size} tokens shown as {block}×{block}-token blocks (mean "
                     "weight per block).").format(size=size, block=block))
    show_chart(heatmap(matrix, names, _("layer {layer}, head {head}").format(
        layer=focus.layer, head=focus.head)))
    st.caption(_("Each row is one query token's attention: it sums to 1 over the keys up to "
                 "itself. Grey cells are future tokens, masked out by causal attention."))


def head_view_tab(trace: Trace, lm: LoadedModel | None, focus: Focus) -> None:
    s, heads = len(focus.labels), focus.weights.shape[0]
    query = st.select_slider(_("Query token"), range(s), value=s - 1,
                             format_func=lambda i: focus.labels[i], key=f"attn_query_{s}")
    # keyed by the head chosen above: choosing another head (or a model-view tile) starts the view
    # on that head, as a new widget (its label changes with the language: a key keeps its value)
    shown = st.multiselect(_("Heads"), range(heads), default=[focus.head],
                           help=_("The head chosen above; add others to compare them."),
                           key=f"attn_heads_{focus.head}_{heads}")
    if not shown:
        st.info(_("Pick at least one head."))
        return
    show_chart(head_view(focus.weights, focus.labels, shown, query),
               name=f"head view layer {focus.layer} query {query}")
    st.caption(_("Each head's {keys} strongest keys for this query, listed in sequence order. Line "
                 "width and opacity follow each weight relative to that head's strongest key, so a "
                 "diffuse head reads as well as a sharp one; hover a line for the weight itself.")
               .format(keys=keys_per_head(len(shown))))


def open_clicked_tile(trace: Trace) -> None:
    """The model view's on_select: a click on a tile selects that layer and head above."""
    tile = clicked_tile(st.session_state[MODEL_VIEW].selection.points)
    if tile is None:
        return
    layer, head = tile
    if layer in trace.attention_layers and 0 <= head < trace.model.heads:  # the client's word only
        st.session_state[LAYER], st.session_state[HEAD] = layer, head


def model_view_tab(trace: Trace, lm: LoadedModel | None, focus: Focus) -> None:
    spec = trace.model
    # model view and head summary: heavy on a long prompt, so once per trace, not per rerun
    fig = memo("model_view", (trace, TILE, language()),  # its words are the language's
               lambda: model_view(trace.steps[0].attention, trace.attention_layers, TILE))
    st.caption(_("Prefill attention of all {layers} layers × {heads} heads, each downsampled to at "
                 "most {tile}×{tile}. Click a tile to open that layer and head in the other tabs, "
                 "the head view among them (now: layer {layer}, head {head}, outlined in red).")
               .format(layers=len(trace.attention_layers), heads=spec.heads, tile=TILE,
                       layer=focus.layer, head=focus.head))
    show_chart(mark_tile(fig, focus.layer, focus.head), key=MODEL_VIEW,
               on_select=partial(open_clicked_tile, trace), selection_mode="points", name="model view")
    summary = memo("head_summary", (trace,), lambda: head_summary(trace))
    roles = head_roles(summary)
    table = pd.DataFrame([{
        _("layer"): layer, _("head"): h, _("entropy (nats)"): summary["entropy"][li, h],
        _("on first token"): summary["first"][li, h],
        _("on previous token"): summary["previous"][li, h],
        _("on itself"): summary["self"][li, h], _("looks like"): _(roles[li, h])}
        for li, layer in enumerate(trace.attention_layers) for h in range(spec.heads)])
    show_table(table.round(3), hide_index=True, width="stretch", height=320)
    st.caption(_("Averages over the prompt's query rows. A head that puts most weight on the first "
                 "token is an attention sink; on the previous token, a previous-token head."))


def decode_steps_tab(trace: Trace, lm: LoadedModel | None, focus: Focus) -> None:
    steps = len(trace.steps) - 1
    if steps < 1:
        st.info(_("This trace has no decode steps yet: generate more than one token."))
        return
    t = len(trace.prompt_token_ids)
    # every step's frame is built once per trace and layer: the browser plays them, no reruns
    fig = memo("decode_chart", (trace, focus.layer, language()), lambda: decode_steps_chart(
        focus.weights, focus.labels, t, [s.piece for s in trace.steps[1:]], FRAME_MS))
    show_chart(fig, key="attn_decode_chart", name=f"decode steps layer {focus.layer}")
    shown = decode_frame_steps(steps, *focus.weights.shape[:2])
    if len(shown) < steps:
        st.caption(_("A long trace: the animation holds {shown} of its {steps} steps (one in "
                     "{stride}, and the last).").format(shown=len(shown), steps=steps,
                                                       stride=shown[1] - shown[0]))
    st.caption(_("▶ Play runs every decode step in your browser; the slider picks one. At each step "
                 "the newest token's query attends over the whole KV cache — the prompt and every "
                 "token generated before it. The colour scale is this layer's, the same for every "
                 "step."))


def gqa_tab(trace: Trace, lm: LoadedModel | None, focus: Focus) -> None:
    spec = trace.model
    groups = gqa_groups(spec.heads, spec.kv_heads)
    st.table(pd.DataFrame({_("KV head"): range(spec.kv_heads),
                           _("query heads that read it"): [", ".join(map(str, g)) for g in groups]}))
    mha = 2 * spec.layers * spec.heads * spec.head_dim * spec.dtype_bytes
    st.markdown(_(
        "**{heads} query heads share {kv_heads} KV heads** ({per_group} per group). KV cache per "
        "token = 2 · {layers} layers · {kv_heads} KV heads · {head_dim} head_dim · {dtype_bytes} "
        "bytes = **{per_token} B**; with one KV head per query head (multi-head) it would be "
        "{mha} B — {times}× more.").format(
        heads=spec.heads, kv_heads=spec.kv_heads, per_group=spec.query_groups, layers=spec.layers,
        head_dim=spec.head_dim, dtype_bytes=spec.dtype_bytes,
        per_token=f"{spec.kv_bytes_per_token:,}", mha=f"{mha:,}",
        times=f"{mha / spec.kv_bytes_per_token:.0f}"))


def one_head_tab(trace: Trace, lm: LoadedModel | None, focus: Focus) -> None:
    spec = trace.model
    if lm is None or lm.spec.name != spec.name or lm.spec.layers != spec.layers:
        st.info(_("This view reruns the model to read its q, k and v: load the model that made "
                  "this trace (see the sidebar)."))
        return
    layer, head, labels = focus.layer, focus.head, focus.labels
    ids = list(trace.prompt_token_ids) + [s.token_id for s in trace.steps[:-1]]
    pos = st.select_slider(_("Token"), range(len(ids)), value=len(ids) - 1,
                           format_func=lambda i: labels[i], key="attn_pos")

    def forward() -> HeadInputs | None:
        return run_experiment(lambda job: capture_qkv(lm, ids, layer, config().limits.sequence_tokens),
                              spinner=_("Running the model to read layer {layer}'s q, k and v…")
                              .format(layer=layer))

    inputs = memo("qkv", (trace, lm.model, layer), forward)  # one forward per trace and layer
    if inputs is None:  # the reason is shown
        return
    steps = explain_head(inputs, head, pos)
    d = inputs.query.shape[-1]
    st.markdown(_("Scale = 1/√head_dim = 1/√{d} = **{scale}** — the per-head dimension, not the "
                  "hidden size ({hidden}), a common mistake.").format(
        d=d, scale=f"{inputs.scaling:.4f}", hidden=spec.hidden_size))
    st.caption(_("q (query head {head}, first 8 of {d} values): {values}").format(
        head=head, d=d, values=", ".join(f"{v:.3f}" for v in inputs.query[head, pos, :8])))
    show_table(pd.DataFrame({
        _("key token"): focus.names[: pos + 1], "q·k": steps.scores, _("× scale"): steps.scaled,
        _("softmax (recomputed)"): steps.weights,
        _("recorded weight"): focus.weights[head, pos, : pos + 1]}).round(5), width="stretch")
    st.caption(_("Output = Σ weight · v (first 8 values): {values}").format(
        values=", ".join(f"{v:.3f}" for v in steps.output[:8])))


TABS: dict[str, Callable[[Trace, LoadedModel | None, Focus], None]] = {  # names: `_` where shown
    N_("Heatmap"): heatmap_tab,
    N_("Head view"): head_view_tab,
    N_("Model view"): model_view_tab,
    N_("Decode steps"): decode_steps_tab,
    N_("Grouped-query attention"): gqa_tab,
    N_("One head, step by step"): one_head_tab,
}


def page() -> None:
    st.title(_("Attention"))
    trace = require_trace()
    if not has_attention(trace):
        st.info(_("This trace was recorded without attention. Switch on “Record attention” in the "
                  "sidebar and Generate again."))
        return
    lm = loaded_model()
    focus = selectors(trace)
    for tab, draw in zip(st.tabs([_(name) for name in TABS]), TABS.values()):
        with tab:
            draw(trace, lm, focus)


page()
