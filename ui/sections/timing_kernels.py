"""The Prefill vs decode page's measured comparisons of one decode step: in float32, float16
and bfloat16 weights (`dtype_section`), and eager, compiled and in plain C (`kernels_section`)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from charts.timing import dtype_chart
from engine import EngineError
from engine.kernels.compiled import STATIC_CACHE_TOKENS, compare_decode
from engine.kernels.microbench import raise_bandwidth
from engine.kv.cachelab import check_sequence
from engine.timing.dtype_compare import DTYPES, DtypeComparison, compare_dtypes
from engine.timing.roofline import utilization
from ui.common import show_chart
from ui.config import config
from ui.experiment import Job, budget_note, run_experiment
from ui.record import keep_experiments
from ui.state import current_experiments, session_model
from ui.tables import show_table
from ui.text import plain

NEW_TOKENS = 32
DTYPE_TOKENS = 16  # per dtype and round: 3 dtypes × 2 rounds fit the hosted per-click budget
DTYPE_PROMPT = 64  # the trace's prompt, cut: the comparison times decode, not prefill


def _native():
    """(the float32 model's shared native decoder, "") or (None, why it cannot run). The kernel
    comparison keeps the weights at float32 whatever this session decodes with: it compares
    kernels, the Quantization page compares weights."""
    try:
        return session_model().reference_native_decoder(), ""
    except EngineError as err:
        return None, str(err)


def _compare(trace, lm, compile: bool) -> None:
    """The kernels on this trace's prompt; kept as the experiments' `decode_comparison`."""

    def work(job: Job):
        native, note = _native()
        lm = session_model().reference().lm
        if native is None and not compile:
            raise EngineError(f"The native step cannot run here: {note}")
        ids = list(trace.prompt_token_ids)[:STATIC_CACHE_TOKENS - NEW_TOKENS]
        check_sequence(lm, ids, config().limits.prompt_tokens)  # a file's ids, this model

        def progress(text: str, done: float) -> None:
            if job.spent:  # a part of the comparison is no comparison
                raise EngineError(budget_note(kept=False))
            job.progress(done, text)

        return lm, compare_decode(session_model().compiled_decoder(), ids, NEW_TOKENS,
                                  config().limits.kernel_rounds, say=progress, compile=compile,
                                  native=native, native_note=note)

    done = run_experiment(work, progress="Starting…", cut=False,
                          keep=lambda found: keep_experiments(decode_comparison=found[1]))
    if done is None:
        return
    lm, result = done
    if result.bandwidth_gb_s:  # a read between the runs may beat a ceiling read when slow
        raise_bandwidth(lm.device, result.bandwidth_gb_s)
    st.rerun()  # redraw the page: the roofline above gains the decode points


def kernel_table(comparison, ceil) -> list[dict]:
    """One row per decode step that ran: ITL, tokens/s, speed-up, bytes, GB/s and MBU (a share,
    shown as a percent like every MBU in the app); the rows, as drawn. Values stay unrounded:
    the columns' formats round what is shown."""
    rows = []
    for name, ms in comparison.steps.items():
        use = utilization(comparison.work, ms, ceil)
        rows.append({"decode step": name, "ITL (ms)": ms, "tokens/s": 1000 / ms,
                     "× eager": comparison.speedup(name), "MB moved": comparison.work.bytes / 1e6,
                     "achieved GB/s": use.bytes_s / 1e9, "MBU": use.mbu})
    number = st.column_config.NumberColumn
    show_table(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
        "ITL (ms)": number(format="%.1f"), "tokens/s": number(format="%.1f"),
        "× eager": number(format="%.2f×"), "MB moved": number(format="%.1f"),
        "achieved GB/s": number(format="%.1f"), "MBU": number(format="percent")})
    return rows


def kernels_section(trace, lm, comparison, ceil) -> None:
    """Buttons → compare (kept as the experiments' `decode_comparison`), then the table."""
    st.subheader("Kernels: eager, compiled and hand-written decode")
    st.caption("The bytes a decode step must read are fixed by the model; how close it gets to "
               "the bandwidth ceiling depends on the kernels. **Eager** PyTorch on a CPU runs "
               "each 1-row matrix product through a general GEMM and adds Python overhead around "
               "~2,000 small ops. **Compiled** (`torch.compile`: inductor, frozen weights, "
               "autotuned C++ kernels) fuses them. **Native C** is the whole step written out "
               "by hand (engine/kernels/native_decode.c, llama.cpp style): weights packed in 32-row "
               "blocks in 2 MB pages, streamed once, in one parallel region. Same model, same "
               "float32 weights whatever the sidebar's (this compares kernels; the Quantization "
               "page compares weights), same prompt, same greedy tokens — checked on every run.")
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
                          help="Compiles the decode step (the first time takes minutes on a small CPU), then "
                               f"decodes this trace's prompt (first "
                               f"{STATIC_CACHE_TOKENS - NEW_TOKENS} tokens) eagerly, compiled "
                               f"and natively, {NEW_TOKENS} tokens × "
                               f"{config().limits.kernel_rounds} paired rounds."):
            _compare(trace, lm, compile=True)
    if comparison is None:
        return
    rows = kernel_table(comparison, ceil)
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


