"""The Prefill vs decode page's measured comparisons of one decode step: in float32, float16
and bfloat16 weights (`dtype_section`), and eager, compiled and in plain C (`kernels_section`).
A model opened from a GGUF file runs on its stored blocks: no float weights to cast or to freeze
into a compiled graph, so those two say why in one line and eager vs native C still runs."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from charts.timing import dtype_chart
from engine import EngineError
from engine.kernels.compiled import COMPILE_MAPPED, STATIC_CACHE_TOKENS, compare_decode
from engine.kernels.microbench import raise_bandwidth
from engine.kv.cachelab import check_sequence
from engine.loader import is_mapped_model
from engine.timing.dtype_compare import DTYPES, DTYPES_MAPPED, DtypeComparison, compare_dtypes
from engine.timing.roofline import utilization
from i18n import N_, _
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
            raise EngineError(_("The native step cannot run here: {note}").format(note=note))
        ids = list(trace.prompt_token_ids)[:STATIC_CACHE_TOKENS - NEW_TOKENS]
        check_sequence(lm, ids, config().limits.prompt_tokens)  # a file's ids, this model

        def progress(text: str, done: float) -> None:
            if job.spent:  # a part of the comparison is no comparison
                raise EngineError(budget_note(kept=False))
            job.progress(done, text)

        return lm, compare_decode(session_model().compiled_decoder(), ids, NEW_TOKENS,
                                  config().limits.kernel_rounds, say=progress, compile=compile,
                                  native=native, native_note=note)

    done = run_experiment(work, progress=_("Starting…"), cut=False,
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
    number = st.column_config.NumberColumn  # the columns keep their names; headers translated
    show_table(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
        "decode step": st.column_config.TextColumn(_("decode step")),
        "ITL (ms)": number(_("ITL (ms)"), format="%.1f"),
        "tokens/s": number(_("tokens/s"), format="%.1f"),
        "× eager": number(_("× eager"), format="%.2f×"),
        "MB moved": number(_("MB moved"), format="%.1f"),
        "achieved GB/s": number(_("achieved GB/s"), format="%.1f"),
        "MBU": number(_("MBU"), format="percent")})
    return rows


def kernels_section(trace, lm, comparison, ceil) -> None:
    """Buttons → compare (kept as the experiments' `decode_comparison`), then the table."""
    st.subheader(_("Kernels: eager, compiled and hand-written decode"))
    st.caption(_("The bytes a decode step must read are fixed by the model; how close it gets to "
                 "the bandwidth ceiling depends on the kernels. **Eager** PyTorch on a CPU runs "
                 "each 1-row matrix product through a general GEMM and adds Python overhead "
                 "around ~2,000 small ops. **Compiled** (`torch.compile`: inductor, frozen "
                 "weights, autotuned C++ kernels) fuses them. **Native C** is the whole step "
                 "written out by hand (engine/kernels/native_decode.c, llama.cpp style): weights "
                 "packed in 32-row blocks in 2 MB pages, streamed once, in one parallel region. "
                 "Same model, same float32 weights whatever the sidebar's (this compares "
                 "kernels; the Quantization page compares weights), same prompt, same greedy "
                 "tokens — checked on every run."))
    if (lm.spec.name, lm.spec.dtype) != (trace.model.name, trace.model.dtype):
        st.info(_("This comparison runs the loaded model on this trace's prompt: load the model "
                  "(and weights dtype) that made the trace."))
    else:
        left, right = st.columns(2)
        rounds = config().limits.kernel_rounds
        if left.button(_("Compare eager and native C"), icon=":material/speed:",
                       key="compare_native",
                       help=_("Builds the C step once (seconds), then decodes this trace's "
                              "prompt eagerly and natively, {tokens} tokens × {rounds} paired "
                              "rounds.").format(tokens=NEW_TOKENS, rounds=rounds)):
            _compare(trace, lm, compile=False)
        if is_mapped_model(lm.model):
            right.info(_(COMPILE_MAPPED))
        elif config().hosted:
            right.info(_("Compiling takes minutes and holds the shared model: run the app "
                         "locally to try it."))
        elif right.button(_("Compile and compare"), icon=":material/bolt:", key="compare_compiled",
                          help=_("Compiles the decode step (the first time takes minutes on a "
                                 "small CPU), then decodes this trace's prompt (first {prompt} "
                                 "tokens) eagerly, compiled and natively, {tokens} tokens × "
                                 "{rounds} paired rounds.").format(
                                     prompt=STATIC_CACHE_TOKENS - NEW_TOKENS, tokens=NEW_TOKENS,
                                     rounds=rounds)):
            _compare(trace, lm, compile=True)
    if comparison is None:
        return
    rows = kernel_table(comparison, ceil)
    if any(row["MBU"] is not None and row["MBU"] > 1 for row in rows):
        st.warning(_("A step read faster than the measured ceiling: the ceiling was read in a "
                     "slow moment (this machine's bandwidth changes with time), or the weights "
                     "fit in the CPU caches (a tiny model). Measure the ceilings again."))
    faster = ", ".join(f"**{comparison.speedup(name):.1f}×** {name}"
                       for name in comparison.steps if name != "eager")
    compiled = ""
    if comparison.compiled_itl_ms is not None:
        compiled = (_("; compiling took {s} s").format(s=f"{comparison.compile_s:.0f}")
                    if comparison.compile_s else _("; compiled earlier, reused"))
    same = (_("Per token vs eager: {faster}. Greedy tokens identical in all {rounds} rounds "
              "({tokens} tokens after a {prompt}-token prompt){compiled}.")
            if comparison.same_tokens else
            _("Per token vs eager: {faster}. Greedy tokens **different** in all {rounds} rounds "
              "({tokens} tokens after a {prompt}-token prompt){compiled}."))
    st.markdown(same.format(faster=faster, rounds=comparison.rounds,
                            tokens=comparison.new_tokens, prompt=comparison.prompt_tokens,
                            compiled=compiled))
    if comparison.native_note:
        st.caption(_("Native C step not run: {why}.").format(why=plain(comparison.native_note)))
    if ceil is None:
        st.caption(_("Measure the ceilings above to see MBU = achieved GB/s ÷ measured "
                     "bandwidth."))


def _compare_dtypes(trace, lm) -> None:
    """The dtypes on this trace's prompt; kept as the experiments' `dtype_comparison`."""
    rounds = config().limits.kernel_rounds

    def work(job: Job) -> DtypeComparison:
        ids = list(trace.prompt_token_ids)[:DTYPE_PROMPT]
        lm = session_model().reference().lm  # float32 copies are made from float32 weights
        check_sequence(lm, ids, config().limits.prompt_tokens)  # a file's ids, this model
        return compare_dtypes(lm, ids, DTYPE_TOKENS, rounds, say=job.say, stop=job.stop.is_set)

    run_experiment(work, progress=_("Starting…"), cut=lambda found: found.rounds < rounds,
                   keep=lambda found: keep_experiments(dtype_comparison=found))


def _dtype_result(result: DtypeComparison) -> None:
    rows = [{"weights": r.dtype, "ms per token (median)": r.itl_ms,
             "min ms": min(r.round_ms), "max ms": max(r.round_ms),
             "time ÷ float32's": r.ratio, "tokens/s": 1000 / r.itl_ms,
             "greedy tokens = float32's": _("yes") if r.same_tokens else _("no")}
            for r in result.runs]
    number = st.column_config.NumberColumn  # the columns keep their names; headers translated
    show_table(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
        "weights": st.column_config.TextColumn(_("weights")),
        **{name: number(_(name), format="%.1f") for name in (
            N_("ms per token (median)"), N_("min ms"), N_("max ms"), N_("tokens/s"))},
        "time ÷ float32's": number(_("time ÷ float32's"), format="%.2f×"),
        "greedy tokens = float32's": st.column_config.TextColumn(
            _("greedy tokens = float32's"))})
    show_chart(dtype_chart(result), name="weight dtypes")
    fastest = min(result.runs, key=lambda r: r.itl_ms)
    differ = [r.dtype for r in result.runs if not r.same_tokens]
    times = ", ".join(_("{dtype} {ms} ms ({ratio}× float32's time)").format(
        dtype=r.dtype, ms=f"{r.itl_ms:.1f}", ratio=f"{r.ratio:.2f}") for r in result.runs)
    verdict = (_("All dtypes chose the same greedy tokens as float32.") if not differ else
               _("Greedy tokens differ from float32's in {dtypes}: rounding changed an argmax, "
                 "and from there the continuations part.").format(dtypes=", ".join(differ)))
    st.markdown(_("On this machine **{fastest}** decoded fastest: {times} per token, median of "
                  "{rounds} rounds of {tokens} tokens after a {prompt}-token prompt. "
                  "{verdict}").format(fastest=fastest.dtype, times=times, rounds=result.rounds,
                                      tokens=result.new_tokens, prompt=result.prompt_tokens,
                                      verdict=verdict))
    others = [r for r in result.runs if r is not fastest]
    if any(min(r.round_ms) <= max(fastest.round_ms) for r in others):
        st.caption(_("The rounds' min–max ranges overlap: {dtype}'s lead is within this "
                     "machine's noise. Run the comparison again (an idle machine narrows "
                     "them).").format(dtype=fastest.dtype))
    if result.source_dtype != "float32":
        st.caption(_("The loaded weights are {dtype}: the float32 copy holds the same rounded "
                     "values, widened.").format(dtype=result.source_dtype))


