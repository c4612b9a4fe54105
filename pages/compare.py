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

from charts.compare import (
    kv_chart,
    latency_chart,
)
from charts.formatting import count, duration, rate, size
from engine import EngineError, GenerationSettings, LoadedModel, Run, Trace
from engine.lens.compare import (
    CHANGES,
    DTYPE_SWAP,
    Change,
    MetricRow,
    decoder_note,
    metric_rows,
    rerun_settings,
    setting_rows,
)
from engine.loader import is_mapped_model
from engine.records.examples import examples
from engine.settings import weights_name
from engine.timing.disturbance import assess
from i18n import N_, _, chinese
from ui import shared
from ui.common import no_trace_notice, show_chart
from ui.config import config
from ui.experiment import Job, run_experiment
from ui.keys import COMPARE_A, COMPARE_UPLOAD
from ui.memo import memo
from ui.record import keep_compare_a, keep_compare_run
from ui.sections.two_runs import attention_section, tokens_section
from ui.state import app_state, compare_run, current_trace, session_model
from ui.tables import show_table
from ui.text import message, plain
from ui.traces import read_viewable
from ui.upload_guard import upload_bytes

CURRENT = N_("The current trace")
B_SOURCES = (N_("An example"), N_("A trace file"), N_("Run A again with one change"), CURRENT)
HIGHLIGHT = "background-color: #fde0c5; font-weight: 600"  # a setting that differs

# engine/lens/compare.py's words (CHANGES, setting_rows, metric_rows), for the catalogs: the page
# shows them through `_`; the engine keeps its English.
ENGINE_WORDS = (
    N_("KV cache on ↔ off"), N_("chat template on ↔ off"), N_("weights float32 ↔ float16"),
    N_("another prompt"),
    N_("model"), N_("weights"), N_("decode steps by"), N_("device"), N_("prompt"),
    N_("chat template"), N_("KV cache"), N_("temperature"), N_("top-k"), N_("top-p"), N_("seed"),
    N_("max new tokens"), N_("attention layers recorded"), N_("ended because"),
    N_("not recorded"), N_("on"), N_("off"), N_("0 (greedy)"), N_("– (greedy: unused)"),
    N_("none"),
    N_("TTFT"), N_("median ITL"), N_("decode rate"), N_("end to end"), N_("KV cache at the end"),
    N_("prompt tokens"), N_("answer tokens"),
    N_("tokenization + prefill step"), N_("50th percentile of the decode steps' latency"),
    N_("decode steps ÷ their summed latency"), N_("tokenization + every step's latency"),
    N_("measured nbytes of the cache's key and value tensors after the last step"),
    N_("tokens fed to the prefill"), N_("tokens generated"),
)
# the settings whose values are words of the engine (the others: a model, a prompt, a device)
WORDED_SETTINGS = {"chat template", "KV cache", "temperature", "top-k", "top-p", "seed",
                   "attention layers recorded"}

# Run labels are kept in English (a reload restores them) and shown in the session's language.
LABELS = {N_("the current trace"), N_("re-run with the KV cache off"),
          N_("re-run with the KV cache on"), N_("re-run with the chat template off"),
          N_("re-run with the chat template on"), N_("re-run with another prompt")}
LABEL_FORMS = (N_("example “{title}”"), N_("file {name}"), N_("re-run with {dtype} weights"))


def shown_label(label: str) -> str:
    """A run's kept English label in the session's language ("example “…”" → its form)."""
    if label in LABELS:
        return _(label)
    for form in LABEL_FORMS:
        head, rest = form.split("{", 1)
        field, tail = rest.split("}", 1)
        if label.startswith(head) and label.endswith(tail) and len(label) >= len(head) + len(tail):
            value = label[len(head):len(label) - len(tail)]
            if field == "title":
                value = _(value)  # an example's title is in the catalogs too
            return _(form).format(**{field: value})
    return label


def setting_value(name: str, value: str) -> str:
    """A setting's value as shown: the engine's words translated, anything else as it is."""
    if name not in WORDED_SETTINGS:
        return value
    if name == "attention layers recorded" and value.startswith("all "):
        return _("all {layers}").format(layers=value[len("all "):])
    return _(value)


def header() -> None:
    st.title(_("Compare runs"))
    st.caption(_("Two runs side by side: the settings that differ, the tokens with the first "
                 "difference marked, the timing and KV-cache numbers, and the same layer and "
                 "head's attention in both. Change one thing and see what it changes — and what it "
                 "does not."))


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
    choice = st.selectbox(_("Run A"), options, key=COMPARE_A, format_func=_,
                          on_change=lambda: keep_compare_a(st.session_state[COMPARE_A]),
                          help=_("The session's trace (from Generate) or a run shipped with the "
                                 "app."))
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
        set_error(message(f"{shown_label(label)}: {err}"))


