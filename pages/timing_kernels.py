"""The Prefill vs decode page's kernel section: one decode step, eager, compiled and in plain C."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine import EngineError
from engine.cachelab import check_sequence
from engine.compiled import STATIC_CACHE_TOKENS, compare_decode
from engine.microbench import raise_bandwidth
from engine.roofline import utilization
from pages.common import BUDGET_NOTE, model_turn
from pages.state import config, keep_experiments, message, plain, session_model

NEW_TOKENS = 32


def _native():
    """(the shared native decoder, "") or (None, why it cannot run: NativeDecoder says)."""
    try:
        return session_model().native_decoder(), ""
    except EngineError as err:
        return None, str(err)


def _compare(trace, lm, compile: bool) -> None:
    bar = st.progress(0.0, text="Starting…")
    try:
        with model_turn() as stop:
            native, note = _native()
            if native is None and not compile:
                raise EngineError(f"The native step cannot run here: {note}")
            ids = list(trace.prompt_token_ids)[:STATIC_CACHE_TOKENS - NEW_TOKENS]
            check_sequence(lm, ids, config().limits.prompt_tokens)  # a file's ids, this model

            def progress(text: str, done: float) -> None:
                if stop.is_set():
                    raise EngineError(BUDGET_NOTE.format(s=config().limits.click_s)
                                      .replace("what was measured is shown", "try again"))
                bar.progress(done, text=text)

            result = compare_decode(session_model().compiled_decoder(), ids, NEW_TOKENS,
                                    config().limits.kernel_rounds, say=progress, compile=compile,
                                    native=native, native_note=note)
        keep_experiments(decode_comparison=result)
        if result.bandwidth_gb_s:  # a read between the runs may beat a ceiling read when slow
            raise_bandwidth(lm.device, result.bandwidth_gb_s)
    except EngineError as err:
        st.error(message(err))
    else:
        st.rerun()  # redraw the page: the roofline above gains the decode points
    finally:
        bar.empty()


def kernels_section(trace, lm, comparison, ceil) -> None:
    """Buttons → compare (kept as the experiments' `decode_comparison`), then the table."""
    st.subheader("Kernels: eager, compiled and hand-written decode")
    st.caption("The bytes a decode step must read are fixed by the model; how close it gets to "
               "the bandwidth ceiling depends on the kernels. **Eager** PyTorch on a CPU runs "
               "each 1-row matrix product through a general GEMM and adds Python overhead around "
               "~2,000 small ops. **Compiled** (`torch.compile`: inductor, frozen weights, "
               "autotuned C++ kernels) fuses them. **Native C** is the whole step written out "
               "by hand (engine/native_decode.c, llama.cpp style): weights packed in 32-row "
               "blocks in 2 MB pages, streamed once, in one parallel region. Same model, same "
               "prompt, same greedy tokens — checked on every run.")
    if (lm.spec.name, lm.spec.dtype) != (trace.model.name, trace.model.dtype):
        st.info("This comparison runs the loaded model on this trace's prompt: load the model "
                "(and weights dtype) that made the trace.")
    else:
        left, right = st.columns(2)
        if left.button("Compare eager and native C", icon=":material/speed:",
                       help="Builds the C step once (seconds), then decodes this trace's prompt "
                            f"eagerly and natively, {NEW_TOKENS} tokens × "
                            f"{config().limits.kernel_rounds} paired rounds."):
            _compare(trace, lm, compile=False)
        if config().hosted:
            right.info("Compiling takes minutes and holds the shared model: run the app locally "
                       "to try it.")
        elif right.button("Compile and compare", icon=":material/bolt:",
                          help="Compiles the decode step (first time: ~3 min on 2 CPUs), then "
                               f"decodes this trace's prompt (first "
                               f"{STATIC_CACHE_TOKENS - NEW_TOKENS} tokens) eagerly, compiled "
                               f"and natively, {NEW_TOKENS} tokens × "
                               f"{config().limits.kernel_rounds} paired rounds."):
            _compare(trace, lm, compile=True)
    if comparison is None:
        return
    rows = []
    for name, ms in comparison.steps.items():
        use = utilization(comparison.work, ms, ceil)
        rows.append({"decode step": name, "ITL (ms)": ms, "tokens/s": 1000 / ms,
                     "× eager": comparison.speedup(name), "MB moved": comparison.work.bytes / 1e6,
                     "achieved GB/s": use.bytes_s / 1e9, "MBU": use.mbu})
    st.dataframe(pd.DataFrame(rows).round(3), hide_index=True, width="stretch")
    if any(row["MBU"] is not None and row["MBU"] > 1 for row in rows):
        st.warning("A step read faster than the measured ceiling: the ceiling was read in a slow "
                   "moment (this machine's bandwidth changes with time), or the weights fit in "
                   "the CPU caches (a tiny model). Measure the ceilings again.")
    faster = ", ".join(f"**{comparison.speedup(name):.1f}×** {name}"
                       for name in comparison.steps if name != "eager")
    compiled = ""
    if comparison.compiled_itl_ms is not None:
        compiled = (f"; compiling took {comparison.compile_s:.0f} s" if comparison.compile_s
                    else "; compiled earlier, reused")
    st.markdown(f"Per token vs eager: {faster}. Greedy tokens "
                f"{'identical' if comparison.same_tokens else '**different**'} in all "
                f"{comparison.rounds} rounds ({comparison.new_tokens} tokens after a "
                f"{comparison.prompt_tokens}-token prompt){compiled}.")
    if comparison.native_note:
        st.caption(f"Native C step not run: {plain(comparison.native_note)}.")
    if ceil is None:
        st.caption("Measure the ceilings above to see MBU = achieved GB/s ÷ measured bandwidth.")
