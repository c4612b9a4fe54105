"""Two runs side by side: their tokens with the first difference marked, and one attention head
of both on one colour scale — the Compare runs page's sections, and the What if page's for two
branches."""

from __future__ import annotations

import streamlit as st

from charts.attention import downsample, sequence_labels
from charts.compare import answer_chips_html, heatmap_pair, prompt_chips_html
from charts.formatting import stop_reason
from charts.tokens import piece_text, visible
from engine import Trace
from engine.lens.attention_stats import full_attention
from engine.lens.compare import attention_pair, largest_difference, same_input_rows, token_diff
from i18n import N_, _
from ui.common import show_chart
from ui.memo import memo
from ui.text import plain

LIMIT = 96  # heatmap cells per side before blocks are averaged (as on the Attention page)
ROWS = {"prompt (prefill)": N_("prompt (prefill)"),  # the maps' rows: values stay English
        "prompt + generated (decode rows)": N_("prompt + generated (decode rows)")}


def _piece(trace: Trace, index: int) -> str:
    if index >= len(trace.steps):
        return _("nothing (the run had ended)")
    step = trace.steps[index]
    return _("“{piece}” (p = {p})").format(piece=visible(piece_text(step.piece)),
                                           p=f"{step.chosen_prob:.3f}")


def tokens_section(a: Trace, b: Trace, names: tuple[str, str] | None = None,
                   title: str | None = None) -> None:
    """Both runs' answer tokens, the first difference outlined in red, and their prompts
    (`names`: the runs' names, "run A" and "run B" unless given; `title`: "Tokens")."""
    names = names or (_("run A"), _("run B"))
    st.subheader(title or _("Tokens"))
    diff = token_diff(a, b)
    if diff.answer is None:
        st.success(_("Identical answers: the same {n} tokens, in the same order.").format(
            n=diff.answer_lengths[0]), icon=":material/check_circle:")
        if a.settings.kv_cache != b.settings.kv_cache and a.settings.greedy and b.settings.greedy:
            st.caption(_("As it must be: the KV cache only saves recomputing the keys and values "
                         "of earlier tokens; greedy decoding then picks the same token either "
                         "way."))
    else:
        i = diff.answer
        fields = {"i": i, "a": names[0], "b": names[1], "piece_a": plain(_piece(a, i)),
                  "piece_b": plain(_piece(b, i))}
        if i:
            text = _("The answers first differ at answer token {i} (outlined in red below): {a} "
                     "produced {piece_a}, {b} {piece_b}. The first {i} tokens are the same.")
        else:
            text = _("The answers first differ at answer token {i} (outlined in red below): {a} "
                     "produced {piece_a}, {b} {piece_b}. They differ from the first token on.")
        st.warning(text.format(**fields), icon=":material/difference:")
    for name, trace in zip(names, (a, b)):
        st.markdown(_("**{name}** · {n} answer tokens, ended: {reason}").format(
            name=f"{name[:1].upper()}{name[1:]}", n=len(trace.steps), reason=stop_reason(trace.stop_reason)))
        st.markdown(answer_chips_html(trace, diff.answer), unsafe_allow_html=True)
    same = diff.prompt is None
    lengths = {"a": diff.prompt_lengths[0], "b": diff.prompt_lengths[1]}
    with st.expander(_("Prompt tokens: the same ({a} and {b} tokens)").format(**lengths) if same
                     else _("Prompt tokens: different ({a} and {b} tokens)").format(**lengths),
                     expanded=not same):
        if not same:
            st.caption(_("First difference at prompt token {i} (outlined in red).").format(
                i=diff.prompt))
        for name, trace in zip(names, (a, b)):
            st.markdown(f"**{name[:1].upper()}{name[1:]}**")
            st.markdown(prompt_chips_html(trace, diff.prompt), unsafe_allow_html=True)



def attention_section(a: Trace, b: Trace, names: tuple[str, str] | None = None,
                      prefix: str = "compare", rows: int = 0) -> None:
    """One layer and head of both runs, on one colour scale; `names` as in `tokens_section`,
    `prefix` names the widgets, `rows` the rows shown first (0: the prompt's, 1: prompt +
    generated)."""
    names = names or (_("run A"), _("run B"))
    st.subheader(_("The same attention head in both"))
    pair = attention_pair(a, b)
    if not pair.available:
        st.info(pair.note)
        return
    c1, c2, c3 = st.columns([1, 1, 2])
    for key, options in ((f"{prefix}_layer", pair.layers), (f"{prefix}_head", range(pair.heads))):
        if st.session_state.get(key) not in options:
            st.session_state.pop(key, None)
    layer = c1.selectbox(_("Layer"), pair.layers, key=f"{prefix}_layer")
    head = c2.selectbox(_("Head"), range(pair.heads), key=f"{prefix}_head")
    rows = c3.radio(_("Rows"), list(ROWS), format_func=lambda r: _(ROWS[r]),
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
    figs = heatmap_pair(ma, na, mb, nb,
                        _("{name} · layer {layer}, head {head}").format(
                            name=names[0], layer=layer, head=head),
                        _("{name} · layer {layer}, head {head}").format(
                            name=names[1], layer=layer, head=head))
    for col, fig, name in zip(st.columns(2), figs, "AB"):
        with col:
            show_chart(fig, key=f"{prefix}_heatmap_{name}")
    if max(block_a, block_b) > 1:
        st.caption(_("Long runs are shown as blocks of up to {block}×{block} tokens (mean weight "
                     "per block).").format(block=max(block_a, block_b)))
    same = min(same_input_rows(a, b), wa.shape[0], wb.shape[0])
    largest = largest_difference(wa[:same, :same], wb[:same, :same]) if same else None
    if largest is None:
        st.caption(_("The two runs read different tokens from the first position on: compare "
                     "the maps' patterns, not cell by cell. One colour scale for both."))
    else:
        st.caption(_("Over the first {same} positions, where both runs read the same tokens, the "
                     "largest difference in any weight is max |B − A| = {largest} (weights are "
                     "recorded in float16, about 3 significant digits). One colour scale for "
                     "both.").format(same=same, largest=f"{largest:.2g}"))
