"""Timing: prefill versus decode, measured, and why one is compute-bound and the other memory-bound.

The page reads like its table of contents: `main()` at the bottom calls one function per section.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from charts.formatting import duration
from charts.formatting import rate as per_second
from charts.timing import point_name, roofline_chart, sweep_chart, timeline_chart
from engine import summarize
from engine.kernels.microbench import Ceilings, cached_ceilings, ceilings
from engine.timing.metrics import WARMUP_RULE, warmup_note
from engine.timing.roofline import FORWARD_ONLY, Work, timed_by, trace_points, utilization
from engine.timing.sweeps import (
    REPEATS,
    batch_rate,
    batch_timer,
    decode_rate,
    decode_timer,
    interleaved,
    prefill_rate,
    prefill_timer,
    sweep_points,
)
from i18n import N_, _
from ui.common import disturbance_warning, require_trace, show_chart
from ui.config import config
from ui.experiment import Job, run_experiment
from ui.record import keep_experiments
from ui.sections.timing_kernels import dtype_section, kernels_section
from ui.state import current_experiments, loaded_model
from ui.tables import show_table

Points = dict[str, tuple[Work, float]]
PHASE_WIDTH = 224  # px: the longest phase label ("decode, eager (static cache)") in full
BOUND_NAMES = {"compute": N_("compute"), "memory bandwidth": N_("memory bandwidth")}  # as shown


def summary_section(trace) -> None:
    """TTFT, ITL percentiles, TPOT and rates, their definitions, and the run on a time axis."""
    s = summarize(trace, skip_warmup=True)
    warm = warmup_note(s)
    cols = st.columns(7)
    cols[0].metric(_("TTFT"), duration(s.ttft_ms))
    cols[1].metric(_("ITL p50"), duration(s.itl_p50_ms), help=warm)
    cols[2].metric(_("ITL p90"), duration(s.itl_p90_ms), help=warm)
    cols[3].metric(_("ITL p99"), duration(s.itl_p99_ms), help=warm)
    cols[4].metric(_("TPOT"), duration(s.tpot_ms))
    cols[5].metric(_("Decode"), per_second(s.decode_tokens_per_s), help=warm)
    cols[6].metric(_("Prefill"), per_second(s.prefill_tokens_per_s))
    with st.expander(_("Definitions (as vLLM benchmark_serving and GenAI-Perf define them)")):
        st.markdown(_(
            "- **TTFT** — request to first output token: tokenization + prefill of the whole "
            "prompt.\n"
            "- **ITL** — the gap between two consecutive output tokens; one per token after the "
            "first.\n"
            "- **TPOT** — (end-to-end − TTFT) / (output tokens − 1).\n"
            "- **Decode rate** — decode steps ÷ their total time; **prefill rate** — prompt "
            "tokens ÷ prefill time.\n"
            "- **Warm-up rule** — {warmup_rule}").format(warmup_rule=_(WARMUP_RULE)))
    if s.warmup_step is not None:
        st.caption(_("Step {step} took {ms} ms: marked warm-up and left out of ITL and the decode "
                     "rate (the warm-up rule, under Definitions).").format(
                         step=s.warmup_step, ms=f"{s.warmup_ms:,.0f}"))
    show_chart(timeline_chart(trace), name="timeline")
    st.caption(_("TTFT comes from prefill: the whole prompt goes through the model in one pass. "
                 "After it, every token costs one decode step, and ITL is that step's time."))


def ceilings_control(trace, lm) -> Ceilings | None:
    """This machine's ceilings, read from its per-machine cache file (engine/kernels/microbench.py:
    measured once, kept across sessions); measured only when none is stored (the button) or on
    "Measure again". None until they are measured."""
    device = lm.device.type if lm is not None else "cpu"  # this machine's, not the file's
    dtype = (trace.model.dtype if trace.model.dtype in ("float32", "float16", "bfloat16")
             else "float32")
    ceil = cached_ceilings(device, dtype)  # a file: no turn, nothing measured
    label = _("Measure again") if ceil is not None else _("Measure this machine's ceilings")
    # a key: the label changes once measured, and a button of a new identity would be drawn
    # beside the old one (Streamlit keeps a replaced widget on screen until the run ends)
    if st.button(label, icon=":material/speed:", key="measure_ceilings",
                 help=_("Reads a 1 GB buffer and times a matmul (a few seconds). The figures "
                        "are kept for this machine; each measurement keeps the best ever "
                        "shown.")):
        ceil = run_experiment(lambda job: ceilings(device, dtype, refresh=True), cut=False,
                              spinner=_("Measuring memory bandwidth and matmul speed (a few "
                                        "seconds)…")) or ceil
    if ceil is not None:
        st.caption(_("Ceilings stored for this machine, measured {when} (read from its cache "
                     "file, not measured again each visit).").format(
                         when=ceil.measured_at.replace("T", " ")))
    return ceil


def roofline_points(trace, comparison) -> Points:
    """The trace's prefill and median decode step, and each decode kernel compared on it."""
    points = trace_points(trace)
    if comparison is not None:
        for name, itl in comparison.steps.items():
            label = "decode, eager (static cache)" if name == "eager" else f"decode, {name}"
            points[label] = (comparison.work, itl)
    return points


