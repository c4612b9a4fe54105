"""Generate: type a prompt and watch the model run, token by token."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import streamlit as st

from charts import piece_text, step_chart, token_chips_html, topk_chart
from charts.formatting import batch_note, duration, rate, size, stop_reason
from charts.live import empty_step_chart
from engine import Run, Trace, summarize
from engine.lens.weights_notice import run_weights
from engine.timing.metrics import warmup_note
from i18n import _, language, ngettext
from ui.batching import LiveFrames, ModelShare, batched_budget, batched_seat
from ui.common import disturbance_warning, show_chart
from ui.config import MAX_PROMPT_CHARS
from ui.experiment import Job, limit_advice, limit_text, run_experiment
from ui.keys import PROMPT, REPLAY_SPEED, SAMPLE, STEP
from ui.preload import preload_chart_code
from ui.record import keep_new_trace, keep_prompt, keep_trace
from ui.replay import REPLAY_MAX_S, LiveSlots, replay, replay_asked, trace_waits
from ui.sections.lens import logit_lens_section
from ui.sections.run_sources import REPLAY_SPEEDS, download, examples_section, replay_section
from ui.starting import PENDING
from ui.state import (
    app_state,
    current_trace,
    generation_settings,
    loaded_model,
    pending_run,
    session_model,
    set_pending_run,
)
from ui.text import plain

SAMPLES = {s["title"]: s for s in  # title → its prompt and language
           json.loads((Path(__file__).parents[1] / "assets" / "sample_prompts.json").read_text())}


def samples_in_order() -> list[str]:
    """The samples' titles, those in the session's language first (a Chinese session opens on
    the Chinese prompts; the English ones follow)."""
    return sorted(SAMPLES, key=lambda title: SAMPLES[title].get("lang", "en") != language())


VIEWS = ("chips", "answer", "metrics", "chart")  # the live slots, under the status line


def use_sample() -> None:
    st.session_state[PROMPT] = SAMPLES[st.session_state[SAMPLE]]["prompt"]


def header() -> None:
    st.title(_("Generate"))
    st.caption(_("Type a prompt and watch the model run: prefill reads the whole prompt in one "
                 "pass, then decode produces one token per step, reusing the KV cache."))


def prompt_form() -> tuple[str, bool, bool]:
    """The prompt box with its samples, Generate (or Ctrl+Enter) and Stop."""
    # the options stay the samples' English titles (the session's value): translated as drawn
    st.selectbox(_("Sample prompts"), samples_in_order(), index=None, key=SAMPLE, on_change=use_sample,
                 format_func=_, placeholder=_("Pick a sample prompt…"))
    with st.form("generate_form", border=False):
        prompt = st.text_area(_("Prompt"), key=PROMPT, height=100, max_chars=MAX_PROMPT_CHARS,
                              placeholder=_("Ask the model something… (Ctrl+Enter to generate)"))
        generate = st.form_submit_button(_("Generate"), type="primary",
                                         icon=":material/play_arrow:", key="generate_submit")
    stop = st.button(_("Stop"), icon=":material/stop:", key="generate_stop",
                     help=_("Stop the running generation; the tokens decoded so far are kept."))
    return prompt, generate, stop


def pressed_while_starting() -> bool:
    """A prompt pressed on the server's starting page (ui/starting.py): it runs once the model is
    loaded (the sidebar's loading fragment reruns the page then)."""
    if not st.session_state.get(PENDING):
        return False
    if loaded_model() is None:
        st.info(_("Your prompt runs as soon as the model is ready; this page fills in by "
                  "itself."), icon=":material/schedule:")
        return False
    del st.session_state[PENDING]
    return True


def shown_trace(stop: bool) -> Trace | None:
    """What this page shows: the session's trace, or a run that ended before its first token
    (its own prompt, no answer) — never the previous run's answer under a new prompt. A Stop
    click marks a run still marked running as stopped."""
    pending = pending_run()
    trace = pending if pending is not None else current_trace()
    if stop and trace is not None and trace.stop_reason == "running":
        trace = replace(trace, stop_reason="stopped")
        if pending is not None:
            set_pending_run(trace)
        else:
            keep_trace(trace)
    return trace


def show(trace: Trace, slots: LiveSlots, tag: str, draw_chart: bool = True) -> None:
    """Draw a (possibly partial) trace into the live slots."""
    slots["chips"].markdown(token_chips_html(trace), unsafe_allow_html=True)
    show_answer(trace, slots)
    show_metrics(trace, slots)
    # in a container: a chart (an element with an identity) that a new run replaces is kept on
    # screen by Streamlit until that run ends, a container is not
    if not draw_chart and not trace.steps:
        slots["chart"].empty()
    elif not trace.steps:
        show_chart(empty_step_chart(), where=slots["chart"].container(), key=f"steps-{tag}-empty",
                   name="steps")
    elif draw_chart:
        show_chart(step_chart(trace), where=slots["chart"].container(),
                   key=f"steps-{tag}-{len(trace.steps)}", name="steps")


def show_answer(trace: Trace, slots: LiveSlots) -> None:
    """The generated text as plain text (readable, copyable), below its chips."""
    if not trace.output_text:
        slots["answer"].caption(_("No token yet: the prefill is running.")
                                if trace.stop_reason == "running"
                                else _("No answer: the run ended before its first token."))
        return
    with slots["answer"].container():
        st.caption(_("Answer as plain text (the button at its right copies it):"))
        st.code(trace.output_text, language=None, wrap_lines=True)


def show_empty(slots: LiveSlots) -> None:
    """Before the first run: the metrics, empty, and where the answer will be. The chart and the
    answer's code block come with the run; their browser code is loaded once this page is usable
    (ui/preload.py), not in its first paint nor during the first decode steps."""
    slots["answer"].caption(_("The answer will appear here as plain text."))
    with slots["metrics"].container():
        for col, name in zip(st.columns(5), (_("TTFT"), _("Last ITL"), _("Mean ITL"),
                                             _("Decode rate"), _("KV cache"))):
            col.metric(name, "–")


def show_metrics(trace: Trace, slots: LiveSlots) -> None:
    s = summarize(trace, skip_warmup=True)
    last = trace.itl_ms[-1] if trace.itl_ms else None
    warm = warmup_note(s)
    with slots["metrics"].container():
        cols = st.columns(5)
        cols[0].metric(_("TTFT"), duration(s.ttft_ms),
                       help=_("Time to first token: tokenization + prefill of the whole prompt."))
        cols[1].metric(_("Last ITL"), duration(last),
                       help=_("Inter-token latency: the gap before the latest token."))
        cols[2].metric(_("Mean ITL"), duration(s.itl_mean_ms),
                       help=_("Mean of the decode steps' ITL. {warmup}").format(warmup=warm))
        cols[3].metric(_("Decode rate"), rate(s.decode_tokens_per_s),
                       help=_("Decode steps ÷ their time. {warmup}").format(warmup=warm))
        cols[4].metric(_("KV cache"), size(trace.kv_bytes),
                       help=_("Measured from the cache tensors (keys + values, every layer): "
                              "{bytes} B.").format(bytes=f"{trace.kv_bytes:,}"))


def run_generation(prompt: str, slots: LiveSlots) -> Trace | None:
    """Run the model on the prompt, drawing every step; the finished (or stopped) run's trace,
    or None when it could not start (the reason shown). The run's first act is to show itself in
    the live slots (its prompt's chips, empty metrics and chart, its progress in the status
    line), so that no part of the last run is left on screen while the prefill runs; the status
    line also holds the queue notice and any message, so the page's other elements keep their
    places."""
    with slots.status.container():
        line = st.empty()
        return _generation(prompt, slots, line)


def _generation(prompt: str, slots: LiveSlots, line) -> Trace | None:
    lm = loaded_model()
    if lm is None:
        st.error(_("No model is loaded — the sidebar says why (it may still be loading, or it "
                   "could not be loaded). You can still upload a trace below."))
        return None
    keep_prompt(prompt)
    budget = threading.Event()  # set when the hosted per-click budget is spent
    settings, model = generation_settings(), session_model()
    seat = batched_seat(model, settings)  # None: the run takes the whole machine in its turn
    options = model.run_options() if seat is None else {"native": seat, "weights": model.weights}
    run = run_experiment(lambda job: Run(lm, prompt, settings, stop_event=budget, **options),
                         turn=False, cut=False)
    if run is None:  # the prompt was refused: the reason is shown
        return None
    started = run.trace()
    set_pending_run(started)  # until the first token: this run, no answer
    show(started, slots, "live", draw_chart=seat is None)  # a batched run's chart: at its end
    prefill = _("Prefill: the {n}-token prompt in one forward pass…").format(
        n=len(started.prompt_token_ids))
    with batched_budget(budget, seat is not None) as share:
        decoded = run_experiment(lambda job: decode(run, slots, job, share), progress=prefill,
                                 where=line, stop=budget, cut=False, turn=seat is None)
    if decoded is None:
        return None
    trace = run.trace()
    if budget.is_set() and trace.stop_reason == "stopped":
        trace = replace(trace, stop_reason="limit")
    keep_run(trace)
    return trace


def keep_run(trace: Trace) -> None:
    """A run's trace as the session's, or, before its first token, as the pending run."""
    if trace.steps:
        keep_trace(trace)
    else:
        set_pending_run(trace)


def decode(run: Run, slots: LiveSlots, job: Job, share: ModelShare | None = None) -> Run:
    """Every step of the run, drawn live and kept (Stop, or leaving the page, keeps what ran);
    the status line counts the tokens. `share`: a batched run's budget, fed every step."""
    most = run.settings.max_new_tokens
    frames = LiveFrames(run)
    try:
        for step in run:
            if share is not None:
                share.add(step)
            if not frames.due(step):
                continue  # kept and drawn at the next frame (or whole at the end)
            trace = run.trace()
            if step.index == 0:
                keep_new_trace(trace)  # results computed on the old trace go
            else:
                keep_trace(trace)
            job.progress((step.index + 1) / most, _(
                "Decode: token {n} of at most {most} (Stop keeps the tokens so far)").format(
                    n=step.index + 1, most=most))
            show(trace, slots, "live", frames.chart_due(step))
    finally:
        if run.stop_reason == "running":  # interrupted: Stop, or the page left mid-run
            keep_run(replace(run.trace(), stop_reason="stopped"))
    return run


def replay_trace(trace: Trace, slots: LiveSlots) -> None:
    """Show a recorded trace step by step at the chosen speed, under a banner saying so."""
    label = st.session_state.get(REPLAY_SPEED) or "1×"
    speed = REPLAY_SPEEDS.get(label, 1.0)
    fields = {"created": plain(trace.created_at), "model": plain(trace.model.name),
              "device": plain(trace.device), "speed": label, "max_s": f"{REPLAY_MAX_S:.0f}"}
    banner = (_("**Replay** of a recorded trace ({created}, {model} on {device}), all at once: "
                "the model is not running, every time shown is the recorded one. A replay lasts "
                "at most {max_s} s; its speed is set at the bottom of the page.")
              if speed is None else
              _("**Replay** of a recorded trace ({created}, {model} on {device}), at {speed} its "
                "recorded pace: the model is not running, every time shown is the recorded one. "
                "A replay lasts at most {max_s} s; its speed is set at the bottom of the "
                "page.")).format(**fields)
    waits = [] if speed is None else trace_waits(trace, speed)  # instant: the page draws it next
    replay(slots, banner, waits, lambda n: show(trace.prefix(n), slots, "replay", n % 8 == 1))


def summary(trace: Trace) -> None:
    """Why the run ended, and on what: ", weights q4_0 (89.9 MB), decode steps by the native C
    step" when the trace records its decoder."""
    reason = (_("{limit} was reached").format(limit=limit_text()) if trace.stop_reason == "limit"
              else _("you pressed Stop") if trace.stop_reason == "stopped"
              else stop_reason(trace.stop_reason))  # this session's own run: its own words
    d = trace.decoder
    decoder = "" if d is None else _(", weights {weights} ({mb} MB), decode steps by the {decoder}").format(
        weights=plain(run_weights(trace)), mb=f"{d.weight_bytes / 1e6:,.1f}", decoder=plain(d.label))
    st.caption(ngettext("{tokens} token generated after a {prompt}-token prompt; stopped because "
                        "{reason}. Model: {model} on {device}{decoder}.",
                        "{tokens} tokens generated after a {prompt}-token prompt; stopped because "
                        "{reason}. Model: {model} on {device}{decoder}.", len(trace.steps)).format(
                     tokens=len(trace.steps), prompt=len(trace.prompt_token_ids), reason=reason,
                     model=plain(trace.model.name), device=plain(trace.device), decoder=decoder))
    shared = batch_note([s.batch for s in trace.steps[1:]], trace.steps[0].batch if trace.steps else 1)
    if shared:
        st.caption(shared)
    if trace.stop_reason == "limit":
        st.caption(limit_advice(_("a shorter prompt or fewer new tokens")))


def why_this_token(trace: Trace) -> None:
    st.subheader(_("Why this token?"))
    options = list(range(len(trace.steps)))
    pick = st.select_slider(
        _("Generated token"), options, value=options[-1] if len(options) == 1 else 0,
        format_func=lambda i: plain(f"{i}: {piece_text(trace.steps[i].piece)!r}"), key=STEP)
    step = trace.steps[pick]
    show_chart(topk_chart(step), name="next-token candidates")
    if step.chosen_rank > 0:
        st.warning(_("Sampling drew the #{rank} candidate (p = {p}), not the most probable "
                     "token.").format(rank=step.chosen_rank + 1, p=f"{step.chosen_prob:.3f}"))
    if st.button(_("What if it had chosen another token here?"), icon=":material/call_split:",
                 key="generate_whatif",
                 help=_("Opens the What if page on this token: put another candidate there and "
                        "the model goes on from it, on the cached prefix.")):
        app_state().page.whatif_at = pick
        st.switch_page("pages/whatif.py")
    logit_lens_section(trace, step)


header()
TYPED, GENERATE, STOP = prompt_form()
GENERATE = GENERATE or pressed_while_starting()
SLOTS = LiveSlots.make(*VIEWS)
TRACE = shown_trace(STOP)
REPLAY = not GENERATE and replay_asked("trace") and TRACE is not None and bool(TRACE.steps)
# What the page shows below the live slots. A run (a generation, a replay) starts it empty, so
# that nothing of the last run stays on screen while this one draws; any other rerun keeps it in
# place (a container inherits what it held, with no flicker) until it is drawn again.
AFTER = st.empty() if GENERATE or REPLAY else st.container()
if GENERATE:
    TRACE = run_generation(TYPED, SLOTS) or shown_trace(False)
elif REPLAY:
    replay_trace(TRACE, SLOTS)
DOWNLOADS = None  # the download row's place: filled last, its files take a moment to build
with AFTER.container() if GENERATE or REPLAY else AFTER:
    if TRACE is None:
        show_empty(SLOTS)
        st.info(_("Generate a trace above, open an example run or upload a trace file below."))
    else:
        show(TRACE, SLOTS, "final")
        summary(TRACE)
        disturbance_warning(TRACE)
        if TRACE.steps:
            why_this_token(TRACE)
            DOWNLOADS = st.container()
examples_section(TRACE is None)
replay_section(TRACE)
if DOWNLOADS is not None:  # the run is on screen before its report's bytes are built
    with DOWNLOADS:
        download(TRACE)
if TRACE is None:
    preload_chart_code('[data-testid="stTextArea"] textarea')
