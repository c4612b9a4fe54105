"""Serving: many requests on the loaded model at once — continuous batching, paged KV blocks
with prefix sharing, speculative decoding — each measured (engine/serving/)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import streamlit as st

from charts.formatting import duration, rate
from charts.serving import (
    block_grid_chart,
    gantt_chart,
    scheduler_name,
    throughput_chart,
)
from engine import EngineError
from engine.errors import InputError
from engine.serving.metrics import passed_over, run_prefix, summarize_stream
from engine.serving.record import ServingConfig, ServingRun
from i18n import N_, _, chinese
from ui.common import show_chart
from ui.experiment import Job, run_experiment, sentences
from ui.keys import (
    SERVING_BATCH,
    SERVING_COUNT,
    SERVING_LENGTHS,
    SERVING_PREFIX,
    SERVING_PROMPTS,
    SERVING_STREAM,
)
from ui.record import keep_serving
from ui.replay import LiveSlots, paced, replay, replay_asked, step_frames
from ui.sections.server_batch import server_batch_section
from ui.sections.serving import (
    STREAMS,
    YOUR_STREAM,
    batching_section,
    busy_warning,
    cpu_watch,
    first_stream,
    serving_caps,
    serving_files_section,
    sharing_section,
    speculation_section,
    stream_specs,
)
from ui.sections.serving_steps import block_tables, requests_table
from ui.state import generation_settings, loaded_model, serving_results, session_model
from ui.text import plain

REDRAW_S = 1.0  # the live charts redraw at most this often (a redraw shares the cores with the model)
VIEWS = ("gantt", "grid", "rate")  # the live slots, under the status line
OWN = N_("My own prompts")
BLOCK_SIZES = (4, 8, 16, 32)
ARRIVALS = (N_("all at once"), N_("Poisson"))  # the radio's values (English); `_` shows them
SCHEDULERS = (N_("continuous"), N_("static"))


@dataclass(frozen=True, slots=True)
class StreamForm:
    """What the form asks for: the prompts (shared prefix prepended), their output lengths, the
    arrival pattern and the engine's configuration."""

    prompts: tuple[str, ...]
    lengths: tuple[int, ...]
    arrival: str
    rate_per_s: float
    config: ServingConfig


def use_stream() -> None:
    """A sample stream picked: fill the form with its prompts, prefix and output lengths."""
    stream = STREAMS.get(st.session_state.get(SERVING_STREAM))
    if stream is None:
        return
    st.session_state[SERVING_PROMPTS] = "\n".join(r["prompt"] for r in stream["requests"])
    st.session_state[SERVING_PREFIX] = stream.get("shared_prefix", "")
    st.session_state[SERVING_LENGTHS] = ", ".join(str(r["max_new_tokens"])
                                                  for r in stream["requests"])
    st.session_state[SERVING_COUNT] = len(stream["requests"])
    st.session_state[SERVING_BATCH] = stream.get("max_batch", 8)


def header() -> None:
    st.title(_("Serving"))
    st.caption(_("Many requests at once on the loaded model, measured: a scheduler batches them "
                 "step by step (continuous batching), their KV caches live in fixed-size blocks "
                 "that requests with the same prefix share (paged attention), and prompt-lookup "
                 "drafts let one forward emit several tokens (speculative decoding). Decoding is "
                 "greedy."))