def work_table(points: Points, ceil: Ceilings | None) -> None:
    rows = []
    for name, (work, latency) in points.items():
        use = utilization(work, latency, ceil)
        row = {"phase": point_name(name), "GFLOPs": work.flops / 1e9, "MB moved": work.bytes / 1e6,
               "FLOP / byte": work.intensity, "time (ms)": latency,
               "achieved GFLOP/s": use.flop_s / 1e9, "achieved GB/s": use.bytes_s / 1e9}
        if ceil is not None:
            row.update({"MFU": use.mfu, "MBU": use.mbu,
                        "bound by": _(BOUND_NAMES.get(use.bound, use.bound))})
        rows.append(row)
    number = st.column_config.NumberColumn  # short headers: the phase and bound-by text fit
    show_table(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
        "phase": st.column_config.TextColumn(_("phase"), width=PHASE_WIDTH),
        "GFLOPs": number("GFLOPs", format="%.3g"),
        "MB moved": number("MB", format="%.1f", help=_("bytes moved, in MB")),
        "FLOP / byte": number("FLOP/B", format="%.3g", help=_("arithmetic intensity")),
        "time (ms)": number("ms", format="%.1f"),
        "achieved GFLOP/s": number("GFLOP/s", format="%.3g", help=_("achieved: FLOPs / time")),
        "achieved GB/s": number("GB/s", format="%.3g", help=_("achieved: bytes / time")),
        "MFU": number(format="percent"), "MBU": number(format="percent"),
        "bound by": st.column_config.TextColumn(_("bound by"), width=140)})


def roofline_section(trace, lm, comparison) -> Ceilings | None:
    """FLOPs, bytes and intensity per step (formulas shown), and the measured roofline."""
    st.subheader(_("Work per step and the roofline"))
    ceil = ceilings_control(trace, lm)
    points = roofline_points(trace, comparison)
    by = timed_by(trace)
    work_table(points, ceil)
    timing = (_("their model forward alone (sampling and recording left out)")
              if by == FORWARD_ONLY else
              _("their whole step time (this trace has no forward-only times: an older file)"))
    formulas = (_("E = vocab · hidden (one embedding table). FLOPs = 2 · (parameters − embedding "
                  "tables) · new tokens + 2 · E (LM head, last position) + 4 · layers · heads · "
                  "head_dim · Σ context. Bytes = the weights once per forward (an untied input "
                  "embedding: one row per new token) + the KV cache read. Intensity = FLOPs / "
                  "bytes. Time: the trace's steps are placed by {timing}; the kernel comparison "
                  "times its own decode steps.") if trace.model.tie_word_embeddings else
                _("E = vocab · hidden (one embedding table). FLOPs = 2 · (parameters − embedding "
                  "tables) · new tokens + 2 · E (LM head, last position) + 4 · layers · heads · "
                  "head_dim · Σ context. Bytes = the weights once per forward (an untied input "
                  "embedding: one row per new token) + the KV cache read. Intensity = FLOPs / "
                  "bytes. This model's LM head is a separate table (untied): it is read whole "
                  "every forward, while the input embedding is only looked up, one row (hidden · "
                  "bytes) per new token. Time: the trace's steps are placed by {timing}; the "
                  "kernel comparison times its own decode steps."))
    st.caption(formulas.format(timing=timing))
    if ceil is None:
        st.info(_("Press the button to measure this machine's memory bandwidth and matmul FLOP/s "
                  "and place both phases on its roofline."))
        return None
    show_chart(roofline_chart(ceil, points, by), name="roofline")
    st.caption(_("Ceilings measured on {device}: {bandwidth} GB/s read bandwidth (the best read "
                 "this machine has shown: 8 reads of 1 GB in 2 MB pages over 1.5 s per "
                 "measurement, and the reads between kernel-comparison runs), {flops} GFLOP/s "
                 "matmul ({dtype}). Left of the ridge a step cannot use the arithmetic units "
                 "fully: it waits on memory. A decode step reads every weight to produce one "
                 "token per sequence — that is why it is memory-bound, and why a busy CPU/GPU "
                 "utilization figure can mislead: the cores are busy waiting for bytes.").format(
                     device=ceil.device, bandwidth=f"{ceil.bandwidth_gb_s:.1f}",
                     flops=f"{ceil.matmul_tflop_s * 1e3:.0f}", dtype=ceil.dtype))
    return ceil


