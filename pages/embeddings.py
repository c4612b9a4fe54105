"""Embeddings: each token id becomes a vector; similar tokens sit close; RoPE adds position."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from charts.embeddings import embedding_map, rope_angle_chart, rope_score_chart
from charts.tokens import piece_text, visible
from engine.embeddings import EmbeddingIndex
from engine.rope import angles, score_by_distance
from pages.common import memo, model_turn, no_trace_notice
from pages.state import current_trace, loaded_model, session_model


@st.cache_data(show_spinner=False)
def rope_views(theta: float, head_dim: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Angles for positions 0..256 and q·k by distance 0..512 (pure; computed once per model)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal(head_dim)
    k = q + 0.5 * rng.standard_normal(head_dim)
    distances = np.arange(0, 513)
    series = {"similar q and k": score_by_distance(q, k, theta, distances),
              "unrelated q and k": score_by_distance(q, rng.standard_normal(head_dim), theta,
                                                     distances)}
    return angles(theta, head_dim, np.arange(0, 257)), distances, series


def label(token_id: int) -> str:
    return visible(piece_text(lm.tokenizer.convert_ids_to_tokens(int(token_id))))


st.title("Embeddings")
lm = loaded_model()
trace = current_trace()
if lm is None:
    st.info("This page reads the model's embedding table: load a model in the sidebar.")
    st.stop()
spec = lm.spec
entry = session_model().entry
if "embedding_index" not in entry.extras:  # once per loaded model, for all sessions
    with st.spinner("Normalizing the embedding table…"), model_turn():
        entry.extra("embedding_index", EmbeddingIndex)
index = entry.extra("embedding_index", EmbeddingIndex)
st.caption(f"The input embedding table is {spec.vocab_size:,} × {spec.hidden_size}: one "
           f"{spec.hidden_size}-number vector per token id. Training moves tokens used alike "
           "close together; closeness here is cosine similarity.")

if trace is not None and trace.model.vocab_size == spec.vocab_size:
    ids = [i for i, special in zip(trace.prompt_token_ids, trace.prompt_special) if not special]
else:
    no_trace_notice("Your prompt's tokens will show here; meanwhile, a sample sentence:")
    ids = lm.tokenizer(" The king and the queen walked to Paris.", add_special_tokens=False).input_ids
ids = list(dict.fromkeys(ids))
st.subheader("Nearest tokens")
chosen = st.selectbox("Token (from the last prompt)" if trace else "Token", ids, format_func=label)
probe = st.text_input("…or probe any word", placeholder="e.g.  dog", max_chars=100,
                      help="Its first token is used.")
if probe:
    probe_ids = lm.tokenizer(probe, add_special_tokens=False).input_ids
    chosen = probe_ids[0] if probe_ids else chosen
near = index.neighbours(chosen, 10)
st.dataframe(pd.DataFrame({"rank": range(1, 11), "token": [label(i) for i in near.ids],
                           "id": near.ids, "cosine similarity": near.scores.round(4)}),
             hide_index=True, width="stretch")

st.subheader("A 2-D map")
if st.button("Draw the map (PCA)", icon=":material/scatter_plot:") or st.session_state.get("map_on"):
    st.session_state["map_on"] = True
    neighbour_ids = [int(i) for i in near.ids]
    def project() -> tuple:
        with model_turn():  # an SVD on the cores: not while another visitor's run is timed
            return index.pca_map(ids + neighbour_ids, background=1500)

    coords, sample, background = memo(  # one SVD per model and token choice
        "pca_memo", (index, tuple(ids + neighbour_ids)), project)
    n = len(ids)
    st.plotly_chart(embedding_map({
        "prompt token": (coords[:n], [label(i) for i in ids]),
        "neighbour": (coords[n:], [f"{label(i)} (near {label(chosen)})" for i in neighbour_ids]),
        "vocabulary sample": (background, [label(i) for i in sample])}), width="stretch")
    st.caption("The 2 directions of largest variance of these vectors plus 1,500 random "
               "vocabulary tokens (grey). A projection from 576 dimensions keeps only part of "
               "the structure: use the table above for exact similarities.")

st.subheader("Position: rotary embeddings (RoPE)")
theta = spec.rope_theta or 10_000.0
angle_table, distances, series = rope_views(theta, spec.head_dim)
st.plotly_chart(rope_angle_chart(angle_table, np.arange(0, 257)), width="stretch")
st.caption(f"Each head vector ({spec.head_dim} numbers) is split into {spec.head_dim // 2} pairs; "
           f"pair i turns by position · θ^(−2i/{spec.head_dim}) radians, θ = {theta:,.0f}. Early "
           "pairs spin fast (fine position), late pairs slowly (coarse position).")
st.plotly_chart(rope_score_chart(distances, series), width="stretch")
st.caption("The same two vectors, rotated for their positions, give a q·k score that depends "
           "only on how far apart they are — not on where they sit in the text.")