def stream_form() -> StreamForm | None:
    """The request stream and the engine's settings; None until submitted (or on bad input,
    with one sentence saying what is wrong)."""
    caps = serving_caps()
    st.subheader(_("A stream of requests"))
    if SERVING_PROMPTS not in st.session_state:
        st.session_state[SERVING_STREAM] = first_stream()
        use_stream()
    st.selectbox(_("Sample stream"), [*STREAMS, OWN], key=SERVING_STREAM, on_change=use_stream,
                 format_func=_, help=_("Fills the form below; edit anything before running."))
    about = STREAMS.get(st.session_state.get(SERVING_STREAM), {}).get("about")
    if about:
        st.caption(_(about))
    # outside the form: choosing the arrival pattern must rerun, so that Rate is enabled only
    # when it applies (a widget in a form changes nothing until the form is submitted)
    c3, c4 = st.columns(2)
    arrival = c3.radio(_("Arrival"), list(ARRIVALS), horizontal=True, format_func=_,
                       key="serving_arrival", help=_("All at once: every request arrives at 0 ms. "
                                                     "Poisson: random gaps with the rate beside on "
                                                     "average (seed 0, reproducible)."))
    rate_per_s = c4.number_input(_("Rate (requests/s)"), 0.1, 100.0, 4.0, step=0.5,
                                 key="serving_rate", disabled=arrival != "Poisson",
                                 help=_("For Poisson arrivals."))
    with st.form("serving_form", border=False, enter_to_submit=True):
        prompts = st.text_area(_("Prompts, one per line"), key=SERVING_PROMPTS, height=150,
                               max_chars=20_000, help=_("Cycled when you ask for more requests "
                                                        "than lines."))
        prefix = st.text_area(_("Shared prefix (prepended to every prompt)"), key=SERVING_PREFIX,
                              height=80, max_chars=5_000, help=_("A system prompt every request "
                                                                 "starts with: what prefix sharing "
                                                                 "saves."))
        c1, c2 = st.columns(2)
        count = c1.number_input(_("Requests"), 1, caps.requests, key=SERVING_COUNT,
                                help=_("At most {n} here.").format(n=caps.requests))
        lengths = c2.text_input(_("Max new tokens per request"), key=SERVING_LENGTHS,
                                help=_("Comma-separated, cycled over the requests; each at most "
                                       "{n}.").format(n=caps.new_tokens))
        c5, c6, c7 = st.columns(3)
        max_batch = c5.number_input(_("Max batch"), 1, 32, key=SERVING_BATCH,
                                    help=_("Requests decoded together in one forward."))
        block = c6.selectbox(_("Block size (tokens)"), BLOCK_SIZES, index=2, key="serving_block")
        pool = c7.number_input(_("Block pool (blocks)"), 1, caps.pool_slots, 128,
                               key="serving_pool", help=_(
                                   "KV memory for all requests together: at most {slots:,} token "
                                   "slots here. Too small a pool makes requests wait (or be "
                                   "preempted), never crash.").format(slots=caps.pool_slots))
        c8, c9 = st.columns(2)
        scheduler = c8.radio(_("Scheduler"), list(SCHEDULERS), horizontal=True, format_func=_,
                             key="serving_scheduler")
        sharing = c9.toggle(_("Prefix sharing"), True, key="serving_sharing")
        submitted = st.form_submit_button(_("Run the stream"), type="primary", key="serving_run",
                                          icon=":material/play_arrow:")
    st.caption(caps.describe())
    if not submitted:
        return None
    try:
        lines = [line.strip() for line in prompts.splitlines() if line.strip()]
        if not lines:
            raise InputError(_("Write at least one prompt (one per line)."))
        wanted = [int(x) for x in lengths.replace(" ", "").split(",") if x]
        if not wanted or any(not 1 <= n <= caps.new_tokens for n in wanted):
            raise InputError(_("Max new tokens must be whole numbers from 1 to {n}, separated by "
                              "commas.").format(n=caps.new_tokens))
        if int(block) * int(pool) > caps.pool_slots:
            raise InputError(_("The pool holds at most {slots:,} token slots here: {pool} blocks × "
                              "{block} tokens is more.").format(slots=caps.pool_slots,
                                                                pool=int(pool), block=int(block)))
        n = int(count)
        return StreamForm(tuple(prefix + lines[i % len(lines)] for i in range(n)),
                          tuple(wanted[i % len(wanted)] for i in range(n)),
                          "poisson" if arrival == "Poisson" else "all", float(rate_per_s),
                          ServingConfig(scheduler, int(max_batch), int(block), int(pool), sharing))
    except InputError as err:
        st.error(str(err))
        return None
    except ValueError as err:
        st.error(str(err) if str(err).endswith(".") else _("Max new tokens must be whole numbers, "
                                                           "separated by commas."))
        return None


def draw_live(run: ServingRun, slots: LiveSlots, tag: str, grid: bool = True) -> None:
    """The Gantt, the block pool after the last step (unless `grid` is False: a finished run's
    pool is drawn with its step slider instead) and tokens/s; `tag` keeps each drawing's chart
    keys unique within a page run (a live run redraws the same slots)."""
    tag = f"{tag}-{len(run.steps)}"
    show_chart(gantt_chart(run), where=slots["gantt"], key=f"serving-gantt-{tag}", name="requests")
    if grid:
        show_chart(block_grid_chart(run), where=slots["grid"], key=f"serving-grid-{tag}",
                   name="blocks")
    else:
        slots["grid"].empty()
    show_chart(throughput_chart(run), where=slots["rate"], key=f"serving-rate-{tag}",
               name="tokens per second")


