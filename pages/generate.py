"""Generate: type a prompt and watch the model run, token by token."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import streamlit as st

from charts import piece_text, step_chart, token_chips_html, topk_chart
from engine import EngineError, Run, TraceFormatError, summarize
from engine.metrics import replay_pace
from engine.tracecheck import check_viewable
from engine.tracefile import read_trace_file, trace_to_bytes
from pages.common import model_turn
from pages.state import (config, current_experiments, current_trace, generation_settings, keep,
                         keep_new_trace, loaded_model, message, plain)

SAMPLES = {s["title"]: s["prompt"] for s in
           json.loads((Path(__file__).parents[1] / "assets" / "sample_prompts.json").read_text())}
MAX_PROMPT_CHARS = 20_000  # far above any prompt the token limit lets through


def use_sample() -> None:
    st.session_state["prompt"] = SAMPLES[st.session_state["sample"]]


def load_upload() -> None:
    upload = st.session_state.get("upload")
    if upload is None:
        st.session_state.pop("upload_error", None)
        return
    try:
        if upload.size > config().limits.upload_mb << 20:
            raise TraceFormatError(f"the file is over {config().limits.upload_mb} MB")
        limits = config().limits
        opened = read_trace_file(upload.getvalue(), max_bytes=limits.trace_mb << 20)
        if not opened.trace.steps:
            raise TraceFormatError("this trace has no generated tokens to show")
        check_viewable(opened.trace, limits.trace_tokens)
        keep_new_trace(opened.trace, opened.experiments)
        st.session_state["replay"] = True
        st.session_state.pop("upload_error", None)
    except EngineError as err:
        st.session_state["upload_error"] = f"{upload.name[:120]}: {err}"


CHART_EVERY_S = 1.0  # live chart redraws at most this often: plotly redraws cost the CPU the model needs


def show(trace, chips, metrics, chart, tag: str, draw_chart: bool = True) -> None:
    """Draw a (possibly partial) trace into the live slots."""
    chips.markdown(token_chips_html(trace), unsafe_allow_html=True)
    s = summarize(trace)
    last = trace.itl_ms[-1] if trace.itl_ms else None
    with metrics.container():
        cols = st.columns(5)
        cols[0].metric("TTFT", "–" if s.ttft_ms is None else f"{s.ttft_ms:.0f} ms",
                       help="Time to first token: tokenization + prefill of the whole prompt.")
        cols[1].metric("Last ITL", "–" if last is None else f"{last:.0f} ms",
                       help="Inter-token latency: the gap before the latest token.")
        cols[2].metric("Mean ITL", "–" if s.itl_mean_ms is None else f"{s.itl_mean_ms:.0f} ms")
        cols[3].metric("Decode rate", "–" if s.decode_tokens_per_s is None
                       else f"{s.decode_tokens_per_s:.1f} tok/s", help="Decode steps ÷ their time.")
        cols[4].metric("KV cache", f"{trace.kv_bytes / 1024:,.0f} KiB",
                       help="Measured from the cache tensors (keys + values, every layer).")
    if draw_chart:
        chart.plotly_chart(step_chart(trace), width="stretch", key=f"steps-{tag}-{len(trace.steps)}")


st.title("Generate")
st.caption("Type a prompt and watch the model run: prefill reads the whole prompt in one pass, "
           "then decode produces one token per step, reusing the KV cache.")
st.selectbox("Sample prompts", list(SAMPLES), index=None, key="sample", on_change=use_sample,
             placeholder="Pick a sample prompt…")
with st.form("generate_form", border=False):
    prompt = st.text_area("Prompt", key="prompt", height=100, max_chars=MAX_PROMPT_CHARS,
                          placeholder="Ask the model something… (Ctrl+Enter to generate)")
    generate = st.form_submit_button("Generate", type="primary", icon=":material/play_arrow:")
stop = st.button("Stop", icon=":material/stop:", help="Stop the running generation; the tokens decoded so far "
                 "are kept.")

chips, metrics, chart = st.empty(), st.empty(), st.empty()
trace = current_trace()
if stop and trace is not None and trace.stop_reason == "running":
    trace = replace(trace, stop_reason="stopped")
    keep("trace", trace)

if generate:
    lm = loaded_model()
    if lm is None:
        st.error("No model is loaded yet — see the sidebar (it may still be loading). You can "
                 "still upload a trace below.")
    else:
        try:
            keep("prompt", prompt)
            budget = threading.Event()  # set when the hosted per-click budget is spent
            run = Run(lm, prompt, generation_settings(), stop_event=budget)
            try:
                with model_turn(budget):
                    drawn = 0.0
                    for step in run:
                        trace = run.trace()
                        if step.index == 0:
                            keep_new_trace(trace)  # results computed on the old trace go
                        else:
                            keep("trace", trace)
                        redraw = time.monotonic() - drawn >= CHART_EVERY_S
                        show(trace, chips, metrics, chart, "live", redraw)
                        drawn = time.monotonic() if redraw else drawn
            finally:
                if run.steps and run.stop_reason == "running":  # interrupted by Stop
                    keep("trace", replace(run.trace(), stop_reason="stopped"))
            if run.steps:
                trace = run.trace()
                if budget.is_set() and trace.stop_reason == "stopped":
                    trace = replace(trace, stop_reason="limit")
                keep("trace", trace)
        except EngineError as err:
            st.error(message(err))
elif trace is not None and st.session_state.pop("replay", False):
    st.caption("Replaying the recorded trace at its recorded pace (shortened to at most 20 s).")
    for n, wait in enumerate(replay_pace(trace), start=1):
        time.sleep(wait)
        show(trace.prefix(n), chips, metrics, chart, "replay", n % 8 == 1)

if trace is None:
    st.info("Generate a trace above, or upload one below to replay it.")
else:
    show(trace, chips, metrics, chart, "final")
    reason = {"eos": "the model ended its answer", "length": "the token limit was reached",
              "stopped": "you pressed Stop", "running": "still running",
              "limit": f"this demo's limit of {config().limits.click_s or 0:.0f} s of model time "
                       "per click was reached"}[trace.stop_reason]
    st.caption(f"{len(trace.steps)} tokens generated after a {len(trace.prompt_token_ids)}-token "
               f"prompt; stopped because {reason}. Model: {plain(trace.model.name)} on {plain(trace.device)}.")
    st.subheader("Why this token?")
    options = list(range(len(trace.steps)))
    if options:
        pick = st.select_slider(
            "Generated token", options, value=options[-1] if len(options) == 1 else 0,
            format_func=lambda i: f"{i}: {piece_text(trace.steps[i].piece)!r}", key="pick")
        step = trace.steps[pick]
        st.plotly_chart(topk_chart(step), width="stretch")
        if step.chosen_rank > 0:
            st.warning(f"Sampling drew the #{step.chosen_rank + 1} candidate "
                       f"(p = {step.chosen_prob:.3f}), not the most probable token.")
    found = current_experiments()  # read now: the data function runs outside this script run
    st.download_button("Download trace", data=lambda: trace_to_bytes(trace, found),
                       file_name="inference-explorer.trace.npz", mime="application/octet-stream",
                       help="The whole run (tokens, timings, attention, KV sizes) as one file, "
                            "with the experiment results computed on it: opened again, every "
                            "page shows them without rerunning anything.")

with st.expander("Replay a trace file", expanded=trace is None or "upload_error" in st.session_state):
    st.file_uploader("Trace file (.npz)", type=["npz"], key="upload", on_change=load_upload,
                     max_upload_size=config().limits.upload_mb,
                     help="A file from “Download trace”: it replays at the recorded pace, "
                          "no model needed.")
    if "upload_error" in st.session_state:
        st.error(message(st.session_state["upload_error"]))
    if trace is not None and st.button("Replay current trace"):
        st.session_state["replay"] = True
        st.rerun()
