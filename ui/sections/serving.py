"""The Serving page's sample streams and caps, its comparison sections (static vs continuous,
prefix sharing, speculative decoding) and its file section."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from charts.serving import (
    SCHEDULER_COLORS,
    batching_chart,
    drafted_chips_html,
    per_request_chart,
    scheduler_name,
    sharing_chart,
    speculation_chart,
)
from engine import LoadedModel
from engine.clock import MachineSample, others_share
from engine.errors import InputError
from engine.serving.metrics import summarize_stream
from engine.serving.record import RequestSpec, ServingConfig, ServingRun
from engine.timing.disturbance import OTHERS_LIMIT, RULE, advice
from engine.timing.metrics import percentile
from i18n import N_, _
from ui.common import show_chart
from ui.config import config
from ui.experiment import Job, run_experiment, sentences
from ui.files import RecordFiles, files_section
from ui.record import keep_serving
from ui.state import generation_settings, serving_results, session_model
from ui.tables import show_table
from ui.text import plain

SAMPLES = json.loads((Path(__file__).parents[2] / "assets" / "serving_streams.json").read_text())
STREAMS: dict[str, dict[str, Any]] = {s["title"]: s for s in SAMPLES["streams"]}
SPECULATION: list[dict[str, Any]] = SAMPLES["speculation"]  # prompts: engine/serving/speculative.py
SPECULATION_PROMPTS = {"rewrite": "REWRITE_PROMPT", "free": "FREE_PROMPT"}  # the bench's samples
# The samples' titles and descriptions are in the catalogs (scripts/catalogs.py extracts them): the
# titles stay the widget's values and the record's keys; `_` translates them where shown.


def speculation_prompt(sample: dict[str, Any]) -> str:
    from engine.serving import speculative

    return getattr(speculative, SPECULATION_PROMPTS[sample["sample"]])


SHARED_STREAM = "Same system prompt"
YOUR_STREAM = N_("your stream")  # the label of a stream run on this page (a file's is "file …")
FILE_MB = 20  # a serving file: JSON of token ids, times and block tables


@dataclass(frozen=True, slots=True)
class ServingCaps:
    """What one click may ask of the shared model on this page (hosted: less)."""

    requests: int
    new_tokens: int
    prompt_tokens: int
    pool_slots: int  # blocks × block size: the K/V pool's memory
    click_s: float | None

    def describe(self) -> str:
        if self.click_s:
            text = _("Limits here: at most {requests} requests, {prompt} prompt tokens and {new} "
                     "new tokens each, and a block pool of at most {slots:,} token slots (blocks × "
                     "block size), and at most {s:.0f} s of model time per click (a longer stream "
                     "stops and keeps what ran).")
        else:
            text = _("Limits here: at most {requests} requests, {prompt} prompt tokens and {new} "
                     "new tokens each, and a block pool of at most {slots:,} token slots (blocks × "
                     "block size).")
        return text.format(requests=self.requests, prompt=self.prompt_tokens,
                           new=self.new_tokens, slots=self.pool_slots, s=self.click_s or 0)


def serving_caps() -> ServingCaps:
    """Hosted: 8 requests and a 2,048-slot pool (~90 MB of float32 K/V on the default model)
    within the usual per-click budget; locally 32 requests and 8,192 slots (~360 MB)."""
    cfg = config()
    limits = cfg.limits
    return ServingCaps(8 if cfg.hosted else 32, limits.new_tokens, limits.prompt_tokens,
                       2048 if cfg.hosted else 8192, limits.click_s)


def first_stream() -> str:
    """The sample stream a visitor starts from: the file's first; on a server with a per-click
    budget the one with the fewest tokens to generate, so that the first click finishes on a
    busy shared machine (the first sample, 8 requests up to 64 tokens at 4 a step, is ~90 steps:
    8.5 s of model time alone on a 2-core VM, and a class on the same cores slows it past 15 s)."""
    if not serving_caps().click_s:
        return next(iter(STREAMS))
    return min(STREAMS, key=lambda title: sum(r["max_new_tokens"]
                                              for r in STREAMS[title]["requests"]))


def stream_specs(lm: LoadedModel, prompts: tuple[str, ...], lengths: tuple[int, ...],
                 arrival: str, rate_per_s: float, chat_template: bool) -> tuple[RequestSpec, ...]:
    """The requests, checked against this page's caps (one sentence when one is over)."""
    from engine.serving.requests import make_requests

    caps = serving_caps()
    if len(prompts) > caps.requests:
        raise InputError(_("At most {n} requests here.").format(n=caps.requests))
    specs = make_requests(lm.tokenizer, list(prompts), [min(n, caps.new_tokens) for n in lengths],
                          arrival=arrival, rate_per_s=rate_per_s, seed=0,
                          chat_template=chat_template)
    for i, spec in enumerate(specs):
        if len(spec.prompt_token_ids) > caps.prompt_tokens:
            raise InputError(_("Request {i}'s prompt is {n} tokens; at most {cap} here.").format(
                i=i, n=len(spec.prompt_token_ids), cap=caps.prompt_tokens))
    return specs


