"""Compare runs: any two traces side by side — the session's trace, an example, a trace file, or
run A again with one thing changed (KV cache, chat template, weights dtype, prompt).

The bottom of the file reads like the page's table of contents: choose A, choose B, then one
function per section (settings, tokens, numbers, attention), each taking (a, b). Everything they
show is computed by engine/lens/compare.py from the two traces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pandas as pd
import streamlit as st

from charts.attention import downsample, sequence_labels
from charts.compare import (
    answer_chips_html,
    heatmap_pair,
    kv_chart,
    latency_chart,
    prompt_chips_html,
)
from charts.formatting import count, duration, rate, size
from charts.tokens import piece_text, visible
from engine import EngineError, GenerationSettings, LoadedModel, Run, Trace, TraceFormatError
from engine.lens.attention_stats import full_attention
from engine.lens.compare import (
    CHANGES,
    DTYPE_SWAP,
    Change,
    MetricRow,
    attention_pair,
    decoder_note,
    largest_difference,
    metric_rows,
    rerun_settings,
    same_input_rows,
    setting_rows,
    token_diff,
)
from engine.records.examples import examples
from engine.settings import weights_name
from engine.timing.disturbance import assess
from ui import shared
from ui.common import no_trace_notice, show_chart
from ui.config import config
from ui.experiment import Job, run_experiment
from ui.keys import COMPARE_A, COMPARE_HEAD, COMPARE_LAYER, COMPARE_UPLOAD
from ui.memo import memo
from ui.record import keep_compare_a, keep_compare_run
from ui.state import app_state, compare_run, current_trace, session_model
from ui.tables import show_table
from ui.text import message, plain
from ui.traces import read_viewable

CURRENT = "The current trace"
LIMIT = 96  # heatmap cells per side before blocks are averaged (as on the Attention page)
B_SOURCES = ("An example", "A trace file", "Run A again with one change", CURRENT)
HIGHLIGHT = "background-color: #fde0c5; font-weight: 600"  # a setting that differs


def header() -> None:
    st.title("Compare runs")
    st.caption("Two runs side by side: the settings that differ, the tokens with the first "
               "difference marked, the timing and KV-cache numbers, and the same layer and head's "
               "attention in both. Change one thing and see what it changes — and what it does not.")


# ---- choosing the runs --------------------------------------------------------------------


def _open_file(read: Callable[[], bytes | Path]) -> Trace:
    """A trace file read as the Generate page reads one (ui/traces.py): size-capped, checked,
    viewable."""
    return read_viewable(read).trace


def example_trace(title: str) -> Trace:
    """A shipped example by title, read once per session."""
    example = next(e for e in examples() if e.title == title)
    return memo(f"compare_example_{example.name}", (example.name,),
                lambda: _open_file(lambda: example.path))


def example_titles() -> list[str]:
    return [e.title for e in examples() if e.path.is_file()]


def choose_a() -> tuple[str, Trace]:
    """Run A: the session's trace (the default) or an example — the page works with no model."""
    options = ([CURRENT] if current_trace() is not None else []) + example_titles()
    if not options:
        no_trace_notice()
        st.stop()
    if st.session_state.get(COMPARE_A) not in options:  # a kept choice that no longer exists
        st.session_state.pop(COMPARE_A, None)
    choice = st.selectbox("Run A", options, key=COMPARE_A,
                          on_change=lambda: keep_compare_a(st.session_state[COMPARE_A]),
                          help="The session's trace (from Generate) or a run shipped with the app.")
    if choice == CURRENT:
        return "the current trace", current_trace()
    return f"example “{choice}”", example_trace(choice)


def set_error(text: str | None) -> None:
    """Why the last try to set run B failed (shown under the choice until run B is set)."""
    app_state().page.compare_error = text


def _set_b(label: str, read: Callable[[], Trace]) -> None:
    try:
        keep_compare_run(label, read())
        set_error(None)
    except EngineError as err:
        set_error(message(f"{label}: {err}"))


