"""What if's "Switch heads off": zero (or mean-ablate) heads of a layer and/or its MLP, re-run the
prompt, and compare the next-token distribution, the text and the attention; then sweep every
head to see which ones matter (engine/whatif/ablate.py)."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pandas as pd
import streamlit as st

from charts.tokens import shown_piece
from charts.whatif import sweep_heatmap
from engine import InputError, Trace
from engine.forward import prepare_prompt
from engine.whatif.ablate import Ablation, ablate, head_sweep
from i18n import N_, _, chinese, ngettext
from ui.common import show_chart
from ui.config import config
from ui.experiment import Job, run_experiment
from ui.record import keep_new_trace, keep_whatif
from ui.results import HeadSweep
from ui.sections.two_runs import attention_section, tokens_section
from ui.session_model import SessionModel
from ui.state import current_trace, generation_settings, whatif_results
from ui.tables import show_table
from ui.text import plain

DEFAULT_PROMPT = "The Eiffel Tower is in the city of"
NEW_TOKENS = 16  # the greedy text compared both ways
SCOPES = {"one layer": N_("one layer"), "every layer": N_("every layer")}  # value: its label


def _prompt(lm_name: str) -> tuple[str, bool]:
    """The current run's prompt and chat setting (on its model), else the example's, raw."""
    trace = current_trace()
    if trace is not None and trace.model.name == lm_name:
        return trace.prompt, trace.settings.chat_template
    return DEFAULT_PROMPT, False


def experiment_ids(lm, prompt: str, chat: bool) -> list[int]:
    """The prompt's ids for an experiment here, sized before it starts: refused in one line past
    the prompt limit here (a sweep runs one copy of the prompt per head, at every layer), or
    when it is the current run's prompt but does not tokenize to the run's own ids (a trace
    file whose text was changed: 1,205 tokens of text behind a few ids held a hosted model 89 s)."""
    ids = prepare_prompt(lm.tokenizer, prompt, chat)
    trace = current_trace()
    if (trace is not None and trace.prompt == prompt and trace.settings.chat_template == chat
            and trace.model.name == lm.spec.name and tuple(ids) != trace.prompt_token_ids):
        raise InputError(_("this run's prompt text is {n} tokens but the run recorded {m}: its "
                           "trace file was changed, so nothing was run on it").format(
            n=len(ids), m=len(trace.prompt_token_ids)))
    limit = config().limits.prompt_tokens
    if len(ids) > limit:
        raise InputError(_("the prompt is {n} tokens; the limit here is {limit}").format(
            n=len(ids), limit=limit))
    return ids


def ablation_form(model: SessionModel) -> None:
    spec = model.lm.spec
    prompt, chat = _prompt(spec.name)
    with st.form("ablate_form", border=False):
        text = st.text_area(_("Prompt"), prompt, height=80, key="ablate_prompt", max_chars=2000)
        c1, c2, c3 = st.columns([1, 2, 1])
        layer = c1.selectbox(_("Layer"), range(spec.layers), index=min(1, spec.layers - 1),
                             key="ablate_form_layer")
        heads = c2.multiselect(_("Heads to switch off"), range(spec.heads),
                               default=[min(5, spec.heads - 1)], key="ablate_heads",
                               help=_("Any of the layer's {n} query heads.").format(n=spec.heads))
        mlp = c3.checkbox(_("Its MLP too"), key="ablate_mlp",
                          help=_("Zero the layer's MLP output as well."))
        c4, c5 = st.columns(2)
        mean = c4.toggle(_("Mean instead of zero"), key="ablate_mean",
                         help=_("Set each head's output to its mean over the prompt's positions: "
                                "the head still adds its average, not what it read here."))
        chat = c5.toggle(_("Chat template"), chat, key="ablate_chat")
        go = st.form_submit_button(_("Switch off and re-run"), type="primary",
                                   icon=":material/power_settings_new:")
    if not go:
        return
    if not heads and not mlp:
        st.error(_("Nothing to switch off: pick heads, the MLP, or both."))
        return
    settings = replace(generation_settings(), chat_template=chat)

    def work(job: Job):
        experiment_ids(model.lm, text, chat)
        job.progress(0.2, _("Running the prompt with and without them…"))
        return ablate(model.lm, text, Ablation(layer, tuple(sorted(heads)), mlp, mean),
                      settings, NEW_TOKENS, model.weights, stop=job.stop)

    def keep(found) -> None:  # the attention compared first: a layer the ablation changed
        keep_whatif(ablation=found)
        after = [k for k in found.ablated_run.attention_layers if k > layer]
        if after:
            st.session_state["ablate_layer"] = after[0]

    run_experiment(work, progress=_("Switching off…"), cut=False, keep=keep)


def ablation_result(model: SessionModel | None) -> None:
    found = whatif_results().ablation
    if found is None:
        return
    a = found.ablation
    st.markdown(_("**{ablation}** on “{prompt}”").format(
        ablation=plain(a.describe()), prompt=plain(found.baseline_run.prompt[:80])))
    c1, c2 = st.columns(2)
    c1.metric(_("KL(before ‖ after), next token"), f"{found.kl:.4g} nats",
              help=_("Σ p·log(p/q) over the vocabulary: 0 = the same distribution."))
    c2.metric(_("Top-1 token"), _("changed") if found.top1_changed else _("unchanged"))
    names = (_("with every head"), _("switched off"))
    ids = list(dict.fromkeys([d["id"] for d in found.top(found.baseline)]
                             + [d["id"] for d in found.top(found.ablated)]))
    pieces = _pieces(found.baseline_run, found.ablated_run)
    rows = [{"token": shown_piece(pieces.get(i, f"#{i}")), "before": float(found.baseline[i]),
             "after": float(found.ablated[i])} for i in ids]
    rows.sort(key=lambda r: -max(r["before"], r["after"]))
    show_table(pd.DataFrame(rows), hide_index=True, column_config={
        "token": st.column_config.TextColumn(_("token")),
        "before": st.column_config.NumberColumn(_("p before"), format="%.4f"),
        "after": st.column_config.NumberColumn(_("p after"), format="%.4f")})
    st.caption(_("The next token's 10 most probable before and after, together ({n} tokens); "
                 "greedy text both ways over {new} tokens below.").format(n=len(rows),
                                                                          new=NEW_TOKENS))
    tokens_section(found.baseline_run, found.ablated_run, names, title=_("Text both ways"))
    if found.ablated_run.attention_layers:
        attention_section(found.baseline_run, found.ablated_run, names, prefix="ablate")
        if st.button(_("Open the ablated run on every page"), icon=":material/open_in_new:",
                     key="ablate_open"):
            keep_new_trace(found.ablated_run)
            st.success(_("The ablated run is now the run every page shows."))
    else:
        st.caption(_("Turn on Record attention in the sidebar to see the attention of both "
                     "runs."))


def _pieces(*runs: Trace) -> dict[int, str]:
    found: dict[int, str] = {}
    for run in runs:
        for step in run.steps:
            found.update(zip(step.top_ids.tolist(), step.top_pieces))
    return found


def sweep_form(model: SessionModel) -> None:
    spec = model.lm.spec
    prompt, chat = _prompt(spec.name)
    st.subheader(_("Which heads matter"))
    st.caption(_("Each head switched off alone, one at a time: how far the next token's "
                 "distribution moves (KL, nats). One forward per layer — a batch with one copy "
                 "of the prompt per head, copy h with head h off."))
    trace = current_trace()
    current = trace is not None and trace.model.name == spec.name
    if current:
        whose = (_("On “{prompt}” (the current run's prompt, chat template): the form above may "
                   "switch heads off on another.") if chat else
                 _("On “{prompt}” (the current run's prompt): the form above may switch heads "
                   "off on another."))
    else:
        whose = (_("On “{prompt}” (the example's prompt, chat template): the form above may "
                   "switch heads off on another.") if chat else
                 _("On “{prompt}” (the example's prompt): the form above may switch heads off "
                   "on another."))
    st.caption(plain(whose.format(prompt=prompt[:80])))
    with st.form("sweep_form", border=False):
        c1, c2, c3 = st.columns([2, 1, 1])
        scope = c1.radio(_("Heads"), list(SCOPES), horizontal=True, key="sweep_scope",
                         format_func=lambda v: _(SCOPES[v]),
                         help=_("Every layer: {layers} × {heads} heads.").format(
                             layers=spec.layers, heads=spec.heads))
        layer = c2.selectbox(_("Layer"), range(spec.layers), index=min(5, spec.layers - 1),
                             key="sweep_layer")
        mean = c3.toggle(_("Mean instead of zero"), key="sweep_mean")
        go = st.form_submit_button(_("Which heads matter?"), icon=":material/grid_view:")
    if not go:
        return
    layers = list(range(spec.layers)) if scope == "every layer" else [layer]

    def work(job: Job) -> HeadSweep:
        ids = experiment_ids(model.lm, prompt, chat)
        start = time.perf_counter()
        kl = head_sweep(model.lm, ids, layers, mean, say=job.say, stop=job.stop.is_set)
        done = all(np.isfinite(kl[k]).all() for k in layers)
        return HeadSweep(kl, prompt, mean, time.perf_counter() - start, done)

    run_experiment(work, progress=_("Switching heads off one at a time…"),
                   cut=lambda found: not found.complete,
                   keep=lambda found: keep_whatif(sweep=found))


def sweep_result() -> None:
    found = whatif_results().sweep
    if found is None:
        return
    show_chart(sweep_heatmap(found.kl), name="heads that matter")
    finite = np.where(np.isfinite(found.kl), found.kl, -1)
    top = np.dstack(np.unravel_index(np.argsort(-finite, axis=None)[:3], finite.shape))[0]
    best = ("、" if chinese() else ", ").join(_("layer {layer} head {head} ({kl} nats)").format(
        layer=int(k), head=int(h), kl=f"{finite[k, h]:.3g}") for k, h in top if finite[k, h] >= 0)
    swept = int(np.isfinite(found.kl).all(axis=1).sum())
    text = (ngettext("On “{prompt}”, mean ablation, {n} layer swept in {seconds} s. The heads "
                     "that move it most: {best}. KL = Σ p·log(p/q) of the next token, p with "
                     "every head, q with that head off.",
                     "On “{prompt}”, mean ablation, {n} layers swept in {seconds} s. The heads "
                     "that move it most: {best}. KL = Σ p·log(p/q) of the next token, p with "
                     "every head, q with that head off.", swept)
            if found.mean else
            ngettext("On “{prompt}”, zero ablation, {n} layer swept in {seconds} s. The heads "
                     "that move it most: {best}. KL = Σ p·log(p/q) of the next token, p with "
                     "every head, q with that head off.",
                     "On “{prompt}”, zero ablation, {n} layers swept in {seconds} s. The heads "
                     "that move it most: {best}. KL = Σ p·log(p/q) of the next token, p with "
                     "every head, q with that head off.", swept))
    st.caption(plain(text.format(prompt=found.prompt[:80], n=swept,
                                 seconds=f"{found.seconds:.1f}", best=best)))


def ablate_section(model: SessionModel | None) -> None:
    st.caption(_("Switch some of a layer's heads (or its MLP) off and run the prompt again: a "
                 "head's output is zeroed before the output projection, at every position. What "
                 "changes tells what it did here."))
    if model is None:
        st.info(_("Switching heads off runs the model: load it in the sidebar."))
    else:
        ablation_form(model)
    ablation_result(model)
    if model is not None:
        sweep_form(model)
    sweep_result()
    if config().hosted:
        st.caption(_("Hosted demo: a sweep stops at the per-click time limit; what was "
                     "measured is shown."))