def dtype_section(trace, lm) -> None:
    """A measured answer to "does float16 decode faster here?": the loaded model's weights cast
    to each dtype, the same decode timed in paired, interleaved rounds."""
    st.subheader(_("Weights dtype: float32, float16 and bfloat16"))
    st.caption(_("Half-width weights halve the bytes a decode step reads, but a CPU without "
                 "native half-precision arithmetic converts every value back to float32 on the "
                 "way in: whether that is faster is a property of this machine, so it is "
                 "measured here. Each round decodes the trace's prompt (first {prompt} tokens) "
                 "greedily, {tokens} tokens, once per dtype, the order rotating between rounds; "
                 "each dtype runs on a copy of the loaded weights cast to it, made for its run "
                 "and dropped after it.").format(prompt=DTYPE_PROMPT, tokens=DTYPE_TOKENS))
    if is_mapped_model(lm.model):
        st.info(_(DTYPES_MAPPED))
    elif st.button(_("Compare float32, float16 and bfloat16"), icon=":material/compare_arrows:",
                 key="compare_dtypes",
                 help=_("{dtypes} dtypes × {rounds} rounds of {tokens} tokens (seconds to a "
                        "minute on a laptop CPU).").format(
                            dtypes=len(DTYPES), rounds=config().limits.kernel_rounds,
                            tokens=DTYPE_TOKENS)):
        _compare_dtypes(trace, lm)
    held = current_experiments().dtype_comparison  # on this trace's prompt
    if held is not None:
        _dtype_result(held)
