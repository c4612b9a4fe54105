"""Timing: prefill versus decode, measured, and why one is compute-bound and the other memory-bound."""

from __future__ import annotations

import statistics

import pandas as pd
import streamlit as st

from charts.timing import roofline_chart, sweep_chart, timeline_chart
from engine import summarize
from engine.microbench import cached_ceilings, ceilings
from engine.roofline import step_work, utilization
from engine.sweeps import batch_sweep, context_sweep, prompt_length_sweep
from pages.common import BUDGET_NOTE, model_turn, require_trace
from pages.state import config, current_experiments, keep_experiments, loaded_model
from pages.timing_kernels import kernels_section

st.title("Prefill vs decode")
trace = require_trace()
lm = loaded_model()


def ms(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f} ms"


s = summarize(trace)
cols = st.columns(7)
cols[0].metric("TTFT", ms(s.ttft_ms, 0))
cols[1].metric("ITL p50", ms(s.itl_p50_ms))
cols[2].metric("ITL p90", ms(s.itl_p90_ms))
cols[3].metric("ITL p99", ms(s.itl_p99_ms))
cols[4].metric("TPOT", ms(s.tpot_ms))
cols[5].metric("Decode", "–" if s.decode_tokens_per_s is None else f"{s.decode_tokens_per_s:.1f} tok/s")
cols[6].metric("Prefill", "–" if s.prefill_tokens_per_s is None
               else f"{s.prefill_tokens_per_s:,.0f} tok/s")
with st.expander("Definitions (as vLLM benchmark_serving and GenAI-Perf define them)"):
    st.markdown(
        "- **TTFT** — request to first output token: tokenization + prefill of the whole prompt.\n"
        "- **ITL** — the gap between two consecutive output tokens; one per token after the first.\n"
        "- **TPOT** — (end-to-end − TTFT) / (output tokens − 1).\n"
        "- **Decode rate** — decode steps ÷ their total time; **prefill rate** — prompt tokens ÷ "
        "prefill time.")
st.plotly_chart(timeline_chart(trace), width="stretch")
st.caption("TTFT comes from prefill: the whole prompt goes through the model in one pass. After "
           "it, every token costs one decode step, and ITL is that step's time.")

st.subheader("Work per step and the roofline")
device = lm.device.type if lm is not None else "cpu"  # this machine's ceilings, not the file's
dtype = trace.model.dtype if trace.model.dtype in ("float32", "float16", "bfloat16") else "float32"
measure = st.button("Measure this machine's ceilings", icon=":material/speed:",
                    help="Reads a 1 GB buffer and times a matmul (a few seconds). Each press "
                         "measures again; the best figures are kept.")
asked = st.session_state.get("ceilings_for") == (device, dtype)  # measured once this session
ceil = cached_ceilings(device, dtype) if asked and not measure else None  # no turn to read a file
if measure or (asked and ceil is None):
    with st.spinner("Measuring memory bandwidth and matmul speed (a few seconds)…"), model_turn():
        ceil = ceilings(device, dtype, refresh=measure)
    st.session_state["ceilings_for"] = (device, dtype)
