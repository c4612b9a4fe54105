"""Quantization's "Where the error enters": each variant's drift from float32, layer by layer, on
the visitor's prompt (engine/quant/drift.py)."""

from __future__ import annotations

import streamlit as st

from charts.quant import NO_DRIFT, drift_chart
from engine import LoadedModel, Trace
from engine.loader import is_mapped_model
from engine.quant import VARIANT_NAMES
from engine.quant.drift import DRIFT_MAPPED, DriftStudy
from engine.quant.study import sample_prompts
from i18n import N_, _
from ui.common import show_chart
from ui.config import config
from ui.experiment import Job, run_experiment
from ui.record import keep_experiments
from ui.state import current_experiments, current_trace, reference_model
from ui.text import plain

DEFAULT = ("q8_0", "q4_0", "q4_1", "q3")
HOSTED = ("q8_0", "q4_0")  # two variants: a click's model time on a shared demo


def _prompt(lm: LoadedModel, trace: Trace | None) -> tuple[list[int], str]:
    """The current run's prompt as it ran (chat template and all), else the first sample prompt."""
    if trace is not None and trace.model.name == lm.spec.name:
        return list(trace.prompt_token_ids), f"your prompt “{trace.prompt[:60]}”"
    from engine.forward import prepare_prompt

    prompt = sample_prompts()[0]
    return prepare_prompt(lm.tokenizer, prompt, True), f"the sample prompt “{prompt}”"


# what `_prompt` stores in the study (its record stays English), as shown
SOURCES = (("your prompt “", N_("your prompt “{prompt}”")),
           ("the sample prompt “", N_("the sample prompt “{prompt}”")))


def source_text(source: str) -> str:
    """A study's `source` in the session's language (as stored when it is not one of ours)."""
    for start, shown in SOURCES:
        if source.startswith(start) and source.endswith("”"):
            return _(shown).format(prompt=source[len(start):-1])
    return source


def _measure(lm: LoadedModel, names: list[str]) -> None:
    ids, source = _prompt(lm, current_trace())

    def drift(job: Job) -> DriftStudy:
        from engine.quant.drift import measure_drift

        return measure_drift(reference_model(lm), names, ids, source,
                             say=lambda text, done: job.progress(done, text),
                             stop=job.stop.is_set)

    run_experiment(drift, progress=_("Reading float32's residual stream…"), cut=False,
                   keep=lambda found: keep_experiments(quant_drift=found))


def show_drift(study: DriftStudy) -> None:
    st.markdown(_("**What to notice:** {notice}").format(notice=plain(study.notice())))
    still = [d.variant for d in study.variants if d.fastest[1] <= NO_DRIFT]
    if still:
        st.caption(_("{variants}: no drift at any layer — its grid rebuilds these weights "
                     "exactly (the grid check under “What is quantized” shows which grids "
                     "do).").format(variants=", ".join(still)))
    show_chart(drift_chart(study), name="drift per layer")
    measured = _(
        "Measured on {source} ({tokens} tokens, every position; {model}). At layer l (0 = the "
        "embedding output, l = after decoder layer l): KL = mean over positions of KL(fp32 ‖ "
        "variant) of the logit lens, softmax(LM head(final norm(h_l))), in nats; cosine = mean "
        "over positions of cos(h_l fp32, h_l variant). The last layer's lens is the model's own "
        "output, so its KL is the one the table above measures (there on the Gettysburg "
        "Address).")
    if "GGUF" in study.model:
        measured = _(
            "Measured on {source} ({tokens} tokens, every position; {model}). At layer l (0 = "
            "the embedding output, l = after decoder layer l): KL = mean over positions of "
            "KL(fp32 ‖ variant) of the logit lens, softmax(LM head(final norm(h_l))), in nats; "
            "cosine = mean over positions of cos(h_l fp32, h_l variant). The last layer's lens "
            "is the model's own output, so its KL is the one the table above measures (there on "
            "the Gettysburg Address). The embedding is Q8_0 in every integer variant, as in this "
            "model's GGUF file, so it is lossless here: layer 0 reads 0.")
    st.caption(measured.format(source=plain(source_text(study.source)), tokens=study.tokens,
                               model=study.model))


def where_the_error_enters(lm: LoadedModel | None) -> None:
    st.subheader(_("Where the error enters"))
    st.caption(_("Each variant's model and float32's read the same tokens; at every layer the two "
                 "residual streams are compared, and what each would predict if it stopped there "
                 "(the logit lens). Rounding errors enter at every layer; this shows where they "
                 "grow."))
    study = current_experiments().quant_drift
    if lm is None:
        st.info(_("The drift is measured on the model: load one in the sidebar."))
    elif is_mapped_model(lm.model):
        st.info(_(DRIFT_MAPPED))
    else:
        hosted = config().hosted
        options = [n for n in VARIANT_NAMES if n != "fp32"]
        with st.form("drift_form", border=False):
            chosen = st.multiselect(_("Weights variants to follow"), options,
                                    default=list(HOSTED if hosted else DEFAULT),
                                    help=_("Each is a quantized copy of the weights (a few "
                                           "seconds each), read once on the prompt."),
                                    key="quant_drift_variants")
            trace = current_trace()
            st.caption(_("Reads the current run's prompt, one forward per variant.")
                       if trace is not None and trace.model.name == lm.spec.name else
                       _("Reads a sample prompt (no run yet), one forward per variant."))
            pressed = st.form_submit_button(_("Measure the drift per layer"),
                                            icon=":material/stacked_line_chart:",
                                            key="quant_drift_measure")
        if pressed and chosen:
            _measure(lm, chosen)
            study = current_experiments().quant_drift
        elif pressed:
            st.warning(_("Choose at least one variant."))
    if study is not None:
        if lm is not None and study.model != lm.spec.name:
            st.info(_("Measured on {model}; measure again for the model loaded now.").format(
                model=plain(study.model)))
        show_drift(study)