def busy_warning(share: float | None, what: str = N_("this run"),
                 runs: tuple[ServingRun, ...] = ()) -> None:
    """The machine was busy with other programs while it ran: its times show the machine too.
    Steps the Trace's rule marks (recorded per step, so a replayed file says it too) come first;
    else other programs' share over the whole run. `what`: the runs it is about, in English
    (marked with `N_` where it is written; translated here)."""
    delayed = sum(len(run.delayed_steps()) for run in runs)
    if delayed:
        steps = sum(len(run.steps) for run in runs)
        text = _("{delayed} of {steps} steps of {what} were delayed by other work on this "
                 "machine: its times are slower than this machine's best.").format(
            delayed=delayed, steps=steps, what=_(what))
        st.warning(sentences(text, _(RULE), advice(config().hosted)), icon=":material/speed:")
    elif share is not None and share >= OTHERS_LIMIT:
        text = _("Other programs used {share:.0%} of all CPUs' time while {what} ran (the rule "
                 "marks ≥ {limit:.0%}): its times are slower than this machine's best.").format(
            share=share, what=_(what), limit=OTHERS_LIMIT)
        st.warning(sentences(text, advice(config().hosted)), icon=":material/speed:")


def cpu_watch(device: Any) -> Callable[[], float | None]:
    """From now on: a function that says other programs' share of the CPUs since this call."""
    before = MachineSample.now(device)
    return lambda: others_share(before, MachineSample.now(device))


Runs = list[tuple[tuple[RequestSpec, ...], ServingConfig]]


def serve_all(lm: LoadedModel, runs: Runs, label: str
              ) -> tuple[tuple[ServingRun, ...], float | None] | None:
    """Run several streams one after another under one model turn: the runs and other programs'
    CPU share meanwhile (None: they did not run, the reason shown)."""
    from engine.serving.engine import ServingEngine

    def work(job: Job) -> tuple[tuple[ServingRun, ...], float | None]:
        others, done = cpu_watch(lm.device), []
        for i, (specs, cfg) in enumerate(runs):
            engine = ServingEngine(lm, specs, cfg, stop_event=job.stop,
                                   weights=session_model().weights)
            text = (_("{scheduler} batching, prefix sharing on: step {step}") if cfg.prefix_sharing
                    else _("{scheduler} batching, prefix sharing off: step {step}"))
            for step in engine:
                job.progress((i + 0.5) / len(runs), text.format(
                    scheduler=scheduler_name(cfg.scheduler), step=step.index + 1))
            done.append(engine.record())
        return tuple(done), others()

    return run_experiment(work, progress=_("{label}: starting…").format(label=label))


