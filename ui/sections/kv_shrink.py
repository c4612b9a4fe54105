"""The KV cache page's "Shrink the cache itself": the article's frontier (a latent cache as MLA's,
sparse attention, eviction) run on the loaded model against the user's own run, teacher-forced
(engine/kv/shrink) — a point per method and budget on one chart of quality against bytes."""

from __future__ import annotations

import shlex

import numpy as np
import pandas as pd
import streamlit as st

from charts.kv_shrink import AXES, METRICS, budget_label, kept_heatmap, shrink_chart
from engine import LoadedModel, Trace
from engine.errors import InputError
from engine.kv.shrink.budget import (
    METHODS,
    SPARSE_METHODS,
    Shrink,
    described,
    parse_budget,
)
from engine.kv.shrink.latent import full_rank
from engine.kv.shrink.run import SOURCES, ShrinkRun, held_out_sequence, shrink_runs
from engine.timing.disturbance import advice
from i18n import N_, _, chinese, language
from ui.common import show_chart
from ui.config import config
from ui.experiment import Job, run_experiment
from ui.kept_widgets import kept_radio, kept_selectbox
from ui.record import keep_experiments
from ui.sections.kv_long import long_section
from ui.state import current_experiments
from ui.tables import show_table
from ui.text import listed

DEFAULT_METHODS = ("latent", "topk", "h2o", "snapkv", "window")
DEFAULT_BUDGETS = "25%, 50%"
SOURCE_LABELS = {"run": N_("your last run"), "held-out": N_("a held-out text (the Gettysburg Address)")}
MAX_BUDGETS = 4
METHODS_KEPT = "kv_shrink_method_ids"  # the methods chosen, by id: the same in every language

INTRO = N_("The frontier the article ends on: models are now redesigned around the KV cache. DeepSeek "
           "caches one small **latent** per token (MLA) and attends **sparsely**; long contexts "
           "drop old tokens (**eviction**). Each method below runs on the loaded model, reading "
           "your last run's tokens teacher-forced, and is compared with the unmodified model: "
           "bytes of cache held and read, how far its next-token distribution moves (KL, top-1 "
           "agreement, perplexity), and decode time.")

HOW = N_("**Latent**: keys (before RoPE) and values of each layer, side by side, projected on "
         "their top-r principal directions found on a calibration text (the Declaration of "
         "Independence); only the r numbers are cached, keys and values are rebuilt from them "
         "and the keys rotated to their positions (RoPE kept apart, as MLA). **Top-k**: each "
         "head attends to its k keys of highest q·k (reading every key to score them). "
         "**Indexer**: a score in a quarter of the dimensions picks the k keys (DeepSeek's "
         "sparse attention uses a small trained indexer; this one is untrained). **H2O** keeps "
         "the tokens that received the most attention so far and the most recent half; "
         "**SnapKV** keeps the prompt tokens its last queries attend to; **window** keeps 4 "
         "first tokens and the most recent ones (StreamingLLM); **key norm** keeps the keys of "
         "smallest norm. Budgets: a latent rank (of 2 · KV heads · head_dim), keys per head "
         "(top-k, indexer; a percentage is of the keys cached at that step), or tokens held "
         "(a percentage is of the prompt). Decode time is this PyTorch implementation's: "
         "attention runs eagerly here, so it shows what each method costs to run this way, "
         "not what a fused kernel would save.")


