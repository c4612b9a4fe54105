"""KV cache: what it saves, what it costs, and the tricks that shrink it — measured.

`page()` at the bottom reads like the page's table of contents: one function per tab.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from charts.kvcache import (
    blocks_chart,
    live_memory_chart,
    on_off_chart,
    on_off_rounds_chart,
    per_token_bars,
    recorded_blocks_chart,
    variant_chart,
)
from engine import LoadedModel, Trace
from engine.kv.cachelab import ROUNDS, OnOff, cache_on_off, compare_caches, on_off_notes, on_off_results
from engine.kv.kvcache import CacheConfig
from engine.kv.kvcalc import CACHE_DTYPES, from_spec, load_models
from engine.kv.paging import paged_layout
from engine.serving.metrics import peak_step
from engine.serving.record import ServingRun
from engine.timing.disturbance import RULE, advice
from i18n import N_, _
from ui import keys
from ui.common import no_trace_notice, show_chart
from ui.config import config
from ui.experiment import Job, run_experiment
from ui.kept_widgets import kept_tabs
from ui.record import keep_experiments
from ui.sections.kv_shrink import shrink_section
from ui.state import current_experiments, current_trace, last_serving_run, loaded_model
from ui.tables import show_table
from ui.text import plain

MAX_SEQUENCES, MAX_SEQUENCE = 12, 8192  # the block grid stays drawable
KV_MODELS = load_models(Path(__file__).parents[1] / "assets" / "kv_models.json")


def live_memory(trace: Trace | None) -> None:
    if trace is None or not trace.steps:
        no_trace_notice()
        return
    m = trace.model
    show_chart(live_memory_chart(trace), name="kv cache growth")
    last = trace.steps[-1]
    formula = (_("Formula: 2 · {layers} layers · {kv_heads} KV heads · {head_dim} head_dim · "
                 "{dtype_bytes} B · {tokens} tokens = **{formula} B**; measured from the tensors: "
                 "**{measured} B**") if trace.settings.kv_cache else
               _("Formula: 2 · {layers} layers · {kv_heads} KV heads · {head_dim} head_dim · "
                 "{dtype_bytes} B · {tokens} tokens = **{formula} B**; measured from the tensors: "
                 "**{measured} B** (cache off: nothing is kept)."))
    st.markdown(formula.format(layers=m.layers, kv_heads=m.kv_heads, head_dim=m.head_dim,
                               dtype_bytes=m.dtype_bytes, tokens=last.context_len,
                               formula=f"{m.kv_bytes(last.context_len):,}",
                               measured=f"{last.kv_bytes:,}"))
    per_layer = m.kv_bytes(last.context_len) // m.layers if trace.settings.kv_cache else 0
    number = st.column_config.NumberColumn  # grouped digits, as the formula line above writes
    show_table(pd.DataFrame({_("layer"): range(m.layers),
                             _("measured (B)"): last.kv_bytes_per_layer,
                             _("formula (B)"): [per_layer] * m.layers}),
               hide_index=True, height=200,
               column_config={_("measured (B)"): number(format="localized"),
                              _("formula (B)"): number(format="localized")})


def cache_on_vs_off(lm: LoadedModel | None) -> None:
    if lm is None:
        st.info(_("This experiment runs the model: load one in the sidebar."))
        return
    limits = config().limits
    prompt = st.text_input(_("Prompt"), "Write a long story about a dragon who learns to bake bread.",
                           max_chars=2000, key="kv_onoff_prompt")
    offered = [n for n in (16, 32, 64, 128, 256) if n <= limits.new_tokens]
    lengths = st.multiselect(_("New tokens"), offered, default=[n for n in (16, 32, 64)
                                                                 if n in offered],
                             help=_("Without the cache every step recomputes the whole "
                                    "sequence: {n} tokens takes a while on two cores.").format(
                                 n=offered[-1]), key="kv_onoff_lengths")
    if st.button(_("Run with and without the cache"), icon=":material/compare_arrows:",
                 help=_("Each length {rounds} times, with the cache and without, round-robin "
                        "over the lengths; the table shows the median and the min–max of the "
                        "rounds.").format(rounds=ROUNDS), key="kv_onoff_run"):
        ordered = sorted(lengths)
        total = 2 * ROUNDS * len(ordered)

        def on_off(job: Job) -> tuple:
            runs = []
            for run in cache_on_off(lm, prompt, ordered, limits.prompt_tokens, limits.new_tokens,
                                    job.stop):
                runs.append(run)
                said = (_("Round {round} of {rounds}: {n} tokens, cache on → {ms} ms")
                        if run.kv_cache else
                        _("Round {round} of {rounds}: {n} tokens, cache off → {ms} ms"))
                job.progress(len(runs) / total, said.format(
                    round=run.round + 1, rounds=ROUNDS, n=run.new_tokens,
                    ms=f"{run.total_ms:,.0f}"))
            return on_off_results(runs)

        run_experiment(on_off, progress="", keep=lambda found: keep_experiments(cache_on_off=found))
    found = current_experiments().cache_on_off
    if found:
        on_off_table(found)


def _spread(r: OnOff, cache: bool) -> str:
    low, high = r.spread_ms(cache)
    return f"{low:,.0f}–{high:,.0f}"


def on_off_table(found: tuple[OnOff, ...]) -> None:
    """The results: per length the median and min–max of the rounds, the delayed rounds; a note
    for a longer output measured faster than a shorter one; the chart of the rounds and the
    per-step times of the longest output's median round."""
    show_table(pd.DataFrame([{
        _("new tokens"): r.new_tokens, _("rounds"): r.rounds,
        _("cache on, median (ms)"): round(r.median_ms(True)),
        _("cache on, min–max (ms)"): _spread(r, True),
        _("cache off, median (ms)"): round(r.median_ms(False)),
        _("cache off, min–max (ms)"): _spread(r, False),
        _("speedup"): f"{r.speedup:.2f}×",
        _("delayed rounds"): (_("{delayed} of {rounds}").format(delayed=r.delayed_rounds,
                                                                rounds=r.rounds)
                              if r.measured else _("not measured")),
        _("identical tokens"): r.same_tokens} for r in found]), hide_index=True,
        column_config={_("speedup"): st.column_config.TextColumn(
            help=_("Median time without the cache ÷ median time with it")),
            _("delayed rounds"): st.column_config.TextColumn(
                help=_("Rounds in which the run with or without the cache was delayed by other "
                       "work on this machine (the rule below)"))})
    delayed = sum(r.delayed_rounds for r in found)
    if delayed:
        st.warning(_("Other work on this machine delayed {delayed} of {rounds} rounds (crosses in "
                     "the chart): their times show the machine, not the model. {advice}").format(
            delayed=delayed, rounds=sum(r.rounds for r in found), advice=advice(config().hosted)),
            icon=":material/speed:")
        with st.expander(_("How a run is marked delayed")):
            st.markdown(_("{rule} A round is delayed when any step of its run with the cache, or "
                          "of its run without, is.").format(rule=_(RULE)))
    for note in on_off_notes(found, shared=config().hosted):
        st.warning(note, icon=":material/warning:")
    show_chart(on_off_rounds_chart(found), name="cache on vs off rounds")
    last = max(found, key=lambda r: r.new_tokens)
    show_chart(on_off_chart(last.on_ms, last.off_ms), name="cache on vs off")
    st.caption(_("Top: total time per output length, the median of the rounds (bars: fastest to "
                 "slowest round; each round is a point). The rounds ran round-robin over the "
                 "lengths, so a slow moment of the machine touches every length alike. Bottom: "
                 "each step of {n} new tokens, in the round with the median total. Without the "
                 "cache each step is a prefill of the whole sequence, so its time grows with the "
                 "length; with it a step processes one token. The saving grows with the output "
                 "length — measured here, not claimed.").format(n=last.new_tokens))