def _compare_dtypes(trace, lm) -> None:
    """The dtypes on this trace's prompt; kept as the experiments' `dtype_comparison`."""
    rounds = config().limits.kernel_rounds

    def work(job: Job) -> DtypeComparison:
        ids = list(trace.prompt_token_ids)[:DTYPE_PROMPT]
        lm = session_model().reference().lm  # float32 copies are made from float32 weights
        check_sequence(lm, ids, config().limits.prompt_tokens)  # a file's ids, this model
        return compare_dtypes(lm, ids, DTYPE_TOKENS, rounds, say=job.say, stop=job.stop.is_set)

    run_experiment(work, progress="Starting…", cut=lambda found: found.rounds < rounds,
                   keep=lambda found: keep_experiments(dtype_comparison=found))


def _dtype_result(result: DtypeComparison) -> None:
    rows = [{"weights": r.dtype, "ms per token (median)": r.itl_ms,
             "min ms": min(r.round_ms), "max ms": max(r.round_ms),
             "time ÷ float32's": r.ratio, "tokens/s": 1000 / r.itl_ms,
             "greedy tokens = float32's": "yes" if r.same_tokens else "no"}
            for r in result.runs]
    number = st.column_config.NumberColumn
    show_table(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
        **{name: number(format="%.1f") for name in ("ms per token (median)", "min ms", "max ms",
                                                    "tokens/s")},
        "time ÷ float32's": number(format="%.2f×")})
    show_chart(dtype_chart(result), name="weight dtypes")
    fastest = min(result.runs, key=lambda r: r.itl_ms)
    differ = [r.dtype for r in result.runs if not r.same_tokens]
    st.markdown(
        f"On this machine **{fastest.dtype}** decoded fastest: "
        + ", ".join(f"{r.dtype} {r.itl_ms:.1f} ms ({r.ratio:.2f}× float32's time)"
                    for r in result.runs)
        + f" per token, median of {result.rounds} rounds of {result.new_tokens} tokens after a "
        f"{result.prompt_tokens}-token prompt. "
        + ("All dtypes chose the same greedy tokens as float32." if not differ else
           f"Greedy tokens differ from float32's in {', '.join(differ)}: rounding changed an "
           "argmax, and from there the continuations part."))
    others = [r for r in result.runs if r is not fastest]
    if any(min(r.round_ms) <= max(fastest.round_ms) for r in others):
        st.caption(f"The rounds' min–max ranges overlap: {fastest.dtype}'s lead is within this "
                   "machine's noise. Run the comparison again (an idle machine narrows them).")
    if result.source_dtype != "float32":
        st.caption(f"The loaded weights are {result.source_dtype}: the float32 copy holds the "
                   "same rounded values, widened.")


def dtype_section(trace, lm) -> None:
    """A measured answer to "does float16 decode faster here?": the loaded model's weights cast
    to each dtype, the same decode timed in paired, interleaved rounds."""
    st.subheader("Weights dtype: float32, float16 and bfloat16")
    st.caption("Half-width weights halve the bytes a decode step reads, but a CPU without native "
               "half-precision arithmetic converts every value back to float32 on the way in: "
               "whether that is faster is a property of this machine, so it is measured here. "
               "Each round decodes the trace's prompt (first "
               f"{DTYPE_PROMPT} tokens) greedily, {DTYPE_TOKENS} tokens, once per dtype, the "
               "order rotating between rounds; each dtype runs on a copy of the loaded weights "
               "cast to it, made for its run and dropped after it.")
    if st.button("Compare float32, float16 and bfloat16", icon=":material/compare_arrows:",
                 help=f"{len(DTYPES)} dtypes × {config().limits.kernel_rounds} rounds of "
                      f"{DTYPE_TOKENS} tokens (seconds to a minute on a laptop CPU)."):
        _compare_dtypes(trace, lm)
    held = current_experiments().dtype_comparison  # on this trace's prompt
    if held is not None:
        _dtype_result(held)