def _upload_b() -> None:
    upload = st.session_state.get(COMPARE_UPLOAD)
    if upload is None:
        return

    def read() -> Trace:
        return _open_file(lambda: upload_bytes(upload, config().limits.upload_mb))
    _set_b(f"file {upload.name[:120]}", read)


def choose_b(a: Trace) -> None:
    """Where run B comes from; a choice made here is kept across reloads."""
    source = st.radio(_("Run B from"), B_SOURCES, horizontal=True, key="compare_b_source",
                      format_func=_)
    if source == "An example":
        row = st.container(horizontal=True, vertical_alignment="bottom")
        title = row.selectbox(_("Example"), example_titles(), key="compare_b_example",
                              format_func=_)
        if row.button(_("Compare with this example"), icon=":material/compare_arrows:",
                      key="compare_b_example_go"):
            _set_b(f"example “{title}”", lambda: example_trace(title))
    elif source == "A trace file":
        st.file_uploader(_("Trace file (.npz, from “Download trace”)"), type=["npz"],
                         key=COMPARE_UPLOAD, on_change=_upload_b,
                         max_upload_size=config().limits.upload_mb)
    elif source == CURRENT:
        if current_trace() is None:
            st.info(_("No current trace: generate one on the Generate page."))
        elif st.button(_("Compare with the current trace"), icon=":material/compare_arrows:",
                       key="compare_b_current_go"):
            _set_b("the current trace", current_trace)
    else:
        rerun_form(a)
    error = app_state().page.compare_error
    if error is not None:
        st.error(error)


def rerun_form(a: Trace) -> None:
    change: Change = st.radio(_("Change one thing"), list(CHANGES),
                              format_func=lambda c: _(CHANGES[c]), horizontal=True,
                              key="compare_change")
    prompt = a.prompt
    if change == "prompt":
        prompt = st.text_area(_("Prompt for run B"), a.prompt, max_chars=4000, key="compare_prompt")
    if change == "dtype" and config().hosted:
        st.info(_("This hosted demo runs one float32 model for every visitor: float16 weights "
                  "need the app run locally."))
        return
    chosen = session_model()
    if change == "dtype" and chosen is not None and is_mapped_model(chosen.lm.model):
        st.info(_("A model opened from a GGUF file runs on its stored blocks, with float32 "
                  "activations, and has no float16 version here: change the weights dtype on the "
                  "default model."))
        return
    limits = config().limits
    st.caption(_("Run B re-runs run A's prompt and settings (its seed, its recorded layers) on "
                 "the loaded model, at most {n} new tokens here.").format(n=limits.new_tokens))
    if st.button(_("Run again with this change"), type="primary", icon=":material/play_arrow:",
                 key="compare_rerun_go"):
        rerun(a, change, prompt)


def change_label(a: Trace, change: Change) -> str:
    """Run B's label, in English (kept; `shown_label` shows it)."""
    if change == "kv_cache":
        return ("re-run with the KV cache off" if a.settings.kv_cache
                else "re-run with the KV cache on")
    if change == "chat_template":
        return ("re-run with the chat template off" if a.settings.chat_template
                else "re-run with the chat template on")
    if change == "dtype":
        return f"re-run with {DTYPE_SWAP.get(a.model.dtype, '?')} weights"
    return "re-run with another prompt"


def rerun_model(a: Trace, change: Change):
    """The model for the re-run: the loaded one — or, to change the weights dtype, the same model
    in the other dtype — which must be the model that recorded run A (one change only)."""
    chosen = session_model()
    if chosen is None:
        raise EngineError(_("no model is loaded yet (see the sidebar; it may still be loading)"))
    lm = chosen.lm
    want = a.model.dtype
    if change == "dtype":
        want = DTYPE_SWAP.get(a.model.dtype)
        if want is None:
            raise EngineError(_("run A's weights are {dtype}: only float32 ↔ float16 here")
                              .format(dtype=a.model.dtype))
        if lm.spec.dtype != want:
            with st.spinner(_("Loading the model with {dtype} weights…").format(dtype=want)):
                lm = shared.MODELS.get(chosen.source, want).lm
    weights = a.decoder.weights if a.decoder is not None else None
    if change != "dtype" and weights is not None and weights != weights_name(chosen.weights):
        raise EngineError(_("run A decoded with {weights} weights and the sidebar has "
                            "{sidebar}: choose {weights} in the sidebar, so that only the one "
                            "change differs").format(weights=weights, sidebar=chosen.weights))
    if lm.spec.name != a.model.name or lm.spec.dtype != want:
        raise EngineError(_("run A was recorded with {model} ({dtype}) and the sidebar's model is "
                            "{loaded} ({loaded_dtype}): load run A's model, so that only the one "
                            "change differs").format(model=a.model.name, dtype=a.model.dtype,
                                                     loaded=lm.spec.name,
                                                     loaded_dtype=lm.spec.dtype))
    return lm


