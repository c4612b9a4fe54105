"""The Prefill vs decode page's kernel section: the same decode step eager and compiled."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine import EngineError
from engine.compiled import STATIC_CACHE_TOKENS, compare_decode
from engine.roofline import utilization
from pages.common import model_turn

NEW_TOKENS, ROUNDS = 32, 3


def kernels_section(trace, lm, key, comparison, ceil) -> None:
    """Button → compile and compare (stored as `decode_comparison` = (key, result)), then the table."""
    st.subheader("Kernels: eager vs compiled decode")
    st.caption("The bytes a decode step must read are fixed by the model; how close it gets to "
               "the bandwidth ceiling depends on the kernels. Eager PyTorch on a CPU runs each "
               "1-row matrix product through a general GEMM and adds Python overhead around "
               "~2,000 small ops; `torch.compile` (inductor, frozen weights, autotuned C++ GEMV "
               "kernels) fuses them. Same model, same cache, same greedy tokens — checked on "
               "every run.")
    if st.session_state.get("hosted"):
        st.info("Compiling takes minutes and holds the shared model: run the app locally to "
                "try it.")
    elif (lm.spec.name, lm.spec.dtype) != (trace.model.name, trace.model.dtype):
        st.info("This comparison runs the loaded model on this trace's prompt: load the model "
                "(and weights dtype) that made the trace.")
    elif st.button("Compile and compare", icon=":material/bolt:",
                   help="Compiles the decode step (first time: ~3 min on 2 CPUs), then decodes "
                        f"this trace's prompt (first {STATIC_CACHE_TOKENS - NEW_TOKENS} tokens) "
                        f"eagerly and compiled, {NEW_TOKENS} tokens × {ROUNDS} paired rounds."):
        bar = st.progress(0.0, text="Starting…")
        try:
            with model_turn():
                ids = list(trace.prompt_token_ids)[:STATIC_CACHE_TOKENS - NEW_TOKENS]
                result = compare_decode(st.session_state["compiled_decoder"](), ids, NEW_TOKENS,
                                        ROUNDS, say=lambda text, done: bar.progress(done, text=text))
            st.session_state["decode_comparison"] = (key, result)
        except EngineError as err:
            st.error(str(err))
        else:
            st.rerun()  # redraw the page: the roofline above gains both decode points
        finally:
            bar.empty()
    if comparison is None:
        return
    rows = []
    for name, ms in (("eager", comparison.eager_itl_ms), ("compiled", comparison.compiled_itl_ms)):
        use = utilization(comparison.work, ms, ceil)
        rows.append({"decode step": name, "ITL (ms)": ms, "tokens/s": 1000 / ms,
                     "MB moved": comparison.work.bytes / 1e6,
                     "achieved GB/s": use.bytes_s / 1e9, "MBU": use.mbu})
    st.dataframe(pd.DataFrame(rows).round(3), hide_index=True, width="stretch")
    compiled = (f"compiling took {comparison.compile_s:.0f} s" if comparison.compile_s
                else "compiled earlier, reused")
    st.markdown(f"**{comparison.speedup:.1f}×** faster per token compiled; greedy tokens "
                f"{'identical' if comparison.same_tokens else '**different**'} in all "
                f"{comparison.rounds} rounds ({comparison.new_tokens} tokens after a "
                f"{comparison.prompt_tokens}-token prompt); {compiled}.")
    if ceil is None:
        st.caption("Measure the ceilings above to see MBU = achieved GB/s ÷ measured bandwidth.")
