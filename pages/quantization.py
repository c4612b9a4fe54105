"""Quantization: the loaded model's weights in fewer bits — bytes, speed and quality, measured."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from charts.quant import calculator_chart, overhead_chart, study_chart
from charts.tokens import chip, piece_text
from engine import LoadedModel
from engine.kernels.microbench import cached_ceilings, ceilings
from engine.loader import is_mapped_model
from engine.quant import VARIANT_NAMES
from engine.quant.calculator import (
    EXPLAINER_FORMATS,
    IDEAL_BITS,
    cited_models,
    explainer_table,
    group_overhead,
    llama_param_count,
    model_weights,
)
from engine.quant.kmix import BITS_TEXT, STORAGE_TEXT
from engine.quant.scheme import FORMATS, shown_storage
from engine.quant.study import (
    DEFAULT_VARIANTS,
    HOSTED_VARIANTS,
    KV_FORMULA,
    STUDY_MAPPED,
    QuantStudy,
    StudyPlan,
    default_plan,
    shown_note,
)
from engine.quant.variants import SCOPE
from engine.timing.disturbance import ADVICE
from i18n import N_, _
from ui.common import show_chart
from ui.config import config
from ui.experiment import Job, budget_note, run_experiment
from ui.record import keep_experiments
from ui.sections.file_tensors import file_tensors
from ui.sections.quant_drift import where_the_error_enters
from ui.state import current_experiments, loaded_model, reference_model
from ui.tables import show_table
from ui.text import plain

# Llama-style shapes from each config.json that assets/kv_models.json links (hidden, FFN,
# layers, heads, KV heads, head_dim, vocabulary, tied): the parameter count is computed from them
# by llama_param_count. Gemma-2 (extra norms) and DeepSeek-V3 (mixture of experts) are not this
# shape and are left out rather than miscounted.
CONFIGS = {
    "Llama-2-7B": (4096, 11008, 32, 32, 32, 128, 32000, False),
    "Llama-2-13B": (5120, 13824, 40, 40, 40, 128, 32000, False),
    "Llama-3-8B": (4096, 14336, 32, 32, 8, 128, 128256, False),
    "Llama-3-70B": (8192, 28672, 80, 64, 8, 128, 128256, False),
    "Mistral-7B-v0.1": (4096, 14336, 32, 32, 8, 128, 32000, False),
}
# the decoders that time a step (engine/quant/study.py), as the results table names them
# ("torch eager" is torch's own mode name: kept)
DECODERS = {"native": N_("native")}
CALC_FORMATS = ("fp32", "fp16", "int8", "q4_0", "q4_1", "q3")
STORAGE = {"fp32": N_("float32 (the reference)"), "fp16": "float16", "bf16": "bfloat16",
           **{name: fmt.shown() for name, fmt in FORMATS.items()}, **STORAGE_TEXT}


def what_is_quantized(lm: LoadedModel | None, study: QuantStudy | None) -> None:
    st.subheader(_("What is quantized"))
    st.markdown(_("Every variant changes {scope}. Weights are rounded to the nearest point of "
                  "the format's grid in groups of consecutive weights along a row; each group "
                  "stores its own scale (and minimum), which is what the bytes add beyond "
                  "params × bits / 8.").format(scope=_(SCOPE)))
    rows = [{_("variant"): name, _("decoder Linear weights stored as"):
             _(STORAGE.get(name.removeprefix("awq_"), name)),
             _("bits per weight (codes + scales)"): _bits(name)} for name in VARIANT_NAMES]
    show_table(pd.DataFrame(rows), hide_index=True, width="stretch")
    st.caption(_("awq_…: the same format after an AWQ-style search for per-input-channel scales "
                 "on a calibration text (engine/quant/awq.py); the scales are folded into the "
                 "norms, so the stored bytes are the base format's."))
    file_tensors(lm)
    gguf = lm is not None and "GGUF" in lm.spec.name
    if gguf:
        st.markdown(_("**This model comes from a Q4_1 GGUF file.** Its decoder weights were "
                      "stored as 4-bit codes with a float16 scale and minimum per 32 weights, and "
                      "the float32 values the app loads are those codes dequantized: they already "
                      "lie on a 4-bit grid. So re-quantizing to Q4_1 with the file's own groups "
                      "should give the same weights back, and any other grid should move them:"))
    if study is None:
        if lm is None or not is_mapped_model(lm.model):
            st.caption(_("Run the comparison below: it measures, on the loaded weights, which "
                         "grids rebuild them exactly."))
        return
    layers = (_("all layers") if study.grid_layers is None
              else _("layers {numbers}").format(numbers=", ".join(map(str, study.grid_layers))))
    grid = [{_("weights"): (_("decoder Linears ({layers})").format(layers=layers)
                            if i < len(study.grid) else _("embedding")),
             _("re-quantized to"): g.grid, _("max |change|"): g.max_abs_error,
             _("grid step (mean scale)"): g.mean_step, _("weights unchanged"): g.exact_fraction,
             _("lossless"): _("yes") if g.lossless else _("no")}
            for i, g in enumerate((*study.grid, *study.embedding_grid))]
    number = st.column_config.NumberColumn
    show_table(pd.DataFrame(grid), hide_index=True, width="stretch", column_config={
        _("max |change|"): number(format="%.3g"), _("grid step (mean scale)"): number(format="%.3g"),
        _("weights unchanged"): number(format="percent")})
    st.caption(_("Measured on the loaded tensors: |W − dequantize(quantize(W))| per weight. "
                 "Lossless means every weight came back bit for bit."))


def _bits(name: str) -> str:
    base = name.removeprefix("awq_")
    if base in FORMATS:
        fmt = FORMATS[base]
        return (_("8 + 16 / row length") if fmt.group is None
                else f"{fmt.bits} + {fmt.group_bits} / {fmt.group} = {fmt.bits_per_weight():g}")
    if base in BITS_TEXT:
        return _(BITS_TEXT[base])
    return str(IDEAL_BITS.get(base, 32))


def calculator(lm: LoadedModel | None) -> None:
    st.subheader(_("Calculator: weight bytes for any model"))
    billions = st.number_input(_("Parameters (billions)"), min_value=0.001, max_value=2000.0,
                               value=7.0, step=0.5, format="%.3f", key="quant_billions")
    params = billions * 1e9
    table = explainer_table(params)
    st.markdown(_("Ideal bytes = params × bits / 8: {sizes} (GB = 10⁹ bytes; {bits}).").format(
        sizes=" · ".join(f"{name} **{gb:,.4g} GB**" for name, gb in table),
        bits=", ".join(_("{format} {bits} bits").format(format=n, bits=IDEAL_BITS[n])
                       for n in EXPLAINER_FORMATS)))
    counts = {name: llama_param_count(*shape) for name, shape in CONFIGS.items()}
    models = [model_weights(_("{billions}B parameters").format(billions=f"{billions:g}"),
                            round(params), formats=CALC_FORMATS)]
    models += [model_weights(m.name, m.params, m.source, formats=CALC_FORMATS)
               for m in cited_models(counts)]
    if lm is not None:
        models.append(model_weights(_("{model} (loaded)").format(model=lm.spec.name.split(" (")[0]),
                                    lm.spec.param_count, formats=CALC_FORMATS))
    show_chart(calculator_chart(models), name="weights per format")
    show_table(pd.DataFrame([{_("model"): m.name, _("parameters (B)"): m.params / 1e9,
                                **{f"{f} (GB)": gb for f, gb in m.gigabytes.items()}}
                               for m in models]).round(3), hide_index=True, width="stretch")
    st.caption(_("Stored bytes = params × (bits + scale bits / group) / 8, every weight in the "
                 "format (int8 here without its per-row scales: they need the row length). "
                 "Cited models: parameters computed by llama_param_count from each config.json "
                 "(hidden, FFN, layers, heads, KV heads, head_dim, vocabulary) linked in "
                 "assets/kv_models.json; Gemma-2 and DeepSeek-V3 are not Llama-shaped and are "
                 "left out."))
    show_chart(overhead_chart(group_overhead()), name="scale overhead per group size")
    st.caption(_("What the scales cost: a float16 scale per group adds 16 / group bits per "
                 "weight, a scale and a minimum 32 / group. Smaller groups follow the weights "
                 "more closely and cost more bits."))


def _bandwidth(lm: LoadedModel) -> float:
    """The read-bandwidth ceiling MBU is measured against: stored, else measured now (the
    Prefill vs decode page's ceilings, engine/kernels/microbench.py)."""
    found = cached_ceilings(lm.device)
    if found is None:
        found = ceilings(lm.device, megabytes=256 if config().hosted else 1024)
    return found.bandwidth_gb_s


def run_comparison(lm: LoadedModel | None) -> None:
    st.subheader(_("Run the comparison"))
    if lm is None:
        st.info(_("The comparison runs the model: load one in the sidebar."))
        return
    if is_mapped_model(lm.model):
        st.info(_(STUDY_MAPPED))
        return
    hosted = config().hosted
    plan = default_plan(hosted, lm.spec.layers)
    options = HOSTED_VARIANTS if hosted else VARIANT_NAMES
    chosen = st.multiselect(_("Weights variants"), options,
                            default=list(HOSTED_VARIANTS if hosted else DEFAULT_VARIANTS),
                            help=_("fp32 is always measured: it is the reference."),
                            key="quant_variants")
    per_variant = (_("Per variant: a quantized copy of the weights, perplexity and KL on the "
                     "Gettysburg Address (assets/texts/), {tokens} greedy tokens for {prompts} "
                     "sample prompt(s), timed step by step. About 5–10 s per variant on two "
                     "cores — this demo measures fewer variants, one prompt and three layers' "
                     "grids; run it locally for all.") if hosted else
                   _("Per variant: a quantized copy of the weights, perplexity and KL on the "
                     "Gettysburg Address (assets/texts/), {tokens} greedy tokens for {prompts} "
                     "sample prompt(s), timed step by step. About 5–10 s per variant on two "
                     "cores."))
    st.caption(per_variant.format(tokens=plan.new_tokens, prompts=len(plan.prompts)))
    if not st.button(_("Run the comparison"), icon=":material/compress:", type="primary",
                     key="quant_run"):
        return
    plan = StudyPlan(tuple(chosen) or ("fp32",), plan.prompts, plan.new_tokens, plan.grid_layers)

    reading = _("Reading this machine's memory bandwidth…")

    def study(job: Job) -> QuantStudy:
        from engine.quant.study import run_study

        ref = reference_model(lm)
        job.progress(0.0, reading)
        return run_study(ref, plan, _bandwidth(ref), say=job.say, stop=job.stop.is_set)

    with st.status(_("Measuring the variants…"), expanded=True) as status:
        found = run_experiment(study, progress=_("Starting…"), cut=False,
                               keep=lambda found: keep_experiments(quant_study=found))
        if found is None:  # the reason is shown in the status
            status.update(state="error", expanded=True)
            return
        status.update(label=_("Measured {n} variant(s)").format(n=len(found.variants)),
                      state="complete", expanded=False)
    st.rerun()  # redraw from the top: the grid check above is part of the study


def results_table(study: QuantStudy) -> None:
    rows = []
    for v in study.variants:
        r, s = v.report, v.speed
        decoder = _(DECODERS[s.decoder]) if s.decoder in DECODERS else s.decoder
        rows.append({
            _("variant"): v.name, _("MB measured"): r.nbytes / 1e6,
            _("MB by formula"): r.formula_bytes / 1e6,
            _("bits / weight"): r.quantized_bits_per_weight, _("perplexity"): v.perplexity,
            _("KL (nats)"): v.kl_mean, _("top-1"): v.top1_agreement, _("TTFT (ms)"): s.ttft_ms,
            _("ITL (ms)"): s.itl_ms, _("MB read / step"): s.bytes_per_step / 1e6,
            _("MBU"): s.mbu(study.bandwidth_gb_s),
            _("decoder"): (_("{decoder} (delayed)").format(decoder=decoder) if s.disturbed
                           else decoder)})
    number = st.column_config.NumberColumn
    # an HTML table: twelve columns read whole at 1440 px beside the sidebar, each cell wrapping
    # (a data grid would cut the last ones at its edge)
    show_table(pd.DataFrame(rows), hide_index=True, html=True, column_config={
        **{c: number(format="%.1f") for c in (_("MB measured"), _("MB by formula"),
                                                _("TTFT (ms)"), _("MB read / step"))},
        _("bits / weight"): number(format="%.2f"), _("perplexity"): number(format="%.3f"),
        _("KL (nats)"): number(format="%.4f"), _("top-1"): number(format="percent"),
        _("ITL (ms)"): number(format="%.2f"), _("MBU"): number(format="percent")})
    with st.expander(_("How each variant's bytes add up (storage and formula)")):
        show_table(pd.DataFrame([{_("variant"): v.name,
                                    _("decoder Linears stored as"): shown_storage(v.report.storage),
                                    _("bytes by formula"): v.report.formula,
                                    _("= bytes"): v.report.formula_bytes,
                                    _("measured bytes"): v.report.nbytes}
                                   for v in study.variants]), hide_index=True, width="stretch")
    ref = study.variants[0]
    bandwidth = (_("({gb_s} GB/s, measured)").format(gb_s=f"{study.bandwidth_gb_s:.1f}")
                 if study.bandwidth_gb_s else _("(not measured)"))
    st.caption(_(
        "Bytes measured: the stored tensors' nbytes (codes, scales, minimums, the embedding, "
        "the float32 norms); by formula: quantized params × bits / 8 (a K-quant mix: each "
        "Linear's params × its GGML type's code bits / 8) + scale bytes + embedding params × "
        "its bits / 8 + other params × 4 (each variant's below the table). "
        "Bits / weight: the decoder Linears' codes + scales per weight, measured. Quality on "
        "{text} ({text_tokens} tokens, teacher forcing): perplexity = exp(mean "
        "−log q(next token)) (fp32: {perplexity}; transformers' own loss agrees to "
        "{agreement}), KL = mean over positions of KL(fp32 ‖ variant), top-1 = "
        "share of positions with fp32's most probable token. TTFT: the prompt's forward "
        "(torch, median of the prompts); ITL: median decode step over "
        "{steps} steps. MB read / step = the weights the decoder streams + the KV "
        "cache ({kv_formula}); MBU = MB read / step ÷ ITL ÷ this machine's read bandwidth "
        "{bandwidth}.").format(
            text=study.text, text_tokens=study.text_tokens, perplexity=f"{ref.perplexity:.3f}",
            agreement=f"{_ppl_agreement(study):.1e}", steps=ref.speed.steps,
            kv_formula=_(KV_FORMULA), bandwidth=bandwidth))
    eager: dict[str, list[str]] = {}  # why torch ran them → the variants
    for v in study.variants:
        if v.speed.decoder != "native":
            eager.setdefault(v.speed.note, []).append(v.name)
    for note, names in eager.items():
        st.caption(_("{variants}: {note}.").format(variants=", ".join(names),
                                                   note=plain(shown_note(note))))
    delayed = [v for v in study.variants if v.speed.disturbed]
    if delayed:
        st.warning(_("Other programs used the CPUs while {variants} decoded: their TTFT and ITL "
                     "are slower than this machine's best (hatched in the chart). {advice}").format(
            variants=", ".join(f"{v.name} ({v.speed.others_share:.0%})" for v in delayed),
            advice=_(ADVICE)), icon=":material/speed:")
    if any((m := v.speed.mbu(study.bandwidth_gb_s)) is not None and m > 1 for v in study.variants):
        st.warning(_("A step read faster than the measured ceiling: the ceiling was read in a "
                     "slow moment, or the weights fit in the CPU caches. Measure the ceilings "
                     "again on the Prefill vs decode page."))
    if study.stopped:  # the note stays with the results it explains
        st.info(budget_note())


def _ppl_agreement(study: QuantStudy) -> float:
    return max(abs(v.perplexity - v.perplexity_transformers) / v.perplexity
               for v in study.variants)


def answers(study: QuantStudy) -> None:
    st.subheader(_("The answers side by side"))
    st.caption(_("Greedy answers (chat template on), cut after the end-of-turn token; the first "
                 "token that differs from fp32's is outlined in red."))
    for i, prompt in enumerate(study.prompts):
        st.markdown(f"**{plain(prompt)}**")
        lines = []
        for v in study.variants:
            first = study.first_difference(v.name, i) if v.name != "fp32" else None
            answer = v.answers[i]
            chips = "".join(chip(piece_text(p), _("{variant} · answer token {j} · id {id}").format(
                                     variant=v.name, j=j, id=t), "gen", marked=j == first)
                            for j, (t, p) in enumerate(zip(answer.tokens, answer.pieces)))
            same = (_("reference") if v.name == "fp32" else _("identical to fp32")
                    if first is None else _("differs from token {j}").format(j=first))
            lines.append(f'<div class="ie-chips"><b>{v.name}</b>&nbsp;<i>({same})</i>&nbsp;'
                         f'{chips}</div>')
        st.markdown("".join(lines), unsafe_allow_html=True)


def awq_callout(study: QuantStudy) -> None:
    pairs = study.awq_pairs()
    if not pairs:
        return
    st.subheader(_("What AWQ buys at the same bits"))
    for p in pairs:
        awq, base = study.result(p.awq), study.result(p.plain)
        ratio = ("" if p.kl_ratio is None
                 else _(" — {ratio}× plain rounding's KL").format(ratio=f"{p.kl_ratio:.2f}"))
        st.markdown(_(
            "**{awq}** vs **{plain}** (same format, same bytes: {awq_mb} vs {plain_mb} MB): mean "
            "KL {awq_kl} vs {plain_kl} nats{ratio}; perplexity {awq_ppl} vs {plain_ppl}; top-1 "
            "agreement {awq_top1} vs {plain_top1}.").format(
                awq=p.awq, plain=p.plain, awq_mb=f"{awq.report.nbytes / 1e6:.1f}",
                plain_mb=f"{base.report.nbytes / 1e6:.1f}", awq_kl=f"{awq.kl_mean:.4f}",
                plain_kl=f"{base.kl_mean:.4f}", ratio=ratio, awq_ppl=f"{awq.perplexity:.3f}",
                plain_ppl=f"{base.perplexity:.3f}", awq_top1=f"{awq.top1_agreement:.1%}",
                plain_top1=f"{base.top1_agreement:.1%}"))
    st.caption(_("AWQ scales each weight column by its input activation's typical size before "
                 "rounding (searched on a calibration text that is not the evaluation text), so "
                 "the channels that matter most are rounded most finely."))


def results(study: QuantStudy | None, lm: LoadedModel | None) -> None:
    if study is None:
        return
    if lm is not None and study.model != lm.spec.name:
        st.info(_("These results were measured on {model}; run the comparison again for the "
                  "model loaded now.").format(model=plain(study.model)))
    results_table(study)
    show_chart(study_chart(study), name="bytes speed and quality")
    st.caption(_("A decode step that streams its weights near the bandwidth ceiling (MBU near "
                 "100 %) is memory-bound: fewer bytes, less time. A step with a low MBU is limited "
                 "by something else — a low-bit step's unpacking arithmetic, for one — and "
                 "reading fewer bytes helps it less: compare ITL with MB read / step and MBU "
                 "above. A torch eager step reads float32 weights whatever the variant stores (no "
                 "fast low-bit kernel for it on this CPU), so its ITL does not fall with the "
                 "stored bytes. On a GPU the native step (a CPU kernel) does not run and every "
                 "variant is timed in torch on its dequantized weights; torchao's weight-only "
                 "int8/int4 kernels are not wired in (untested here)."))
    awq_callout(study)
    answers(study)


st.title(_("Quantization"))
st.caption(_("Weights in fewer bits: a 7B model is 28 GB in FP32 and 3.5 GB in INT4. Decode reads "
             "every weight once per token, so fewer bytes per weight means faster decode — at "
             "some cost in quality. Both measured here on the loaded model."))
LM = loaded_model()
STUDY = current_experiments().quant_study
what_is_quantized(LM, STUDY)
calculator(LM)
run_comparison(LM)
results(current_experiments().quant_study, LM)
where_the_error_enters(LM)