def batching_section(lm: LoadedModel | None) -> None:
    st.subheader(_("Static vs continuous batching, same stream"))
    found = serving_results()
    base = found.run if found.label == YOUR_STREAM else None  # a file's stream is never re-run
    if lm is not None and base is not None and st.button(
            _("Run this stream both ways"), icon=":material/compare_arrows:", key="serving_both",
            help=_("The stream shown above (its prompts, lengths and arrivals), once with each "
                   "scheduler, the same blocks and batch size.")):
        specs = tuple(r.spec for r in base.requests)
        runs = [(specs, replace(base.config, scheduler=s)) for s in ("static", "continuous")]
        measured = serve_all(lm, runs, _("Static vs continuous"))
        if measured is not None:
            keep_serving(("batching", measured[1]), batching=measured[0])
            found = serving_results()
    if not found.batching:
        st.caption(_("Run a stream above, then run it with both schedulers here.") if base is None
                   else _("Runs the stream above once with each scheduler."))
        return
    static, continuous = found.batching
    if static.stopped or continuous.stopped:
        st.warning((_("The comparison was cut short (the per-click time budget or Stop): static "
                      "batching did not finish the stream, so no ratio is shown. Run a shorter "
                      "stream.") if static.stopped else
                    _("The comparison was cut short (the per-click time budget or Stop): "
                      "continuous batching did not finish the stream, so no ratio is shown. Run a "
                      "shorter stream.")))
        return
    busy_warning(found.share("batching"), N_("these runs"), found.batching)
    show_chart(batching_chart(static, continuous), name="static vs continuous")
    a, b = summarize_stream(static), summarize_stream(continuous)
    gain = b.throughput_tok_s / a.throughput_tok_s if a.throughput_tok_s else None
    st.markdown((_("Continuous batching: **{b:,.1f} tokens/s** vs static **{a:,.1f}** "
                   "(**{gain:.2f}×**). Static batching admits a new batch only when its longest "
                   "request has finished, so the slots of the short ones sit empty; continuous "
                   "batching refills a slot at the next step.") if gain else
                 _("Continuous batching: **{b:,.1f} tokens/s** vs static **{a:,.1f}**. Static "
                   "batching admits a new batch only when its longest request has finished, so "
                   "the slots of the short ones sit empty; continuous batching refills a slot at "
                   "the next step.")).format(b=b.throughput_tok_s, a=a.throughput_tok_s,
                                             gain=gain or 0))
    if all(r.queue_ms == 0 for r in static.requests if r.queue_ms is not None) and \
            len(static.requests) <= static.config.max_batch:
        st.info(_("Every request of this stream fits one batch and none waited, so both "
                  "schedulers ran the same batches: the difference shows when requests outnumber "
                  "the max batch or arrive over time (the “{sample}” sample, max batch 4).").format(
            sample=_("Mixed output lengths")))
    show_chart(per_request_chart({"static": static, "continuous": continuous}, SCHEDULER_COLORS),
               name="per request latency")
    why_batching(continuous)


def why_batching(run: ServingRun) -> None:
    """Why a batch is cheap: decode steps' measured time by batch size, with the formula."""
    by_size: dict[int, list[float]] = {}
    for step in run.steps:
        if step.kind == "decode":
            by_size.setdefault(step.batch_size, []).append(step.ms)
    if not by_size:
        return
    one = percentile(by_size.get(1, []), 50)
    rows = [{_("batch size"): b, _("decode steps"): len(ms),
             _("median step (ms)"): percentile(ms, 50),
             _("tokens/s = batch ÷ step"): 1000 * b / percentile(ms, 50),
             _("step vs batch 1"): (percentile(ms, 50) / one) if one else float("nan")}
            for b, ms in sorted(by_size.items())]
    st.markdown(_("**Why:** a decode step is memory-bound. Every Linear's weights are read from "
                  "memory once per step *for the whole batch*: bytes per step ≈ weight bytes + "
                  "the batch's KV bytes, FLOPs per step ≈ 2 × parameters × batch. With few "
                  "requests the reads dominate, so a step of 8 costs little more than a step of "
                  "1, and tokens/s grow almost with the batch. Measured on the continuous run:"))
    show_table(pd.DataFrame(rows).round(2), hide_index=True, width="stretch")
    st.caption(_("Tokens/s here = batch size ÷ median decode step time (each request in a "
                 "decode step gets one token)."))