steps = trace.steps
decode = [x for x in steps if x.phase == "decode"]
points = {"prefill": (step_work(trace, steps[0]), steps[0].latency_ms)}
if decode:
    mid = decode[len(decode) // 2]
    points["decode (median step)"] = (step_work(trace, mid), statistics.median(trace.itl_ms))
comparison = current_experiments().decode_comparison  # on this trace (from kernels_section)
if comparison is not None:
    for name, itl in comparison.steps.items():
        label = "decode, eager (static cache)" if name == "eager" else f"decode, {name}"
        points[label] = (comparison.work, itl)
rows = []
for name, (work, latency) in points.items():
    use = utilization(work, latency, ceil)
    row = {"phase": name, "GFLOPs": work.flops / 1e9, "MB moved": work.bytes / 1e6,
           "FLOP / byte": work.intensity, "time (ms)": latency,
           "achieved GFLOP/s": use.flop_s / 1e9, "achieved GB/s": use.bytes_s / 1e9}
    if ceil is not None:
        row.update({"MFU": use.mfu, "MBU": use.mbu, "bound by": use.bound})
    rows.append(row)
st.dataframe(pd.DataFrame(rows).round(3), hide_index=True, width="stretch")
st.caption("FLOPs = 2 · (parameters − vocab·hidden) · new tokens + 2 · vocab·hidden (LM head, last "
           "position) + 4 · layers · heads · head_dim · Σ context. Bytes = all weights once per "
           "forward + the KV cache read. Intensity = FLOPs / bytes.")
if ceil is None:
    st.info("Press the button to measure this machine's memory bandwidth and matmul FLOP/s "
            "and place both phases on its roofline.")
else:
    st.plotly_chart(roofline_chart(ceil, points), width="stretch")
    st.caption(f"Ceilings measured on {ceil.device}: {ceil.bandwidth_gb_s:.1f} GB/s read "
               "bandwidth (the best read this machine has shown: 8 reads of 1 GB in 2 MB pages "
               "over 1.5 s per measurement, and the reads between kernel-comparison runs), "
               f"{ceil.matmul_tflop_s * 1e3:.0f} GFLOP/s matmul ({ceil.dtype}). Left of "
               "the ridge a step cannot use the arithmetic units fully: it waits on memory. A "
               "decode step reads every weight to produce one token per sequence — that is why "
               "it is memory-bound, and why a busy CPU/GPU utilization figure can mislead: the "
               "cores are busy waiting for bytes.")

st.subheader("Experiments")
if lm is None:
    st.info("Experiments run the model: load one in the sidebar.")
    st.stop()
limit = min(config().limits.prompt_tokens, 512)
sizes_up_to = sorted(x for x in {16, 64, 128, 256, limit} if x <= limit)
experiments = {  # title: (key, sweep, sizes, x title, y title, plot tokens/s)
    "Prompt length → TTFT": ("prompt_length", prompt_length_sweep, sizes_up_to, "prompt tokens",
                             "prefill time (ms)", False),
    "Context → ITL": ("context", context_sweep, [x for x in sizes_up_to if x != 64],
                      "tokens already in the KV cache", "decode step (ms)", False),
    "Batch → throughput": ("batch", batch_sweep, [1, 2, 4, 8],
                           "sequences decoded together (batch)", "decode tokens/s (all sequences)",
                           True),
}
tabs = st.tabs(list(experiments))
for tab, (name, (key, sweep, sizes, x_title, y_title, rate)) in zip(tabs, experiments.items()):
    with tab:
        if st.button(f"Run: {name}", key=f"run-{name}"):
            bar, found = st.progress(0.0, text="Measuring…"), []
            with model_turn() as stop:
                for point in sweep(lm, sizes):
                    found.append(point)
                    bar.progress(len(found) / len(sizes),
                                 text=f"{x_title}: {point.size} → {point.ms:.1f} ms")
                    if stop.is_set():
                        st.info(BUDGET_NOTE.format(s=config().limits.click_s))
                        break
            keep_experiments(sweeps={**current_experiments().sweeps, key: tuple(found)})
            bar.empty()
        found = current_experiments().sweeps.get(key)
        if found:
            st.plotly_chart(sweep_chart(found, x_title, y_title, rate), width="stretch")
            st.dataframe(pd.DataFrame([{"size": p.size, "ms": round(p.ms, 2),
                                        "tokens/s": round(p.tokens_per_s, 1)} for p in found]),
                         hide_index=True)
st.caption("Prefill time grows with the prompt (more tokens to compute). A decode step grows only "
           "slowly with the cache: it is dominated by reading the weights. Batching reuses that "
           "same read for several sequences — the reason serving engines batch.")

kernels_section(trace, lm, comparison, ceil)