def rerun(a: Trace, change: Change, prompt: str) -> None:
    """Run A's prompt and settings again with one change; the result becomes run B."""
    limits = config().limits
    prepared = run_experiment(lambda job: (rerun_model(a, change), rerun_settings(
        a, change, limits.new_tokens, limits.prompt_tokens)), turn=False, cut=False,
        failed=_("re-run: "), on_error=set_error)
    if prepared is None:
        return
    lm, settings = prepared
    trace = run_experiment(lambda job: rerun_trace(lm, prompt, settings, job),
                           progress=_("Starting…"), failed=_("re-run: "),
                           on_error=set_error, cut=lambda t: t.stop_reason == "limit")
    if trace is None:
        return
    if not trace.steps:
        set_error(message(_("re-run: the run ended before its first token")))
        return
    keep_compare_run(change_label(a, change), trace)
    set_error(None)


def rerun_trace(lm: LoadedModel, prompt: str, settings: GenerationSettings, job: Job) -> Trace:
    """The re-run, its progress step by step; stopped by the per-click budget: marked so."""
    chosen = session_model()
    # the session's own weights: its shared native decoder, as the live run uses it
    options = chosen.run_options() if chosen is not None and lm is chosen.lm else {}
    run = Run(lm, prompt, settings, stop_event=job.stop, **options)
    job.progress(0.0, _("Prefill of {n} prompt tokens…").format(n=len(run.prompt_ids)))
    for step in run:
        job.progress((step.index + 1) / settings.max_new_tokens,
                     _("Step {i} of at most {n}").format(i=step.index + 1,
                                                        n=settings.max_new_tokens))
    trace = run.trace()
    return replace(trace, stop_reason="limit") if job.spent and trace.stop_reason == "stopped" \
        else trace


# ---- the comparison -----------------------------------------------------------------------


def settings_section(a: Trace, b: Trace) -> None:
    st.subheader(_("What each run was asked to do"))
    rows = setting_rows(a, b)
    table = pd.DataFrame([{_("setting"): _(r.name), _("run A"): setting_value(r.name, r.a),
                           _("run B"): setting_value(r.name, r.b)} for r in rows])
    differs = [r.differs for r in rows]
    styled = table.style.apply(lambda row: [HIGHLIGHT if differs[row.name] else ""] * len(row),
                               axis=1)
    show_table(styled, hide_index=True, width="stretch", height=35 * len(rows) + 38)
    names = [_(r.name) for r in rows if r.differs]
    st.caption(_("Highlighted: {settings}.").format(settings=("、" if chinese() else ", ").join(names))
               if names else _("Highlighted: nothing — the same settings."))


_FORMAT = {"ms": duration, "tok/s": rate, "B": size, "tokens": count}


def _signed(row: MetricRow) -> str:
    d = row.difference
    if d is None:
        return "–"
    return ("+" if d > 0 else "−" if d < 0 else "±") + _FORMAT[row.unit](abs(d))


def numbers_section(a: Trace, b: Trace) -> None:
    st.subheader(_("Timing and memory"))
    if (note := decoder_note(a, b)) is not None:
        st.warning(plain(note))
    rows = metric_rows(a, b)
    show_table(pd.DataFrame([{
        "": _(r.name), _("run A"): _FORMAT[r.unit](r.a), _("run B"): _FORMAT[r.unit](r.b),
        "B − A": _signed(r), "B ÷ A": "–" if r.ratio is None else f"{r.ratio:.2f}×",
        _("how it is computed"): _(r.formula)} for r in rows]), hide_index=True, width="stretch")
    c1, c2 = st.columns(2)
    with c1:
        show_chart(latency_chart(a, b), key="compare_latency")
    with c2:
        show_chart(kv_chart(a, b), key="compare_kv")
    notes = [_("Run {name}: {warning}").format(name=n, warning=w)
             for n, t in (("A", a), ("B", b)) if (w := assess(t).warning(shared=config().hosted))]
    for note in notes:
        st.warning(note, icon=":material/speed:")
    if a.device != b.device or a.machine != b.machine:
        st.caption(_("Times are each run's own measurements: runs recorded on another machine, "
                     "or while it was busy, differ for reasons of their own."))


header()
col_a, col_b = st.columns([1, 2])
with col_a:
    A_LABEL, A = choose_a()
with col_b:
    choose_b(A)
B_RUN = compare_run()
if B_RUN is None:
    st.info(_("Choose run B above: an example, a trace file, or run A again with one change "
              "(needs the model)."))
    st.stop()
B_LABEL, B = B_RUN
st.markdown(_("**Run A**: {a} · **Run B**: {b}").format(a=plain(shown_label(A_LABEL)),
                                                        b=plain(shown_label(B_LABEL))))
settings_section(A, B)
tokens_section(A, B)
numbers_section(A, B)
attention_section(A, B)