def run_stream(form: StreamForm, slots: LiveSlots) -> None:
    """Run the stream under the model turn, drawing it every REDRAW_S; Stop (or leaving the
    page) keeps the partial run."""
    lm = loaded_model()
    if lm is None:
        st.error(_("No model is loaded — the sidebar says why (it may still be loading, or it "
                   "could not be loaded). A serving file can still be opened below."))
        return
    specs = run_experiment(lambda job: stream_specs(
        lm, form.prompts, form.lengths, form.arrival, form.rate_per_s,
        generation_settings().chat_template), turn=False, cut=False, errors=(EngineError, ValueError))
    if specs is None:  # the reason is shown
        return
    engine = run_experiment(lambda job: serve_stream(lm, specs, form, slots, job),
                            progress=_("Starting…"), where=slots.status,
                            errors=(EngineError, ValueError))
    refused = {} if engine is None else engine.refusals()
    if refused:
        each = [_("request {i}: {why}").format(i=i, why=plain(why)) for i, why in refused.items()]
        st.warning(_("Refused (they can never fit): {requests}.").format(
            requests=("；" if chinese() else "; ").join(each)))


def serve_stream(lm, specs, form: StreamForm, slots: LiveSlots, job: Job):
    """The stream on the serving engine, drawn live and kept (what ran, if it stops early)."""
    from engine.serving.engine import ServingEngine

    total, done = sum(s.max_new_tokens for s in specs), 0
    engine, finished, others = None, False, None

    def idle(ms: float) -> None:  # a Streamlit call while the stream waits: Stop lands here
        job.progress(done / total, _("{done} tokens so far; the next request arrives in {s:.1f} s")
                     .format(done=done, s=ms / 1000))

    try:  # the engine packs weights and allocates its pool: in the turn
        engine = ServingEngine(lm, specs, form.config, stop_event=job.stop,
                               weights=session_model().weights, on_idle=idle)
        others, drawn = cpu_watch(lm.device), time.monotonic()
        for step in engine:  # the stream's clock pauses while this loop draws
            done += step.batch_size  # one token per request in the step
            job.progress(done / total, _("step {step}: {done} of at most {total} tokens, batch "
                                         "{batch}, {waiting} waiting").format(
                step=step.index + 1, done=done, total=total, batch=step.batch_size,
                waiting=step.waiting))
            if step.index == 0 or time.monotonic() - drawn >= REDRAW_S:
                partial = engine.record()  # detokenizes every answer: not every step
                keep_serving(run=partial, label=YOUR_STREAM)  # what a Stop click keeps
                draw_live(partial, slots, "live")
                drawn = time.monotonic()
        finished = True
    finally:  # Stop (a rerun) lands here too: keep what ran, marked stopped
        if engine is not None:
            if not finished:
                job.stop.set()
            share = None if others is None else others()
            keep_serving(("run", share), run=engine.record(), label=YOUR_STREAM)
    return engine


def mark_stopped() -> None:
    """The stream a Stop click interrupted: its partial run (kept at the last redraw, or by the
    run's own `finally` when Streamlit let it finish) is marked stopped, its running requests too."""
    found = serving_results()
    run = found.run
    if run is None or run.stopped or found.label != YOUR_STREAM \
            or not any(r.finish in ("running", "waiting") for r in run.requests):
        return
    requests = tuple(replace(r, finish="stopped") if r.finish == "running" else r
                     for r in run.requests)
    keep_serving(run=replace(run, requests=requests, stopped=True), label=YOUR_STREAM)


def replay_run(run: ServingRun, slots: LiveSlots) -> None:
    """Draw a recorded run again at its recorded pace (faster when it lasted long), frame by
    frame; no model runs."""
    frames = step_frames(len(run.steps))
    ends = [0.0] + [run.steps[n - 1].start_ms + run.steps[n - 1].ms for n in frames]
    banner = _("**Replay** of a recorded run ({created}, {model}): the model is not running; "
               "every time shown is the recorded one.").format(created=plain(run.created),
                                                              model=plain(run.model))
    replay(slots, banner, paced([(b - a) / 1000 for a, b in zip(ends, ends[1:])]),
           lambda k: draw_live(run_prefix(run, frames[k - 1]), slots, "replay"))