def calculator(lm: LoadedModel | None) -> None:
    models = KV_MODELS + ([from_spec(lm.spec)] if lm is not None else [])
    c1, c2, c3 = st.columns(3)
    context = c1.number_input(_("Context length (tokens)"), 1, 1_000_000, 4096, step=1024,
                              key="kv_calc_context")
    batch = c2.number_input(_("Batch (sequences)"), 1, 1024, 1, key="kv_calc_batch")
    dtype = c3.selectbox(_("Cache dtype"), list(CACHE_DTYPES), index=1, key="kv_calc_dtype")
    show_table(pd.DataFrame([{
        "model": x.name, "attention": x.attention, "per-layer rule": x.rule(dtype),
        "bytes per token": x.bytes_per_token(dtype),
        "total (GiB)": round(x.total_bytes(int(context), int(batch), dtype) / 2**30, 3),
        "source": x.source or None} for x in models]),
        hide_index=True, width="stretch",
        column_config={  # the rule is the point of the table: it gets the room, whole
            "model": st.column_config.TextColumn(_("model"), width="medium"),
            "attention": st.column_config.TextColumn(_("attention"), width=70),
            "per-layer rule": st.column_config.TextColumn(_("per-layer rule"), width="large"),
            "bytes per token": st.column_config.NumberColumn(_("bytes per token"),
                                                             format="localized", width=120),
            "total (GiB)": st.column_config.NumberColumn(_("total (GiB)"), width="small"),
            "source": st.column_config.LinkColumn(_("source"), display_text="config ↗",
                                                  width="small")})
    show_chart(per_token_bars([x.name for x in models], [x.attention for x in models],
                              [x.bytes_per_token(dtype) for x in models]), name="kv bytes per token")
    st.caption(_("Llama-2-13B in fp16: 2 · 40 · 40 · 128 · 2 B = 819,200 B = 0.78 MiB per token "
                 "and 3.125 GiB at 4,096 tokens — the “about 1 MB per token, 4 GB at 4K” of "
                 "explainers, rounded up. Sliding-window layers (Mistral, Gemma's local layers) "
                 "stop growing at the window; int8/int4 add one fp16 scale per cached vector."))


