"""Generate: type a prompt, watch the model produce tokens (minimal first version)."""

import streamlit as st

from engine import EngineError, GenerationSettings, Run, load_model, summarize


@st.cache_resource(show_spinner="Loading the model (first run converts the GGUF, ~30 s)…")
def get_model():
    return load_model()


st.title("Inference Explorer")
with st.form("generate"):
    prompt = st.text_area("Prompt", "What is the capital of France?")
    max_new = st.number_input("Max new tokens", 1, 256, 32)
    go = st.form_submit_button("Generate", type="primary")

if go:
    try:
        run = Run(get_model(), prompt, GenerationSettings(max_new_tokens=int(max_new)))
        out = st.empty()
        for _ in run:
            out.markdown(run.trace().output_text)
        st.session_state["trace"] = run.trace()
    except EngineError as err:
        st.error(str(err))

trace = st.session_state.get("trace")
if trace is not None:
    s = summarize(trace)
    cols = st.columns(4)
    cols[0].metric("TTFT", f"{s.ttft_ms:.0f} ms")
    cols[1].metric("ITL p50", "n/a" if s.itl_p50_ms is None else f"{s.itl_p50_ms:.0f} ms")
    cols[2].metric("Decode", "n/a" if s.decode_tokens_per_s is None else f"{s.decode_tokens_per_s:.1f} tok/s")
    cols[3].metric("KV cache", f"{trace.kv_bytes / 1024:.0f} KiB")
    st.write(trace.output_text)