def shared_stream_specs(lm: LoadedModel) -> tuple[RequestSpec, ...]:
    stream = STREAMS[SHARED_STREAM]
    prompts = tuple(stream.get("shared_prefix", "") + r["prompt"] for r in stream["requests"])
    return stream_specs(lm, prompts, tuple(r["max_new_tokens"] for r in stream["requests"]),
                        "all", 1.0, generation_settings().chat_template)


def sharing_section(lm: LoadedModel | None) -> None:
    st.subheader(_("Prefix sharing on vs off"))
    st.caption(_("The “{sample}” sample: {n} questions behind one long instruction, all arriving "
                 "at once, run with prefix sharing off and on (continuous batching, 16-token "
                 "blocks).").format(sample=_(SHARED_STREAM),
                                    n=len(STREAMS[SHARED_STREAM]["requests"])))
    found = serving_results()
    if lm is not None and st.button(_("Run it with and without sharing"), icon=":material/share:",
                                    key="serving_share_both"):
        specs = run_experiment(lambda job: shared_stream_specs(lm), turn=False, cut=False)
        if specs is None:  # the reason is shown
            return
        need = sum(-(-(len(s.prompt_token_ids) + s.max_new_tokens) // 16) for s in specs)
        runs = [(specs, ServingConfig("continuous", 8, 16, need + 8, on)) for on in (False, True)]
        measured = serve_all(lm, runs, _("Prefix sharing"))
        if measured is not None:
            keep_serving(("sharing", measured[1]), sharing=measured[0])
            found = serving_results()
    if not found.sharing:
        return
    off, on = found.sharing
    if off.stopped or on.stopped:
        st.warning(_("The comparison was cut short (the per-click time budget or Stop), so no "
                     "saving is shown."))
        return
    busy_warning(found.share("sharing"), N_("these runs"), found.sharing)
    show_chart(sharing_chart(off, on), name="prefix sharing")
    a, b = summarize_stream(off), summarize_stream(on)
    cached = a.computed_prompt_tokens - b.computed_prompt_tokens
    st.markdown(_("Sharing on: **{on_blocks} blocks** at the peak instead of **{off_blocks}**; "
                  "prefill computed **{on_tokens:,}** prompt tokens instead of {off_tokens:,} "
                  "({cached:,} found in shared blocks); prefill steps took **{on_ms:,.0f} ms** "
                  "instead of {off_ms:,.0f} ms (measured). A block is shared only when it is full "
                  "and every token in it and before it is equal, so the saving is the shared "
                  "prefix rounded down to whole blocks; a request that writes into a shared block "
                  "gets its own copy first (copy on write).").format(
        on_blocks=b.peak_blocks, off_blocks=a.peak_blocks, on_tokens=b.computed_prompt_tokens,
        off_tokens=a.computed_prompt_tokens, cached=cached, on_ms=b.prefill_ms,
        off_ms=a.prefill_ms))


def speculation_section(lm: LoadedModel | None) -> None:
    st.subheader(_("Speculative decoding"))
    st.caption(_("Prompt lookup: the next tokens are guessed by finding the last few tokens "
                 "earlier in the context and copying what followed them (no second model); one "
                 "forward then scores the last token plus the k drafts, and every draft the "
                 "model itself would have chosen is kept. The output is exactly plain greedy's."))
    found = serving_results()
    rounds = 1 if config().hosted else 3
    if lm is not None and st.button(_("Measure it on two samples"), icon=":material/bolt:",
                                    key="serving_speculation",
                                    help=_("Each sample decoded plain and speculatively, {rounds} "
                                           "paired round(s), after a warm-up.").format(
                                        rounds=rounds)):
        measured = _measure_speculation(lm, rounds)
        if measured is not None:
            keep_serving(("speculation", measured[1]), speculation=measured[0])
            found = serving_results()
    if not found.speculation:
        return
    busy_warning(found.share("speculation"), N_("these runs"))
    rows = []
    for title, pieces, cmp in found.speculation:
        spec = cmp.result
        if spec is None or not cmp.plain_tokens_per_s:
            continue
        accept = spec.speculation.acceptance_rate or 0.0
        rows.append((_(title), cmp.plain_tokens_per_s, cmp.speculative_tokens_per_s, accept,
                     cmp.speedup))
        st.markdown((_("**{title}** — {speedup:.2f}× plain greedy ({spec:,.1f} vs {plain:,.1f} "
                       "tokens/s, median of {rounds} round(s)); {accepted} of {proposed} drafts "
                       "accepted ({accept:.0%}), {per_step:.2f} tokens per verify step; output "
                       "identical to plain greedy.") if cmp.equal else
                     _("**{title}** — {speedup:.2f}× plain greedy ({spec:,.1f} vs {plain:,.1f} "
                       "tokens/s, median of {rounds} round(s)); {accepted} of {proposed} drafts "
                       "accepted ({accept:.0%}), {per_step:.2f} tokens per verify step; output "
                       "differs from plain greedy at token {first}.")).format(
            title=plain(_(title)), speedup=cmp.speedup, spec=cmp.speculative_tokens_per_s,
            plain=cmp.plain_tokens_per_s, rounds=cmp.rounds, accepted=spec.speculation.accepted,
            proposed=spec.speculation.proposed, accept=accept,
            per_step=spec.speculation.tokens_per_verify_step or 0, first=cmp.first_difference))
        st.markdown(drafted_chips_html(list(pieces), list(spec.drafted)), unsafe_allow_html=True)
    if rows:
        show_chart(speculation_chart(rows), name="speculative decoding")
    st.caption(_("Highlighted (green): tokens that came from an accepted draft — they cost no "
                 "forward of their own. Tokens/s = output tokens ÷ whole-run time, prefill "
                 "included; speedup = median over rounds of speculative ÷ plain within a round."))


def _measure_speculation(lm: LoadedModel, rounds: int) -> tuple[tuple, float | None] | None:
    from engine.forward import prepare_prompt
    from engine.serving.speculative import compare_speculation

    caps = serving_caps()

    def work(job: Job) -> tuple[tuple, float | None]:
        others, results = cpu_watch(lm.device), []
        for i, sample in enumerate(SPECULATION):
            ids = prepare_prompt(lm.tokenizer, speculation_prompt(sample),
                                 generation_settings().chat_template)
            if len(ids) > caps.prompt_tokens:
                raise InputError(_("The {title} sample is {n} tokens; at most {cap} here.").format(
                    title=_(sample["title"]), n=len(ids), cap=caps.prompt_tokens))

            def progress(done: int, total: int, i: int = i) -> None:
                job.progress((i + done / total) / len(SPECULATION),
                             _("{title}: run {done} of {total}").format(
                                 title=_(SPECULATION[i]["title"]), done=done, total=total))

            cmp = compare_speculation(lm, ids, min(sample["max_new_tokens"], caps.new_tokens),
                                      rounds=rounds, stop_event=job.stop, progress=progress)
            tokens = cmp.result.token_ids if cmp.result is not None else ()
            results.append((sample["title"],
                            tuple(lm.tokenizer.convert_ids_to_tokens(list(tokens))), cmp))
        return tuple(results), others()

    return run_experiment(work, progress=_("Speculative decoding: starting…"))


def serving_files() -> RecordFiles:
    from engine.files import read_record
    from engine.serving.servingfile import serving_to_bytes

    return RecordFiles(
        _("Serving files"), "serving", _("run"), _("Download this run"),
        "inference-explorer.serving.json",
        _("The stream's requests, tokens, times and every step's block tables as JSON: opened "
          "again here, it shows without a model."), _("Open a serving file (.json)"),
        "serving_upload",
        FILE_MB, serving_to_bytes, partial(read_record, "serving"))


def serving_files_section() -> None:
    """Download the shown run; open a serving file (no model needed) and replay it."""
    run = serving_results().run
    files_section(serving_files(), run, run is not None and bool(run.steps),
                  lambda opened, label: keep_serving(run=opened, label=label))