def shrinking_it(trace: Trace | None, lm: LoadedModel | None) -> None:
    if trace is None or lm is None or lm.spec.name != trace.model.name or len(trace.steps) < 2:
        st.info(_("Needs a trace with several generated tokens from the loaded model."))
        return
    limits = config().limits
    c1, c2 = st.columns(2)
    window = c1.slider(_("Sliding window W (recent tokens kept)"), 4, 256, 32, key="kv_window")
    sinks = c2.slider(_("Attention sinks (first tokens kept)"), 0, 16, 4, key="kv_sinks")
    if st.button(_("Measure memory and quality"), icon=":material/science:", key="kv_measure"):
        configs = [CacheConfig("int8"), CacheConfig("int4"), CacheConfig("window", window, sinks),
                   CacheConfig("window", window, 0)]

        def variants(job: Job) -> tuple:
            runs = []
            for run in compare_caches(lm, list(trace.prompt_token_ids),
                                      list(trace.output_token_ids), configs, limits.sequence_tokens):
                runs.append(run)
                job.progress(len(runs) / (len(configs) + 1), run.config.label)
                if job.spent:
                    break
            return tuple(runs)

        run_experiment(variants, progress="",
                       keep=lambda runs: keep_experiments(cache_variants=runs))
    runs = current_experiments().cache_variants
    if runs:
        show_table(pd.DataFrame([{_("cache"): r.config.label,
                                    _("memory at end (B)"): int(r.kv_bytes[-1]),
                                    _("vs full"): f"{r.kv_bytes[-1] / runs[0].kv_bytes[-1]:.0%}",
                                    _("top-1 agreement"): f"{r.agreement:.1%}",
                                    _("mean KL (nats)"): round(float(r.kl.mean()), 4)}
                                   for r in runs]), hide_index=True)
        show_chart(variant_chart(runs[1:], "kl", _("KL(full ‖ variant), nats")),
                   name="cache variants kl")
        show_chart(variant_chart(runs, "kv_bytes", _("KV cache (KiB)"), 1024),
                   name="cache variants bytes")
        st.caption(_("Teacher-forced: every variant reads the same tokens as the full-cache run; "
                     "KL and agreement compare their next-token distributions at each step. "
                     "int8/int4 use per-token symmetric scales (one fp16 scale per head vector). "
                     "Each variant has one colour in both charts."))


def other_lengths() -> list[int]:
    """The other sequences' lengths typed by the user; on bad input, a message and none."""
    others = st.text_input(_("Other sequences' lengths"), "40, 7, 100", max_chars=200,
                           key="kv_other_lengths")
    try:
        extra = [int(x) for x in others.replace(" ", "").split(",") if x]
        if len(extra) > MAX_SEQUENCES or any(not 1 <= x <= MAX_SEQUENCE for x in extra):
            raise ValueError
    except ValueError:
        st.error(_("Lengths must be up to {count} whole numbers from 1 to {longest}, separated "
                   "by commas.").format(count=MAX_SEQUENCES, longest=f"{MAX_SEQUENCE:,}"))
        return []
    return extra


def paged_blocks(trace: Trace | None) -> None:
    """The real block tables of this session's last serving run when there is one; otherwise a
    model of the allocator, computed (engine/kv/paging.py) and labelled so."""
    found = last_serving_run()
    if found is not None and found[1].steps:
        recorded_blocks(*found)
        return
    st.info(_("Computed, not recorded: a model of how a paged allocator would place these "
              "sequences. Run a stream on the Serving page and this tab shows that run's real "
              "block tables, step by step."), icon=":material/calculate:")
    st.page_link("pages/serving.py", label=_("Go to Serving"), icon=":material/dns:")
    modelled_blocks(trace)


