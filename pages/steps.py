"""Steps: every step of the current trace as a table — phase, token, latency, cache, probability."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from charts import piece_text
from engine import summarize
from pages.common import require_trace
from pages.state import plain

st.title("Steps")
trace = require_trace()

s = summarize(trace)
st.caption(f"{plain(trace.model.name)} on {plain(trace.device)} · {s.prompt_tokens} prompt tokens → "
           f"{s.output_tokens} generated · stop: {trace.stop_reason}")
cols = st.columns(4)
cols[0].metric("TTFT", f"{s.ttft_ms:.0f} ms" if s.ttft_ms is not None else "–")
cols[1].metric("ITL p50", f"{s.itl_p50_ms:.1f} ms" if s.itl_p50_ms is not None else "–")
cols[2].metric("ITL p90", f"{s.itl_p90_ms:.1f} ms" if s.itl_p90_ms is not None else "–")
cols[3].metric("TPOT", f"{s.tpot_ms:.1f} ms" if s.tpot_ms is not None else "–",
               help="(end-to-end − TTFT) / (output tokens − 1)")
table = pd.DataFrame([{
    "step": step.index, "phase": step.phase, "token": repr(piece_text(step.piece)),
    "id": step.token_id, "latency (ms)": round(step.latency_ms, 2),
    "context (tokens)": step.context_len, "KV cache (bytes)": step.kv_bytes,
    "p(chosen)": round(step.chosen_prob, 4), "rank": step.chosen_rank + 1,
} for step in trace.steps])
st.dataframe(table, hide_index=True, width="stretch")
st.caption("KV cache bytes are measured from the cache tensors; with the cache on they equal "
           f"2 · {trace.model.layers} layers · {trace.model.kv_heads} KV heads · "
           f"{trace.model.head_dim} head_dim · {trace.model.dtype_bytes} bytes · context tokens.")