def _upload_b() -> None:
    upload = st.session_state.get(COMPARE_UPLOAD)
    if upload is None:
        return

    def read() -> Trace:
        if upload.size > config().limits.upload_mb << 20:
            raise TraceFormatError(f"the file is over {config().limits.upload_mb} MB")
        return _open_file(upload.getvalue)
    _set_b(f"file {upload.name[:120]}", read)


def choose_b(a: Trace) -> None:
    """Where run B comes from; a choice made here is kept across reloads."""
    source = st.radio("Run B from", B_SOURCES, horizontal=True, key="compare_b_source")
    if source == "An example":
        row = st.container(horizontal=True, vertical_alignment="bottom")
        title = row.selectbox("Example", example_titles(), key="compare_b_example")
        if row.button("Compare with this example", icon=":material/compare_arrows:"):
            _set_b(f"example “{title}”", lambda: example_trace(title))
    elif source == "A trace file":
        st.file_uploader("Trace file (.npz, from “Download trace”)", type=["npz"],
                         key=COMPARE_UPLOAD, on_change=_upload_b,
                         max_upload_size=config().limits.upload_mb)
    elif source == CURRENT:
        if current_trace() is None:
            st.info("No current trace: generate one on the Generate page.")
        elif st.button("Compare with the current trace", icon=":material/compare_arrows:"):
            _set_b("the current trace", current_trace)
    else:
        rerun_form(a)
    error = app_state().page.compare_error
    if error is not None:
        st.error(error)


def rerun_form(a: Trace) -> None:
    change: Change = st.radio("Change one thing", list(CHANGES), format_func=CHANGES.get,
                              horizontal=True, key="compare_change")
    prompt = a.prompt
    if change == "prompt":
        prompt = st.text_area("Prompt for run B", a.prompt, max_chars=4000, key="compare_prompt")
    if change == "dtype" and config().hosted:
        st.info("This hosted demo runs one float32 model for every visitor: float16 weights "
                "need the app run locally.")
        return
    limits = config().limits
    st.caption(f"Run B re-runs run A's prompt and settings (its seed, its recorded layers) on the "
               f"loaded model, at most {limits.new_tokens} new tokens here.")
    if st.button("Run again with this change", type="primary", icon=":material/play_arrow:"):
        rerun(a, change, prompt)


def change_label(a: Trace, change: Change) -> str:
    if change == "kv_cache":
        return f"re-run with the KV cache {'off' if a.settings.kv_cache else 'on'}"
    if change == "chat_template":
        return f"re-run with the chat template {'off' if a.settings.chat_template else 'on'}"
    if change == "dtype":
        return f"re-run with {DTYPE_SWAP.get(a.model.dtype, '?')} weights"
    return "re-run with another prompt"


def rerun_model(a: Trace, change: Change):
    """The model for the re-run: the loaded one — or, to change the weights dtype, the same model
    in the other dtype — which must be the model that recorded run A (one change only)."""
    chosen = session_model()
    if chosen is None:
        raise EngineError("no model is loaded yet (see the sidebar; it may still be loading)")
    lm = chosen.lm
    want = a.model.dtype
    if change == "dtype":
        want = DTYPE_SWAP.get(a.model.dtype)
        if want is None:
            raise EngineError(f"run A's weights are {a.model.dtype}: only float32 ↔ float16 here")
        if lm.spec.dtype != want:
            with st.spinner(f"Loading the model with {want} weights…"):
                lm = shared.MODELS.get(chosen.source, want).lm
    weights = a.decoder.weights if a.decoder is not None else None
    if change != "dtype" and weights is not None and weights != weights_name(chosen.weights):
        raise EngineError(f"run A decoded with {weights} weights and the sidebar has "
                          f"{chosen.weights}: choose {weights} in the sidebar, so that only the "
                          "one change differs")
    if lm.spec.name != a.model.name or lm.spec.dtype != want:
        raise EngineError(f"run A was recorded with {a.model.name} ({a.model.dtype}) and the "
                          f"sidebar's model is {lm.spec.name} ({lm.spec.dtype}): load run A's "
                          "model, so that only the one change differs")
    return lm


