"""Attention: every layer, every head, every decode step — the recorded weights, to the digit."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from charts.attention import (decode_row_chart, downsample, full_attention, gqa_groups, has_attention,
                              head_roles, head_summary, head_view, heatmap, model_view,
                              sequence_labels)
from engine.inspect_head import HeadInputs, capture_qkv, explain_head
from engine import EngineError
from pages.common import memo, model_turn, require_trace
from pages.state import config, loaded_model, message

LIMIT = 96  # heatmap cells per side before blocks are averaged (keeps the browser payload small)
TILE = 12
PLAY_S = 30  # "Play all steps" sleeps at most this long in all

st.title("Attention")
trace = require_trace()
if not has_attention(trace):
    st.info("This trace was recorded without attention. Switch on “Record attention” in the "
            "sidebar and Generate again.")
    st.stop()

spec = trace.model
labels = sequence_labels(trace)
c1, c2 = st.columns(2)
layer = c1.selectbox("Layer", trace.attention_layers, key="attn_layer")
head = c2.selectbox("Head", range(spec.heads), key="attn_head")
if len(trace.attention_layers) < spec.layers:
    st.caption(f"Recorded layers: {', '.join(map(str, trace.attention_layers))} of {spec.layers} — "
               f"evenly spaced, to keep a long prompt's attention within "
               f"{trace.settings.attention_budget_mb} MB.")
full = full_attention(trace, layer)  # (H, S, S)
fmt = st.segmented_control("Chart download format (camera icon in each chart's toolbar)",
                           ["png", "svg"], default="png", key="attn_format") or "png"
export = {"toImageButtonOptions": {"format": fmt, "filename": f"attention-L{layer}-H{head}"}}
t = len(trace.prompt_token_ids)
tabs = st.tabs(["Heatmap", "Head view", "Model view", "Decode steps", "Grouped-query attention",
                "One head, step by step"])

with tabs[0]:
    rows = st.radio("Rows", ["prompt (prefill)", "prompt + generated (decode rows)"],
                    horizontal=True)
    size = t if rows.startswith("prompt (") else full.shape[-1]
    matrix, names, block = downsample(full[head, :size, :size], labels[:size], LIMIT)
    if block > 1:
        st.caption(f"Aggregated view: {size} tokens shown as {block}×{block}-token blocks "
                   "(mean weight per block).")
    st.plotly_chart(heatmap(matrix, names, f"layer {layer}, head {head}"), width="stretch",
                    config=export)
    st.caption("Each row is one query token's attention: it sums to 1 over the keys up to itself. "
               "Grey cells are future tokens, masked out by causal attention.")

with tabs[1]:
    query = st.select_slider("Query token", range(full.shape[-1]), value=full.shape[-1] - 1,
                             format_func=lambda i: labels[i])
    shown = st.multiselect("Heads", range(spec.heads), default=list(range(min(3, spec.heads))))
    st.plotly_chart(head_view(trace, layer, shown, query), width="stretch", config=export)
    st.caption("Line width and opacity follow the weight; the 24 strongest keys per head are drawn.")


def open_clicked_tile() -> None:
    points = st.session_state["model_view"].selection.points
    if points:
        step = min(TILE, t) + 1
        st.session_state["attn_layer"] = trace.attention_layers[int(points[0]["x"]) // step]
        st.session_state["attn_head"] = int(points[0]["y"]) // step


with tabs[2]:
    # model view and head summary: ~1 s together at 450 tokens, so once per trace, not per rerun
    fig, _ = memo("model_view_memo", (trace, TILE), lambda: model_view(trace, TILE))
    st.caption(f"Prefill attention of all {len(trace.attention_layers)} layers × {spec.heads} "
               f"heads, each downsampled to at most {TILE}×{TILE}. Click a tile to open it.")
    st.plotly_chart(fig, width="stretch", key="model_view", on_select=open_clicked_tile, config=export,
                    selection_mode="points")
    s = memo("head_summary_memo", (trace,), lambda: head_summary(trace))
    roles = head_roles(s)
    table = pd.DataFrame([{
        "layer": trace.attention_layers[li], "head": h, "entropy (nats)": s["entropy"][li, h],
        "on first token": s["first"][li, h], "on previous token": s["previous"][li, h],
        "on itself": s["self"][li, h], "looks like": roles[li, h]}
        for li in range(len(trace.attention_layers)) for h in range(spec.heads)])
    st.dataframe(table.round(3), hide_index=True, width="stretch", height=320)
    st.caption("Averages over the prompt's query rows. A head that puts most weight on the first "
               "token is an attention sink; on the previous token, a previous-token head.")

with tabs[3]:
    if len(trace.steps) < 2:
        st.info("This trace has no decode steps yet: generate more than one token.")
    else:
        k = 1 if len(trace.steps) == 2 else st.slider("Decode step", 1, len(trace.steps) - 1,
                                                      key="attn_step")
        play = st.button("Play all steps", icon=":material/play_arrow:")
        slot = st.empty()
        steps = range(k, len(trace.steps)) if play else [k]
        pause = min(0.3, PLAY_S / max(len(steps), 1))  # a long trace plays faster, never > PLAY_S
        for i in steps:
            slot.plotly_chart(decode_row_chart(trace, i, layer), width="stretch", key=f"dec-{i}",
                              config=export)
            if play:
                time.sleep(pause)
        st.caption("At each decode step the newest token's query attends over the whole KV "
                   "cache — the prompt and every token generated before it.")

with tabs[4]:
    groups = gqa_groups(spec.heads, spec.kv_heads)
    st.table(pd.DataFrame({"KV head": range(spec.kv_heads),
                           "query heads that read it": [", ".join(map(str, g)) for g in groups]}))
    mha = 2 * spec.layers * spec.heads * spec.head_dim * spec.dtype_bytes
    st.markdown(
        f"**{spec.heads} query heads share {spec.kv_heads} KV heads** ({spec.query_groups} per "
        f"group). KV cache per token = 2 · {spec.layers} layers · {spec.kv_heads} KV heads · "
        f"{spec.head_dim} head_dim · {spec.dtype_bytes} bytes = **{spec.kv_bytes_per_token:,} B**; "
        f"with one KV head per query head (multi-head) it would be {mha:,} B — "
        f"{mha / spec.kv_bytes_per_token:.0f}× more.")

with tabs[5]:
    lm = loaded_model()
    if lm is None or lm.spec.name != spec.name or lm.spec.layers != spec.layers:
        st.info("This view reruns the model to read its q, k and v: load the model that made "
                "this trace (see the sidebar).")
    else:
        ids = list(trace.prompt_token_ids) + [s.token_id for s in trace.steps[:-1]]
        pos = st.select_slider("Token", range(len(ids)), value=len(ids) - 1,
                               format_func=lambda i: labels[i], key="attn_pos")
        def forward() -> HeadInputs:
            with model_turn():
                return capture_qkv(lm, ids, layer, config().limits.sequence_tokens)

        try:  # one forward per trace and layer
            inputs = memo("qkv_memo", (trace, lm.model, layer), forward)
        except EngineError as err:
            st.error(message(err))
            st.stop()
        steps = explain_head(inputs, head, pos)
        d = inputs.query.shape[-1]
        st.markdown(f"Scale = 1/√head_dim = 1/√{d} = **{inputs.scaling:.4f}** — the per-head "
                    f"dimension, not the hidden size ({spec.hidden_size}), a common mistake.")
        st.caption(f"q (query head {head}, first 8 of {d} values): "
                   + ", ".join(f"{v:.3f}" for v in inputs.query[head, pos, :8]))
        st.dataframe(pd.DataFrame({
            "key token": labels[: pos + 1], "q·k": steps.scores, "× scale": steps.scaled,
            "softmax (recomputed)": steps.weights,
            "recorded weight": full[head, pos, : pos + 1]}).round(5), width="stretch")
        st.caption("Output = Σ weight · v (first 8 values): "
                   + ", ".join(f"{v:.3f}" for v in steps.output[:8]))