def _budgets(text: str, quiet: bool = False) -> list[str] | None:
    """The budgets typed, or None after one message (none when `quiet`: not yet submitted)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        if not 1 <= len(parts) <= MAX_BUDGETS:
            raise InputError(_("give 1 to {n} budgets").format(n=MAX_BUDGETS))
        return [parse_budget(p).text() for p in parts]
    except InputError as err:
        if not quiet:
            st.error(str(err))
        return None


def shrink_section(trace: Trace | None, lm: LoadedModel | None) -> None:
    st.markdown(_(INTRO))
    shrinks = _chosen(trace, lm)
    with st.expander(_("How each method works, and what is measured")):
        st.markdown(_(HOW))
    long_section(lm, shrinks)


def _chosen(trace: Trace | None, lm: LoadedModel | None) -> list[Shrink]:
    """The methods × budgets form, its measurement on the run and the results; the pairs chosen
    (the needle below reads them too)."""
    if trace is None or lm is None or lm.spec.name != trace.model.name or len(trace.steps) < 2:
        st.info(_("Needs a run of several generated tokens from the loaded model: generate one "
                  "on the Generate page."))
        return [Shrink(m, parse_budget("64")) for m in DEFAULT_METHODS]
    kept = st.session_state.get(METHODS_KEPT, list(DEFAULT_METHODS))
    with st.form("kv_shrink_form", border=False):
        c1, c2 = st.columns([3, 2])
        # a widget per language: Streamlit keeps a multiselect's choice as its shown labels,
        # which another language would not find (the ids chosen are kept apart)
        methods = c1.multiselect(_("Methods"), list(METHODS), default=kept,
                                 format_func=lambda m: _(METHODS[m]),
                                 placeholder=_("Choose one or more methods"),
                                 key=f"kv_shrink_methods_{language()}")
        budgets = c2.text_input(_("Budgets (comma-separated)"), DEFAULT_BUDGETS, max_chars=60,
                                key="kv_shrink_budgets",
                                help=_("'full', a whole number or a percentage, e.g. 25%, 50%, 16"))
        source = kept_radio(_("Read"), SOURCES, horizontal=True, key="kv_shrink_source",
                            format_func=lambda s: _(SOURCE_LABELS[s]))
        pressed = st.form_submit_button(_("Measure each method"), icon=":material/science:")
    st.session_state[METHODS_KEPT] = list(methods)
    chosen = _budgets(budgets, quiet=not pressed) or []
    shrinks = [Shrink(m, parse_budget(b)) for m in methods for b in chosen]
    if pressed and shrinks:
        _measure(trace, lm, shrinks, source)
    runs = current_experiments().cache_shrink
    if runs:
        _results(list(runs), trace, lm)
    return shrinks


def _measure(trace: Trace, lm: LoadedModel, shrinks: list[Shrink], source: str) -> None:
    if source == "held-out":
        ids, n = held_out_sequence(lm)
    else:
        ids = list(trace.prompt_token_ids) + list(trace.output_token_ids)
        n = len(trace.prompt_token_ids)
    limit = config().limits.sequence_tokens

    def work(job: Job) -> tuple[ShrinkRun, ...]:
        return tuple(shrink_runs(lm, ids, n, shrinks, max_tokens=limit, stop=job.stop,
                                 source=source, say=job.say))

    run_experiment(work, progress=_("Reading the tokens with the unmodified model…"),
                   keep=lambda found: keep_experiments(cache_shrink=found))


def _results(runs: list[ShrinkRun], trace: Trace, lm: LoadedModel) -> None:
    c1, c2 = st.columns(2)
    with c1:
        axis = kept_radio(_("Bytes"), list(AXES), format_func=lambda a: _(AXES[a]),
                          horizontal=True, key="kv_shrink_axis")
    with c2:
        metric = kept_radio(_("Quality"), list(METRICS), format_func=lambda m: _(METRICS[m]),
                            horizontal=True, key="kv_shrink_metric")
    with st.container(key="kv_shrink_chart"):  # assets/style.css: no point labels on a phone
        show_chart(shrink_chart(runs, metric, axis), name="kv shrink")
    st.caption(_("A budget counts something different for each method (a latent rank, keys "
                 "read per head, tokens held): compare the points by their bytes on the x axis, "
                 "not by the budget's number. Each label (on a phone: touch the point) gives what "
                 "the budget came to. On bytes held, sparse attention sits on the unmodified "
                 "model: it keeps the whole cache and reads less of it."))
    dense = runs[0]
    _table(runs)
    st.caption(_("Unmodified model: {held:,.2f} MiB of KV cache at the end, perplexity {ppl:.3f} of "
                 "the tokens read ({source}), decode {ms:.1f} ms per step (median). Each "
                 "method read the same {tokens} tokens after a {prompt}-token prompt, "
                 "teacher-forced: KL and top-1 compare {positions} next-token distributions "
                 "(after the prompt, then after each token read), perplexity scores the "
                 "{tokens} tokens.").format(
        held=dense.dense_kv_bytes[-1] / 2**20, ppl=dense.dense_ppl, ms=dense.dense_decode_ms,
        positions=len(dense.kl), tokens=len(dense.nll), prompt=dense.prompt_tokens,
        source=_(SOURCE_LABELS[dense.source])))
    delayed = [described(r.method, r.budget, short=True) for r in runs if r.delayed]
    if delayed:
        st.warning(_("Other work on this machine delayed the decode steps of {runs}: their "
                     "decode times show the machine, not the method (bytes and quality do not "
                     "depend on it). {advice}").format(
            runs=_("every run") if len(delayed) == len(runs) else listed(delayed),
            advice=advice(config().hosted)), icon=":material/hourglass_top:")
    _latent_line(runs, lm)
    _heatmap(runs, lm)
    read = ("--held-out" if dense.source == "held-out"
            else shlex.quote(trace.prompt) + f" --max-new-tokens {len(trace.steps)}")
    command = ("python -m engine kv-shrink " + read + " --method "
               + " ".join(dict.fromkeys(r.method for r in runs)) + " --budget "
               + " ".join(dict.fromkeys(r.budget for r in runs)) + " --json")
    st.caption(_("The same numbers from the shell (the run is generated again, greedily):"))
    st.code(command, language="bash")


def _table(runs: list[ShrinkRun]) -> None:
    """A row per method and budget: what it held and read, how far it moved, how fast."""
    number = st.column_config.NumberColumn
    show_table(pd.DataFrame([{
        "method": described(r.method, r.budget, short=True), "resolved": budget_label(r, short=False),
        "held": r.kv_bytes[-1] / 2**20, "share": r.kv_bytes[-1] / max(1, r.dense_kv_bytes[-1]),
        "read": float(np.median(r.read_bytes)) / 2**20 if len(r.read_bytes) else 0.0,
        "kl": r.mean_kl, "top1": r.top1_agreement, "ppl": r.ppl, "ms": r.decode_ms}
        for r in runs]), hide_index=True, html=True, column_config={
        "method": _("method · budget"), "resolved": _("budget came to"),
        "held": number(_("KV held (MiB)"), format="%.2f"),
        "share": number(_("of the unmodified"), format="percent"),
        "read": number(_("KV read per step (MiB)"), format="%.2f"),
        "kl": number(_("mean KL (nats)"), format="%.4f"),
        "top1": number(_("top-1 agreement"), format="percent"),
        "ppl": number(_("perplexity"), format="%.3f"),
        "ms": number(_("decode ms per step (median)"), format="%.1f")})


def _latent_line(runs: list[ShrinkRun], lm: LoadedModel) -> None:
    latent = [r for r in runs if r.method == "latent"]
    if not latent:
        return
    full = full_rank(lm)
    per_token = lm.spec.layers * full * 4
    st.markdown(_("**Latent, per token**: this model's cache holds {full} numbers a layer "
                  "(2 · {kv} KV heads · {d}), {per_token:,} B a token in float32; at rank "
                  "{ranks} the latent holds {bytes} B a token. DeepSeek-V3's MLA caches 512 + "
                  "64 numbers a layer (the calculator's MLA row).").format(
        full=full, kv=lm.spec.kv_heads, d=lm.spec.head_dim, per_token=per_token,
        ranks=" / ".join(str(r.count) for r in latent),
        bytes=" / ".join(f"{lm.spec.layers * r.count * 4:,}" for r in latent)))


def _heatmap(runs: list[ShrinkRun], lm: LoadedModel) -> None:
    shown = [r for r in runs if r.rows is not None]
    if not shown:
        return
    labels = [described(r.method, r.budget) for r in shown]
    c1, c2 = st.columns([3, 2])
    with c1:
        pick = kept_selectbox(_("Which keys a head attended to"), list(range(len(shown))),
                              format_func=lambda i: labels[i], key="kv_shrink_pick")
    head = c2.slider(_("Head"), 0, lm.spec.heads - 1, 0, key="kv_shrink_head")
    run = shown[min(pick, len(shown) - 1)]
    show_chart(kept_heatmap(run, head), name="kv shrink heatmap")
    what = (_("the keys each step's top-k kept") if run.method in SPARSE_METHODS
            else _("the tokens still held at each step"))
    st.caption(_("Layer {layer}, head {head}: {what}; grey cells were not attended to or had "
                 "been evicted.").format(layer=run.layer, head=head, what=what)
               + _not_listed([r for r in runs if r.rows is None]))


def _not_listed(runs: list[ShrinkRun]) -> str:
    if not runs:
        return ""
    return ("" if chinese() else " ") + _(
        "Not listed, as they attend to every token: {runs} (a latent cache is smaller, not "
        "sparser).").format(runs=listed([described(r.method, r.budget, short=True) for r in runs]))