def run_summary(run: ServingRun, label: str) -> None:
    s = summarize_stream(run)
    shown = _(label) if label == YOUR_STREAM else label
    summary = (_("Showing **{label}**: {n} requests on {model} ({weights}), {scheduler} batching, "
                 "max batch {batch}, {blocks} blocks of {size} tokens, prefix sharing on, "
                 "{threads} threads, {created}") if run.config.prefix_sharing else
               _("Showing **{label}**: {n} requests on {model} ({weights}), {scheduler} batching, "
                 "max batch {batch}, {blocks} blocks of {size} tokens, prefix sharing off, "
                 "{threads} threads, {created}")).format(
        label=plain(shown), n=len(run.requests), model=plain(run.model),
        weights=plain(run.weights), scheduler=scheduler_name(run.config.scheduler),
        batch=run.config.max_batch, blocks=run.config.num_blocks, size=run.config.block_size,
        threads=run.threads, created=plain(run.created))
    st.caption((_("{summary} — stopped before the end: the partial run.") if run.stopped
                else _("{summary}.")).format(summary=summary))
    cols = st.columns(5)
    cols[0].metric(_("Throughput"), rate(s.throughput_tok_s),
                   help=_("Output tokens ÷ (last token − first arrival)."))
    cols[1].metric(_("TTFT p50"), duration(s.ttft_p50),
                   help=_("Time to first token = first token − arrival, median over requests "
                          "(p90: {p90}).").format(p90=duration(s.ttft_p90)))
    cols[2].metric(_("ITL p50"), duration(s.itl_p50),
                   help=_("Every gap between a request's consecutive tokens, median over all of "
                          "them (p90: {p90}).").format(p90=duration(s.itl_p90)))
    cols[3].metric(_("Steps"), f"{len(run.steps):,}",
                   help=_("Forwards the engine ran, each over every request in the batch."))
    cols[4].metric(_("Peak blocks"), f"{s.peak_blocks:,}",
                   help=_("Physical blocks in use at the busiest step, of {n}.").format(
                       n=run.config.num_blocks))
    waited = [r.queue_ms for r in passed_over(run) if r.queue_ms is not None]
    preempted = sum(r.preemptions for r in run.requests)
    if waited or preempted:
        st.caption(sentences(
            _("{n} request(s) waited in the queue (longest {longest}): every batch slot was taken "
              "or the pool had too few free blocks; they were admitted as others finished, never "
              "dropped.").format(n=len(waited), longest=duration(max(waited))) if waited else "",
            _("{n} time(s) a request was preempted to free blocks and recomputed later.").format(
                n=preempted) if preempted else ""))


def shown_run(slots: LiveSlots) -> None:
    found = serving_results()
    if found.run is None:
        st.info(_("Run a stream above, or open a serving file at the bottom of the page (no model "
                  "needed)."))
        return
    run = found.run
    draw_live(run, slots, "final", grid=False)
    busy_warning(found.share("run"), runs=(run,))
    run_summary(run, found.label)
    st.caption(_("Gantt: grey = waiting in the queue (arrived, no batch slot or blocks free), red "
                 "= prefill (the prompt's forward, which yields the first token), blue = decode, "
                 "| = done; the square is the request's colour in the block pool. Tokens/s: each "
                 "step's output tokens ÷ its time."))
    block_tables(run)
    requests_table(run)


header()
FORM = stream_form()
if st.button(_("Stop"), icon=":material/stop:", key="serving_stop",
             help=_("Stop the running stream; what ran is kept.")):
    mark_stopped()  # the click's rerun ended the running stream; its last kept state stays
SLOTS = LiveSlots.make(*VIEWS)
if FORM is not None:
    run_stream(FORM, SLOTS)
elif replay_asked("serving") and serving_results().run is not None and serving_results().run.steps:
    replay_run(serving_results().run, SLOTS)
shown_run(SLOTS)
batching_section(loaded_model())
server_batch_section()
sharing_section(loaded_model())
speculation_section(loaded_model())
serving_files_section()
