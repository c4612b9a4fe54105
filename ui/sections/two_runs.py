"""Two runs side by side: their tokens with the first difference marked, and one attention head
of both on one colour scale — the Compare runs page's sections, and the What if page's for two
branches."""

from __future__ import annotations

import streamlit as st

from charts.attention import downsample, sequence_labels
from charts.compare import answer_chips_html, heatmap_pair, prompt_chips_html
from charts.tokens import piece_text, visible
from engine import Trace
from engine.lens.attention_stats import full_attention
from engine.lens.compare import attention_pair, largest_difference, same_input_rows, token_diff
from ui.common import show_chart
from ui.memo import memo
from ui.text import plain

LIMIT = 96  # heatmap cells per side before blocks are averaged (as on the Attention page)


def _piece(trace: Trace, index: int) -> str:
    if index >= len(trace.steps):
        return "nothing (the run had ended)"
    step = trace.steps[index]
    return f"“{visible(piece_text(step.piece))}” (p = {step.chosen_prob:.3f})"


def tokens_section(a: Trace, b: Trace, names: tuple[str, str] = ("run A", "run B"),
                   title: str = "Tokens") -> None:
    """Both runs' answer tokens, the first difference outlined in red, and their prompts."""
    st.subheader(title)
    diff = token_diff(a, b)
    if diff.answer is None:
        st.success(f"Identical answers: the same {diff.answer_lengths[0]} tokens, in the same "
                   "order.", icon=":material/check_circle:")
        if a.settings.kv_cache != b.settings.kv_cache and a.settings.greedy and b.settings.greedy:
            st.caption("As it must be: the KV cache only saves recomputing the keys and values "
                       "of earlier tokens; greedy decoding then picks the same token either way.")
    else:
        i = diff.answer
        before = (f"The first {i} tokens are the same." if i else "They differ from the first "
                  "token on.")
        st.warning(f"The answers first differ at answer token {i} (outlined in red below): "
                   f"{names[0]} produced {plain(_piece(a, i))}, {names[1]} "
                   f"{plain(_piece(b, i))}. {before}",
                   icon=":material/difference:")
    for name, trace in zip(names, (a, b)):
        st.markdown(f"**{name[:1].upper()}{name[1:]}** · {len(trace.steps)} answer tokens, ended: "
                    f"{trace.stop_reason}")
        st.markdown(answer_chips_html(trace, diff.answer), unsafe_allow_html=True)
    same = diff.prompt is None
    with st.expander(f"Prompt tokens: {'the same' if same else 'different'} "
                     f"({diff.prompt_lengths[0]} and {diff.prompt_lengths[1]} tokens)",
                     expanded=not same):
        if not same:
            st.caption(f"First difference at prompt token {diff.prompt} (outlined in red).")
        for name, trace in zip(names, (a, b)):
            st.markdown(f"**{name[:1].upper()}{name[1:]}**")
            st.markdown(prompt_chips_html(trace, diff.prompt), unsafe_allow_html=True)



def attention_section(a: Trace, b: Trace, names: tuple[str, str] = ("run A", "run B"),
                      prefix: str = "compare", rows: int = 0) -> None:
    """One layer and head of both runs, on one colour scale; `prefix` names the widgets, `rows`
    the rows shown first (0: the prompt's, 1: prompt + generated)."""
    st.subheader("The same attention head in both")
    pair = attention_pair(a, b)
    if not pair.available:
        st.info(pair.note)
        return
    c1, c2, c3 = st.columns([1, 1, 2])
    for key, options in ((f"{prefix}_layer", pair.layers), (f"{prefix}_head", range(pair.heads))):
        if st.session_state.get(key) not in options:
            st.session_state.pop(key, None)
    layer = c1.selectbox("Layer", pair.layers, key=f"{prefix}_layer")
    head = c2.selectbox("Head", range(pair.heads), key=f"{prefix}_head")
    rows = c3.radio("Rows", ["prompt (prefill)", "prompt + generated (decode rows)"],
                    horizontal=True, key=f"{prefix}_rows", index=rows)
    if pair.note:
        st.caption(pair.note)
    shown = []
    for name, trace in zip("AB", (a, b)):
        weights = memo(f"{prefix}_attn_{name}", (trace, layer), lambda t=trace: full_attention(t, layer))
        labels = sequence_labels(trace)
        n = len(trace.prompt_token_ids) if rows.startswith("prompt (") else len(labels)
        shown.append((weights[head, :n, :n], labels[:n]))
    (wa, la), (wb, lb) = shown
    (ma, na, block_a), (mb, nb, block_b) = downsample(wa, la, LIMIT), downsample(wb, lb, LIMIT)
    figs = heatmap_pair(ma, na, mb, nb, f"{names[0]} · layer {layer}, head {head}",
                        f"{names[1]} · layer {layer}, head {head}")
    for col, fig, name in zip(st.columns(2), figs, "AB"):
        with col:
            show_chart(fig, key=f"{prefix}_heatmap_{name}")
    if max(block_a, block_b) > 1:
        st.caption(f"Long runs are shown as blocks of up to {max(block_a, block_b)}×"
                   f"{max(block_a, block_b)} tokens (mean weight per block).")
    same = min(same_input_rows(a, b), wa.shape[0], wb.shape[0])
    largest = largest_difference(wa[:same, :same], wb[:same, :same]) if same else None
    if largest is None:
        st.caption("The two runs read different tokens from the first position on: compare the "
                   "maps' patterns, not cell by cell. One colour scale for both.")
    else:
        st.caption(f"Over the first {same} positions, where both runs read the same tokens, the "
                   f"largest difference in any weight is max |B − A| = {largest:.2g} (weights are "
                   "recorded in float16, about 3 significant digits). One colour scale for both.")