def rerun(a: Trace, change: Change, prompt: str) -> None:
    """Run A's prompt and settings again with one change; the result becomes run B."""
    limits = config().limits
    prepared = run_experiment(lambda job: (rerun_model(a, change), rerun_settings(
        a, change, limits.new_tokens, limits.prompt_tokens)), turn=False, cut=False,
        failed="re-run: ", on_error=set_error)
    if prepared is None:
        return
    lm, settings = prepared
    trace = run_experiment(lambda job: rerun_trace(lm, prompt, settings, job),
                           progress="Starting…", failed="re-run: ",
                           on_error=set_error, cut=lambda t: t.stop_reason == "limit")
    if trace is None:
        return
    if not trace.steps:
        set_error(message("re-run: the run ended before its first token"))
        return
    keep_compare_run(change_label(a, change), trace)
    set_error(None)


def rerun_trace(lm: LoadedModel, prompt: str, settings: GenerationSettings, job: Job) -> Trace:
    """The re-run, its progress step by step; stopped by the per-click budget: marked so."""
    chosen = session_model()
    # the session's own weights: its shared native decoder, as the live run uses it
    options = chosen.run_options() if chosen is not None and lm is chosen.lm else {}
    run = Run(lm, prompt, settings, stop_event=job.stop, **options)
    job.progress(0.0, f"Prefill of {len(run.prompt_ids)} prompt tokens…")
    for step in run:
        job.progress((step.index + 1) / settings.max_new_tokens,
                     f"Step {step.index + 1} of at most {settings.max_new_tokens}")
    trace = run.trace()
    return replace(trace, stop_reason="limit") if job.spent and trace.stop_reason == "stopped" \
        else trace


# ---- the comparison -----------------------------------------------------------------------


def settings_section(a: Trace, b: Trace) -> None:
    st.subheader("What each run was asked to do")
    rows = setting_rows(a, b)
    table = pd.DataFrame([{"setting": r.name, "run A": r.a, "run B": r.b} for r in rows])
    differs = [r.differs for r in rows]
    styled = table.style.apply(lambda row: [HIGHLIGHT if differs[row.name] else ""] * len(row),
                               axis=1)
    show_table(styled, hide_index=True, width="stretch", height=35 * len(rows) + 38)
    names = [r.name for r in rows if r.differs]
    st.caption("Highlighted: " + (", ".join(names) if names else "nothing — the same settings")
               + ".")


def _piece(trace: Trace, index: int) -> str:
    if index >= len(trace.steps):
        return "nothing (the run had ended)"
    step = trace.steps[index]
    return f"“{visible(piece_text(step.piece))}” (p = {step.chosen_prob:.3f})"


def tokens_section(a: Trace, b: Trace) -> None:
    st.subheader("Tokens")
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
        st.warning(f"The answers first differ at answer token {i} (outlined in red below): run A "
                   f"produced {plain(_piece(a, i))}, run B {plain(_piece(b, i))}. {before}",
                   icon=":material/difference:")
    for name, trace in (("A", a), ("B", b)):
        st.markdown(f"**Run {name}** · {len(trace.steps)} answer tokens, ended: "
                    f"{trace.stop_reason}")
        st.markdown(answer_chips_html(trace, diff.answer), unsafe_allow_html=True)
    same = diff.prompt is None
    with st.expander(f"Prompt tokens: {'the same' if same else 'different'} "
                     f"({diff.prompt_lengths[0]} and {diff.prompt_lengths[1]} tokens)",
                     expanded=not same):
        if not same:
            st.caption(f"First difference at prompt token {diff.prompt} (outlined in red).")
        for name, trace in (("A", a), ("B", b)):
            st.markdown(f"**Run {name}**")
            st.markdown(prompt_chips_html(trace, diff.prompt), unsafe_allow_html=True)


