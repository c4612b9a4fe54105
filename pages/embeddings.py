"""Embeddings: each token id becomes a vector; similar tokens sit close; RoPE adds position."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from charts.embeddings import embedding_map, rope_angle_chart, rope_score_chart
from charts.tokens import piece_text, visible
from engine import LoadedModel, Trace
from engine.lens.embeddings import EmbeddingIndex
from engine.lens.rope import angles, score_by_distance
from engine.lens.tokens import probe_token, prompt_word
from i18n import N_, _
from ui.common import no_trace_notice, show_chart
from ui.experiment import run_experiment
from ui.keys import EMB_PICK, EMB_PROBE
from ui.memo import memo
from ui.state import app_state, current_trace, loaded_model, session_model
from ui.tables import show_table
from ui.text import plain

SAMPLE = " The king and the queen walked to Paris."


@st.cache_data(show_spinner=False)
def rope_views(theta: float, head_dim: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Angles for positions 0..256 and q·k by distance 0..512 (pure; computed once per model)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal(head_dim)
    k = q + 0.5 * rng.standard_normal(head_dim)
    distances = np.arange(0, 513)
    series = {N_("similar q and k"): score_by_distance(q, k, theta, distances),  # translated where
              N_("unrelated q and k"): score_by_distance(  # drawn: this result is cached
                  q, rng.standard_normal(head_dim), theta, distances)}
    return angles(theta, head_dim, np.arange(0, 257)), distances, series


def token_label(lm: LoadedModel, token_id: int) -> str:
    return visible(piece_text(lm.tokenizer.convert_ids_to_tokens(int(token_id))))


def embedding_index() -> EmbeddingIndex | None:
    """The normalized table, built once per loaded model and shared by all sessions (None: it
    could not be built, the reason shown)."""
    entry = session_model().entry
    if "embedding_index" in entry.extras:
        return entry.extras["embedding_index"]
    return run_experiment(lambda job: entry.extra("embedding_index", EmbeddingIndex),
                          spinner=_("Normalizing the embedding table…"))


def prompt_tokens(lm: LoadedModel, trace: Trace | None) -> tuple[list[int], int | None]:
    """The prompt's distinct non-special token ids (or a sample sentence's) and the one to start
    on: a word of the user's own text, not the chat template's first token."""
    if trace is not None and trace.model.vocab_size == lm.spec.vocab_size:
        ids = [i for i, special in zip(trace.prompt_token_ids, trace.prompt_special) if not special]
        start = prompt_word(lm.tokenizer, trace.prompt)
    else:
        no_trace_notice(_("Your prompt's tokens will show here; meanwhile, a sample sentence:"))
        ids = lm.tokenizer(SAMPLE, add_special_tokens=False).input_ids
        start = prompt_word(lm.tokenizer, SAMPLE)
    ids = list(dict.fromkeys(ids))
    return ids, start if start in ids else (ids[0] if ids else None)


def follow_trace(trace: Trace | None, ids: list[int], start: int | None) -> None:
    """A new trace resets the picker to a word of its prompt and clears the typed probe, so
    the page never keeps showing a token from a run that is gone (so does a picker Streamlit
    dropped while another page was open)."""
    page = app_state().page
    if page.follows is None or page.follows[0] is not trace or st.session_state.get(EMB_PICK) not in ids:
        page.follows = (trace,)
        st.session_state[EMB_PICK] = start
        st.session_state[EMB_PROBE] = ""


def use_word_initial(text: str) -> None:
    st.session_state[EMB_PROBE] = text


def nearest_tokens(lm: LoadedModel, index: EmbeddingIndex, ids: list[int],
                   traced: bool) -> tuple[int, list[int]]:
    """The picker, the probe box, which token was probed, and its 10 nearest tokens; returns
    the probed token id and its neighbours' ids (the map shows the same ones)."""
    st.subheader(_("Nearest tokens"))
    chosen = st.selectbox(_("Token (from the last prompt)") if traced else _("Token"), ids,
                          key=EMB_PICK, format_func=lambda i: token_label(lm, i))
    probe = st.text_input(_("…or probe any word"), key=EMB_PROBE, placeholder=_("e.g.  dog"),
                          max_chars=100,
                          help=_("Its first token is used; a leading space matters (below)."))
    probed = probe_token(lm.tokenizer, probe) if probe else None
    if probed is not None:
        chosen = probed.token_id
        st.caption(plain(probed.description()))
        if probed.word_initial is not None:
            text, _unused, piece = probed.word_initial
            st.button(_("Probe “{word}” ({piece}) instead").format(
                word=plain(text), piece=plain(visible(piece_text(piece)))),
                on_click=use_word_initial, args=(text,), icon=":material/space_bar:",
                key="emb_probe_word_initial")
    else:
        st.caption(plain(_("Neighbours of the piece {piece} (id {id}), as it appears in the "
                           "prompt.").format(piece=token_label(lm, chosen), id=chosen)))
    near = index.neighbours(chosen, 10)
    show_table(pd.DataFrame({_("rank"): range(1, 11),
                             _("token"): [token_label(lm, i) for i in near.ids],
                             _("id"): near.ids, _("cosine similarity"): near.scores.round(4)}),
               hide_index=True, width="stretch")
    return int(chosen), [int(i) for i in near.ids]


