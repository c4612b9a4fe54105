"""Steps: every step of the current trace as a table — phase, token, timing, cache, probability."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from charts import piece_text
from charts.formatting import duration, stop_reason
from charts.live import WARMUP_LABEL
from engine import Trace, summarize
from engine.timing.disturbance import assess, cpu_share, expected_threads
from engine.timing.metrics import warmup_note, warmup_step
from i18n import _
from ui.common import disturbance_warning, require_trace
from ui.tables import show_table
from ui.text import plain


def _ms(value: float | None, digits: int = 1) -> float | None:
    return round(value, digits) if value is not None else None


def summary(trace: Trace) -> None:
    s = summarize(trace, skip_warmup=True)
    st.caption(_("{model} on {device} · {prompt} prompt tokens → {output} generated · stop: "
                 "{stop}").format(model=plain(trace.model.name), device=plain(trace.device),
                                  prompt=s.prompt_tokens, output=s.output_tokens,
                                  stop=stop_reason(trace.stop_reason)))
    cols = st.columns(4)
    cols[0].metric("TTFT", duration(s.ttft_ms))
    cols[1].metric("ITL p50", duration(s.itl_p50_ms), help=warmup_note(s))
    cols[2].metric("ITL p90", duration(s.itl_p90_ms), help=warmup_note(s))
    cols[3].metric("TPOT", duration(s.tpot_ms), help=_("(end-to-end − TTFT) / (output tokens − 1)"))


def step_table(trace: Trace) -> None:
    threads, delayed = expected_threads(trace), set(assess(trace).delayed_steps)
    warm = warmup_step(trace)
    table = pd.DataFrame([{
        "step": step.index, "phase": step.phase, "token": repr(piece_text(step.piece)),
        "id": step.token_id, "wall (ms)": _ms(step.latency_ms, 2),
        "forward (ms)": _ms(step.forward_ms, 2), "CPU (ms)": _ms(step.cpu_ms),
        "CPU share": _ms(cpu_share(step, threads), 2),
        "others' CPU": _ms(step.others_share, 2),
        "timing": "; ".join(note for note, marked in (
            (_("⚠ delayed by other work"), step.index in delayed),
            (_(WARMUP_LABEL), step.index == warm)) if marked),
        "context (tokens)": step.context_len, "KV cache (bytes)": step.kv_bytes,
        "p(chosen)": round(step.chosen_prob, 4), "rank": step.chosen_rank + 1,
    } for step in trace.steps])
    # the columns keep their English names (tests and downloads read them); the header shows
    # each one's label
    show_table(table, hide_index=True, width="stretch", column_config={
        "step": st.column_config.NumberColumn(_("step")),
        "phase": st.column_config.TextColumn(_("phase")),
        "token": st.column_config.TextColumn(_("token")),
        "id": st.column_config.NumberColumn(_("id")),
        "wall (ms)": st.column_config.NumberColumn(
            _("wall (ms)"), help=_("The whole step: forward, sampling, recording (wall clock; "
                                   "GPU: synchronized)")),
        "forward (ms)": st.column_config.NumberColumn(_("forward (ms)"),
                                                      help=_("The model forward alone")),
        "CPU (ms)": st.column_config.NumberColumn(
            _("CPU (ms)"), help=_("CPU time this process used during the step, all threads "
                                  "together")),
        "CPU share": st.column_config.NumberColumn(
            _("CPU share"), format="percent",
            help=_("CPU ms ÷ ({threads} threads × wall ms): how much of the CPU time it asked "
                   "for this process got").format(threads=threads)),
        "others' CPU": st.column_config.NumberColumn(
            _("others' CPU"), format="percent",
            help=_("Share of all CPUs' time other programs used during the step (/proc/stat "
                   "minus this process)")),
        "timing": st.column_config.TextColumn(_("timing"), width="medium"),
        "context (tokens)": st.column_config.NumberColumn(_("context (tokens)")),
        "KV cache (bytes)": st.column_config.NumberColumn(_("KV cache (bytes)")),
        "p(chosen)": st.column_config.NumberColumn(_("p(chosen)")),
        "rank": st.column_config.NumberColumn(_("rank")),
    })
    st.caption(_("KV cache bytes are measured from the cache tensors; with the cache on they "
                 "equal 2 · {layers} layers · {kv_heads} KV heads · {head_dim} head_dim · "
                 "{dtype_bytes} bytes · context tokens. Timing columns are empty for traces "
                 "recorded before they were measured.").format(
        layers=trace.model.layers, kv_heads=trace.model.kv_heads,
        head_dim=trace.model.head_dim, dtype_bytes=trace.model.dtype_bytes))


st.title(_("Steps"))
current = require_trace()
summary(current)
disturbance_warning(current)
step_table(current)