_FORMAT = {"ms": duration, "tok/s": rate, "B": size, "tokens": count}


def _signed(row: MetricRow) -> str:
    d = row.difference
    if d is None:
        return "–"
    return ("+" if d > 0 else "−" if d < 0 else "±") + _FORMAT[row.unit](abs(d))


def numbers_section(a: Trace, b: Trace) -> None:
    st.subheader("Timing and memory")
    if (note := decoder_note(a, b)) is not None:
        st.warning(plain(note))
    rows = metric_rows(a, b)
    show_table(pd.DataFrame([{
        "": r.name, "run A": _FORMAT[r.unit](r.a), "run B": _FORMAT[r.unit](r.b),
        "B − A": _signed(r), "B ÷ A": "–" if r.ratio is None else f"{r.ratio:.2f}×",
        "how it is computed": r.formula} for r in rows]), hide_index=True, width="stretch")
    c1, c2 = st.columns(2)
    with c1:
        show_chart(latency_chart(a, b), key="compare_latency")
    with c2:
        show_chart(kv_chart(a, b), key="compare_kv")
    notes = [f"Run {n}: {w}" for n, t in (("A", a), ("B", b)) if (w := assess(t).warning())]
    for note in notes:
        st.warning(note, icon=":material/speed:")
    if a.device != b.device or a.machine != b.machine:
        st.caption("Times are each run's own measurements: runs recorded on another machine, or "
                   "while it was busy, differ for reasons of their own.")


def attention_section(a: Trace, b: Trace) -> None:
    st.subheader("The same attention head in both")
    pair = attention_pair(a, b)
    if not pair.available:
        st.info(pair.note)
        return
    c1, c2, c3 = st.columns([1, 1, 2])
    for key, options in ((COMPARE_LAYER, pair.layers), (COMPARE_HEAD, range(pair.heads))):
        if st.session_state.get(key) not in options:
            st.session_state.pop(key, None)
    layer = c1.selectbox("Layer", pair.layers, key=COMPARE_LAYER)
    head = c2.selectbox("Head", range(pair.heads), key=COMPARE_HEAD)
    rows = c3.radio("Rows", ["prompt (prefill)", "prompt + generated (decode rows)"],
                    horizontal=True, key="compare_rows")
    if pair.note:
        st.caption(pair.note)
    shown = []
    for name, trace in (("A", a), ("B", b)):
        weights = memo(f"compare_attn_{name}", (trace, layer), lambda t=trace: full_attention(t, layer))
        labels = sequence_labels(trace)
        n = len(trace.prompt_token_ids) if rows.startswith("prompt (") else len(labels)
        shown.append((weights[head, :n, :n], labels[:n]))
    (wa, la), (wb, lb) = shown
    (ma, na, block_a), (mb, nb, block_b) = downsample(wa, la, LIMIT), downsample(wb, lb, LIMIT)
    figs = heatmap_pair(ma, na, mb, nb, f"run A · layer {layer}, head {head}",
                        f"run B · layer {layer}, head {head}")
    for col, fig, name in zip(st.columns(2), figs, "AB"):
        with col:
            show_chart(fig, key=f"compare_heatmap_{name}")
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


header()
col_a, col_b = st.columns([1, 2])
with col_a:
    A_LABEL, A = choose_a()
with col_b:
    choose_b(A)
B_RUN = compare_run()
if B_RUN is None:
    st.info("Choose run B above: an example, a trace file, or run A again with one change "
            "(needs the model).")
    st.stop()
B_LABEL, B = B_RUN
st.markdown(f"**Run A**: {plain(A_LABEL)} · **Run B**: {plain(B_LABEL)}")
settings_section(A, B)
tokens_section(A, B)
numbers_section(A, B)
attention_section(A, B)