def _sweeps(lm) -> dict:
    """Title → (key, timer, rate, sizes, x title, y title, plot tokens/s). The titles stay
    English (N_: the buttons' keys and the charts' names are made of them); `_` where drawn."""
    limit = min(config().limits.prompt_tokens, 512)
    sizes = sorted(x for x in {16, 64, 128, 256, limit} if x <= limit)
    return {
        N_("Prompt length → TTFT"): ("prompt_length", prefill_timer(lm), prefill_rate, sizes,
                                     N_("prompt tokens"), N_("prefill time (ms)"), False),
        N_("Context → ITL"): ("context", decode_timer(lm), decode_rate,
                              [x for x in sizes if x != 64], N_("tokens already in the KV cache"),
                              N_("decode step (ms)"), False),
        N_("Batch → throughput"): ("batch", batch_timer(lm), batch_rate, [1, 2, 4, 8],
                                   N_("sequences decoded together (batch)"),
                                   N_("decode tokens/s (all sequences)"), True),
    }


def run_sweep(key: str, timer, rate, sizes: list[int], x_title: str) -> None:
    """Every size `REPEATS` times, round-robin; keeps the points (median + every repeat)."""
    total = REPEATS * len(sizes)

    def sweep(job: Job) -> list:
        found = []
        for m in interleaved(sizes, timer, REPEATS):
            found.append(m)
            job.progress(len(found) / total, _("Round {round} of {rounds}: {x_title} {size} → "
                                               "{ms} ms").format(
                round=m.repeat + 1, rounds=REPEATS, x_title=_(x_title), size=m.size,
                ms=f"{m.ms:.1f}"))
            if job.spent:
                break
        return sweep_points(found, rate)

    run_experiment(sweep, progress=_("Measuring…"), keep=lambda points: keep_experiments(
        sweeps={**current_experiments().sweeps, key: points}))


def sweeps_section(lm) -> None:
    """Prefill vs prompt length, decode vs context, throughput vs batch: run on demand."""
    st.subheader(_("Experiments"))
    if lm is None:
        st.info(_("Experiments run the model: load one in the sidebar."))
        return
    experiments = _sweeps(lm)
    tabs = st.tabs([_(name) for name in experiments])
    for tab, (name, spec) in zip(tabs, experiments.items()):
        key, timer, rate, sizes, x_title, y_title, as_rate = spec
        with tab:
            if st.button(_("Run: {name}").format(name=_(name)), key=f"run-{name}",
                         help=_("Each size ({sizes}) {repeats} times, round-robin over the "
                                "sizes; the chart shows the median and the min–max "
                                "spread.").format(sizes=", ".join(map(str, sizes)),
                                                  repeats=REPEATS)):
                run_sweep(key, timer, rate, sizes, x_title)
            found = current_experiments().sweeps.get(key)
            if found:
                show_chart(sweep_chart(found, _(x_title), _(y_title), as_rate),
                           name=f"sweep {x_title}")
                show_table(pd.DataFrame([{
                    "size": p.size, "median ms": round(p.ms, 2),
                    "min ms": round(p.ms_min, 2), "max ms": round(p.ms_max, 2),
                    "repeats": len(p.repeats_ms) or 1,
                    "tokens/s (median)": round(p.tokens_per_s, 1)} for p in found]),
                    hide_index=True, column_config={
                        "size": _("size"), "median ms": _("median ms"), "min ms": _("min ms"),
                        "max ms": _("max ms"), "repeats": _("repeats"),
                        "tokens/s (median)": _("tokens/s (median)")})
    st.caption(_("Each point is the median of its repeats, measured round-robin over the sizes "
                 "so that a change in the machine's load touches every size alike; the bars span "
                 "the fastest and slowest repeat. Prefill time grows with the prompt (more tokens "
                 "to compute). A decode step grows only slowly with the cache: it is dominated by "
                 "reading the weights. Batching reuses that same read for several sequences — "
                 "the reason serving engines batch."))


def main() -> None:
    """One container per section: a section that draws more in one run than in the next (a
    button's spinner and queue notice) moves nothing below it, so Streamlit never shows a later
    section twice (the old copy, faded, until the run ends, beside the new one)."""
    st.title(_("Prefill vs decode"))
    trace = require_trace()
    lm = loaded_model()
    comparison = current_experiments().decode_comparison  # on this trace (kernels_section)
    with st.container():
        summary_section(trace)
        disturbance_warning(trace)
    with st.container():
        ceil = roofline_section(trace, lm, comparison)
    with st.container():
        sweeps_section(lm)
    if lm is None:
        return
    with st.container():
        dtype_section(trace, lm)
    with st.container():
        kernels_section(trace, lm, comparison, ceil)


main()