def pca_map(lm: LoadedModel, index: EmbeddingIndex, ids: list[int], chosen: int,
            neighbour_ids: list[int]) -> None:
    """The probed token, its neighbours, the prompt's tokens and a vocabulary sample on the 2
    directions of largest variance."""
    st.subheader(_("A 2-D map"))
    page = app_state().page
    if not (st.button(_("Draw the map (PCA)"), icon=":material/scatter_plot:", key="emb_draw_map")
            or page.map_on):
        return
    page.map_on = True
    shown = [chosen, *neighbour_ids, *ids]
    projected = memo(  # one SVD per model and token choice, in the model turn: an SVD on the
        "pca", (index, tuple(shown)), lambda: run_experiment(  # cores, not while another
            lambda job: index.pca_map(shown, background=1500),  # visitor's run is timed
            spinner=_("Projecting the embeddings (PCA)…")))
    if projected is None:  # the reason is shown
        return
    coords, sample, background = projected
    near = [token_label(lm, i) for i in neighbour_ids]
    probed = token_label(lm, chosen)
    figure = embedding_map(
        {"probed token": (coords[:1], [probed]), "neighbour": (coords[1:11], near),
         "prompt token": (coords[11:], [token_label(lm, i) for i in ids]),
         "vocabulary sample": (background, [token_label(lm, i) for i in sample])},
        hover={"neighbour": [_("{token} (near {probed})").format(token=t, probed=probed)
                             for t in near],
               "probed token": [_("{token} (probed, id {id})").format(token=probed, id=chosen)]})
    show_chart(figure, name="embedding map")
    labelled = sum(sum(1 for t in group.text if t) for group in figure.data if group.text)
    st.caption(_("The 2 directions of largest variance of these vectors plus 1,500 random "
                 "vocabulary tokens (grey); the star is the probed token. {labelled} of {points} "
                 "coloured points are labelled, where a label has room (the star first, then its "
                 "neighbours, then the prompt); hover any point for its token. A projection from "
                 "{dims} dimensions keeps only part of the structure: use the table above for "
                 "exact similarities.").format(labelled=labelled, points=len(coords),
                                              dims=lm.spec.hidden_size))


def rope_section(lm: LoadedModel) -> None:
    spec = lm.spec
    st.subheader(_("Position: rotary embeddings (RoPE)"))
    theta = spec.rope_theta or 10_000.0
    angle_table, distances, series = rope_views(theta, spec.head_dim)
    show_chart(rope_angle_chart(angle_table, np.arange(0, 257)), name="rope angles")
    st.caption(_("Each head vector ({head_dim} numbers) is split into {pairs} pairs; pair i turns "
                 "by position · θ^(−2i/{head_dim}) radians, θ = {theta}. Early pairs spin fast "
                 "(fine position), late pairs slowly (coarse position).").format(
        head_dim=spec.head_dim, pairs=spec.head_dim // 2, theta=f"{theta:,.0f}"))
    show_chart(rope_score_chart(distances, {_(name): scores for name, scores in series.items()}),
               name="rope scores")
    st.caption(_("The same two vectors, rotated for their positions, give a q·k score that "
                 "depends only on how far apart they are — not on where they sit in the text."))


def page() -> None:
    st.title(_("Embeddings"))
    lm, trace = loaded_model(), current_trace()
    if lm is None:
        st.info(_("This page reads the model's embedding table: load a model in the sidebar."))
        st.stop()
    index = embedding_index()
    if index is None:
        st.stop()
    spec = lm.spec
    st.caption(_("The input embedding table is {vocab} × {hidden}: one {hidden}-number vector per "
                 "token id. Training moves tokens used alike close together; closeness here is "
                 "cosine similarity.").format(vocab=f"{spec.vocab_size:,}", hidden=spec.hidden_size))
    ids, start = prompt_tokens(lm, trace)
    follow_trace(trace, ids, start)
    chosen, neighbour_ids = nearest_tokens(lm, index, ids, trace is not None)
    pca_map(lm, index, ids, chosen, neighbour_ids)
    rope_section(lm)


page()