def recorded_blocks(label: str, run: ServingRun) -> None:
    """A step of a recorded serving run: its block pool, its block tables and the waste against
    contiguous preallocation."""
    st.markdown(_("**Recorded**: the block tables of your last serving run ({label}, {requests} "
                  "requests, {created}), read from the engine after every step.").format(
        label=plain(label), requests=len(run.requests), created=plain(run.created)))
    last = len(run.steps) - 1
    pick = st.slider(_("Step of the serving run"), 0, last, peak_step(run), key="kv_serving_step",
                     help=_("Starts at the step with the most blocks in use.")) if last else 0
    step = run.steps[pick]
    show_chart(recorded_blocks_chart(run, pick), name="paged blocks recorded")
    size = run.config.block_size
    specs = {r.id: r.spec for r in run.requests}
    reserved = sum(len(specs[row.request].prompt_token_ids) + specs[row.request].max_new_tokens
                   for row in step.tables)
    held = sum(row.tokens for row in step.tables)
    st.markdown(_("After step {step}: **{used} blocks** of {size} slots in use ({free} free, "
                  "{shared} shared) for {held} tokens: {wasted} slots wasted in last blocks "
                  "(Σ blocks × {size} − tokens), versus {reserved} if every running request had "
                  "reserved prompt + max new tokens contiguous slots up front.").format(
        step=step.index, used=step.blocks_used, size=size, free=step.free_blocks,
        shared=step.shared_blocks, held=held, wasted=step.empty_slots(size),
        reserved=reserved - held))
    show_table(pd.DataFrame({
        _("request"): [row.request for row in step.tables],
        _("tokens"): [row.tokens for row in step.tables],
        _("block table (logical → physical)"): [" ".join(map(str, row.blocks))
                                                for row in step.tables]}),
        hide_index=True)
    st.caption(_("Each bar is one physical block, in its request's colour (the Serving page's) "
                 "and as high as the token slots it holds; grey is the unused rest of a request's "
                 "last block; hatched blocks are shared by several requests (the same prefix, "
                 "stored once)."))


def modelled_blocks(trace: Trace | None) -> None:
    block = st.select_slider(_("Block size (tokens)"), [8, 16, 32], value=16, key="kv_block_size")
    extra = other_lengths()
    own = len(trace.prompt_token_ids) + len(trace.steps) if trace else 60
    layout = paged_layout([own] + extra, block)
    names = [_("this trace") if trace else _("example")] + [
        _("seq {n}").format(n=i + 1) for i in range(len(extra))]
    show_chart(blocks_chart(layout, names), name="paged blocks")
    max_len = max(layout.lengths)
    st.markdown(_("**{blocks} blocks** of {block} tokens for {tokens} tokens: {wasted} slots "
                  "wasted in last blocks, versus {contiguous} if every sequence reserved "
                  "{longest} contiguous slots up front.").format(
        blocks=layout.blocks, block=block, tokens=sum(layout.lengths), wasted=layout.total_waste,
        contiguous=layout.contiguous_waste(max_len), longest=max_len))
    show_table(pd.DataFrame({_("sequence"): names, _("tokens"): layout.lengths,
                             _("block table (logical → physical)"): [" ".join(map(str, t))
                                                                     for t in layout.block_tables]}),
               hide_index=True)
    st.caption(_("Each bar is one physical block, in its sequence's colour and as high as the "
                 "token slots it holds; grey is the unused rest of a sequence's last block. "
                 "Computed by a model of a paged allocator (vLLM's PagedAttention; "
                 "engine/kv/paging.py: sequences grow together, each takes the next free block), "
                 "not recorded."))


def page() -> None:
    st.title(_("KV cache"))
    st.caption(_("Each decode step needs every earlier token's keys and values. The KV cache keeps "
                 "them instead of recomputing them — memory traded for time."))
    trace, lm = current_trace(), loaded_model()
    tabs = {N_("Live memory"): lambda: live_memory(trace),
            N_("Cache on vs off"): lambda: cache_on_vs_off(lm),
            N_("Calculator"): lambda: calculator(lm),
            N_("Shrinking it"): lambda: shrinking_it(trace, lm),
            N_("Shrink the cache itself"): lambda: shrink_section(trace, lm),
            N_("Paged blocks"): lambda: paged_blocks(trace)}
    for tab, draw in zip(kept_tabs(list(tabs), keys.KV_TAB), tabs.values()):
        with tab:
            draw()


page()
