"""Serving engine: a load on a real serving engine (vLLM above all) behind its OpenAI-compatible
API, live — the client's timings per request and per token, and the server's own /metrics
(engine/remote/). Timing and counters only: a remote engine shows no attention or KV contents."""

from __future__ import annotations

import streamlit as st

from charts.remote import gantt_chart, load_at, server_chart, throughput_chart
from engine.errors import EngineError
from engine.remote.cli import DEFAULT_PROMPTS
from engine.remote.client import RemoteError, normalize_base_url
from engine.remote.compare import chat_text
from engine.remote.record import LoadConfig, LoadRun
from i18n import N_, _, language, translations
from ui.common import show_chart
from ui.keys import REMOTE_PROMPTS
from ui.record import keep_remote
from ui.replay import LiveSlots, even_frames, paced, replay, replay_asked
from ui.sections.serving_engine import (
    SAMPLE_LABEL,
    YOUR_LOAD,
    Server,
    cut_short,
    default_tokenizer,
    hosted,
    load_files_section,
    sample_load_button,
    server_section,
)
from ui.sections.serving_engine_results import compare_section, results_section
from ui.state import remote_results
from ui.text import message, plain

MAX_REQUESTS, MAX_NEW_TOKENS, MAX_CONCURRENCY = 64, 256, 64  # one load from this page, locally
VIEWS = ("gantt", "rate", "server")  # the live slots, under the status line
CONCURRENCY, POISSON = "Concurrency limit", "Poisson rate"  # the radio's values
ARRIVALS = {CONCURRENCY: N_("Concurrency limit"), POISSON: N_("Poisson rate")}
FIRST_LISTED = N_("(first listed)")  # the model box's one option when no server answers
LABELS = (YOUR_LOAD, SAMPLE_LABEL)  # labels of the page's own (N_): shown translated


def option_words(labels: dict[str, str]):
    """A format_func showing each option's label in this run's language, whichever thread calls
    it (AppTest formats a widget's value outside the script run, where `_` would say English)."""
    words = translations(language()).gettext
    return lambda value: words(labels[value]) if value in labels else value


def shown_label(label: str) -> str:
    """A kept load's label as shown: the page's own labels in the session's language, a file's
    name as it is."""
    return _(label) if label in LABELS else label


def header() -> None:
    st.title(_("Serving engine"))
    st.caption(_("The Serving page's ideas — time to first token (TTFT), inter-token latency "
                 "(ITL), batching, KV-cache blocks, prefix-cache hits, speculative acceptance — "
                 "read off a production serving engine (vLLM, or any server with an "
                 "OpenAI-compatible API) while it serves a load you choose. Every request streams "
                 "greedily and is timed chunk by chunk on this side; the server's Prometheus "
                 "/metrics is read about twice a second."))
    st.info(_("**Timing and the engine's own counters only.** A remote engine shows no attention "
              "weights and no KV contents: it is another process, maybe another machine, and "
              "exports only what its API and /metrics say. For those, use the other pages on "
              "this app's own engine."), icon=":material/info:")


def hosted_notice() -> None:
    st.info(_("This public demo sends no requests to other servers (a page must not send load "
              "to addresses its visitors type). Open the sample load below, or a load-test file "
              "saved by a local copy of the app or by `python -m engine loadtest --out FILE` at "
              "the bottom of the page: it is drawn exactly as recorded."), icon=":material/public:")
    sample_load_button()


def load_form(server: Server) -> LoadConfig | None:
    """The load; None until submitted (or on bad input, with one sentence saying why)."""
    st.subheader(_("The load"))
    if REMOTE_PROMPTS not in st.session_state:
        st.session_state[REMOTE_PROMPTS] = "\n".join(DEFAULT_PROMPTS)
    with st.form("remote_form", border=False, enter_to_submit=True):
        prompts = st.text_area(_("Prompts, one per line"), key=REMOTE_PROMPTS, height=140,
                               max_chars=20_000, help=_("Eight sample questions to start; cycled "
                               "when you ask for more requests than lines."))
        c1, c2, c3, c4 = st.columns(4)
        count = c1.number_input(_("Requests"), 1, MAX_REQUESTS, 8, key="remote_count",
                                help=_("At most {n} here.").format(n=MAX_REQUESTS))
        new = c2.number_input(_("Max new tokens"), 1, MAX_NEW_TOKENS, 32, key="remote_new",
                              help=_("Per request, at most {n} here; greedy, so a request may "
                                     "stop earlier at the end-of-text token.").format(
                                         n=MAX_NEW_TOKENS))
        arrival = c3.radio(_("Send"), [CONCURRENCY, POISSON], horizontal=True,
                           key="remote_arrival", format_func=option_words(ARRIVALS),
                           help=_("Concurrency limit: all at once, at most that many in flight. "
                                  "Poisson: random gaps with the rate on average (seed 0, the "
                                  "same arrivals as the Serving page's)."))
        model = c4.selectbox(_("Model"), server.models or (FIRST_LISTED,), key="remote_model",
                             format_func=option_words({FIRST_LISTED: FIRST_LISTED}),
                             help=_("The served model id to ask for."))
        c5, c6, c7 = st.columns([1, 1, 2])
        concurrency = c5.number_input(_("Concurrency"), 1, MAX_CONCURRENCY, 8, key="remote_conc",
                                      help=_("Requests in flight at most (also with Poisson "
                                             "arrivals); at most {n}.").format(n=MAX_CONCURRENCY))
        rate_per_s = c6.number_input(_("Rate (requests/s)"), 0.1, 100.0, 4.0, step=0.5,
                                     key="remote_rate", help=_("For Poisson arrivals."))
        chat = c7.toggle(_("Chat template (the default model's)"), True, key="remote_chat",
                         help=_("Wrap each prompt as a user turn in SmolLM2's chat format before "
                                "sending, as this app's engine does; turn it off for another "
                                "model."))
        submitted = st.form_submit_button(_("Run the load"), type="primary",
                                          icon=":material/play_arrow:", key="remote_run_load")
    st.caption(_("Caps here: {requests} requests, {tokens} new tokens each, {flight} in flight. "
                 "Decoding is greedy (temperature 0).").format(
                     requests=MAX_REQUESTS, tokens=MAX_NEW_TOKENS, flight=MAX_CONCURRENCY))
    if not submitted:
        return None
    lines = [line.strip() for line in prompts.splitlines() if line.strip()]
    try:
        if not lines:
            raise ValueError(_("Write at least one prompt (one per line)."))
        if server.refused:
            raise ValueError(server.problem or "")
        if not server.models:
            raise ValueError(_("No server answers at that URL: start one (above) or fix the "
                               "URL, then press List models."))
        return LoadConfig(normalize_base_url(server.url),
                          model if model in server.models else "", tuple(lines), int(count),
                          int(new), int(concurrency),
                          float(rate_per_s) if arrival == POISSON else None, bool(chat))
    except (ValueError, RemoteError) as err:
        text = str(err)
        st.error(message(text if text.endswith((".", "。")) else text[0].upper() + text[1:] + "."))
        return None


def draw_live(run: LoadRun, slots: LiveSlots, tag: str) -> None:
    """The Gantt, tokens/s and the server's gauges; `tag` keeps each drawing's chart keys unique
    within a page run (a live load redraws the same slots)."""
    show_chart(gantt_chart(run), where=slots["gantt"], key=f"remote-gantt-{tag}", name="requests")
    show_chart(throughput_chart(run), where=slots["rate"], key=f"remote-rate-{tag}",
               name="tokens per second")
    show_chart(server_chart(run), where=slots["server"], key=f"remote-server-{tag}",
               name="server gauges")


def progress_text(run: LoadRun) -> tuple[float, str]:
    done = sum(1 for r in run.requests if r.finish in ("length", "stop", "error"))
    streaming = sum(1 for r in run.requests if r.finish == "running")
    unsent = sum(1 for r in run.requests if r.sent_ms is None)
    most = run.config.requests * run.config.max_new_tokens
    return (min(run.output_tokens / most, 1.0),
            _("{done} of {total} requests done, {streaming} streaming, {unsent} not sent yet; "
              "{tokens} of at most {most} tokens received").format(
                  done=done, total=len(run.requests), streaming=streaming, unsent=unsent,
                  tokens=run.output_tokens, most=most))


def run_load(config: LoadConfig, slots: LiveSlots) -> None:
    """Send the load; the progress at every snapshot (about 2/s), the charts once a second; kept
    at every snapshot, so a reload does not lose it. Stop (or leaving the page) stops the
    streams and keeps what came. The model turn is not taken: the server is another process."""
    from engine.remote.loadtest import LoadTest

    bar = slots.status.progress(0.0, text=_("Asking {url} for its models…").format(
        url=plain(config.base_url)))
    test, finished, last = None, False, None
    try:
        tokenizer = default_tokenizer() if config.chat_template else None
        test = LoadTest(config, None if tokenizer is None else
                        (lambda p: chat_text(tokenizer, p)))
        for i, snapshot in enumerate(test):
            last = snapshot
            keep_remote(run=snapshot, label=YOUR_LOAD)
            fraction, text = progress_text(snapshot)
            bar.progress(fraction, text=text)
            if i % 2 == 0:  # charts once a second: drawing shares the cores with the streams
                draw_live(snapshot, slots, f"live-{i}")
        finished = True
    except (EngineError, OSError) as err:  # RemoteError, or the chat template's tokenizer
        st.error(_("The load did not start: {error}").format(error=message(str(err))))
    finally:  # Stop (a rerun) lands here too: end the streams, keep what came, marked stopped
        if test is not None and last is not None and not finished:
            test.stop()
            keep_remote(run=cut_short(test.snapshot()), label=YOUR_LOAD)
    bar.empty()


def replay_load(run: LoadRun, slots: LiveSlots) -> None:
    """Draw a recorded load again at its recorded pace (faster when it lasted long), frame by
    frame; nothing is sent."""
    end = max([s.t_ms for s in run.samples] + [t for r in run.requests for t in r.chunk_ms],
              default=0.0)
    moments = even_frames(end)
    banner = _("**Replay** of a recorded load ({created}, {server}): nothing is sent; every "
               "time shown is the recorded one.").format(created=plain(run.created),
                                                         server=plain(run.server))
    replay(slots, banner, paced([moments[0] / 1000] * len(moments)),
           lambda k: draw_live(load_at(run, moments[k - 1]), slots, f"replay-{k}"))


def load_caption(run: LoadRun, label: str) -> None:
    how = (_("at most {n} in flight").format(n=run.config.concurrency)
           if run.config.rate is None else
           _("sent at {rate:g} requests/s (Poisson), at most {n} in flight").format(
               rate=run.config.rate, n=run.config.concurrency))
    chat = _("chat template on") if run.config.chat_template else _("chat template off")
    shown = (_("Showing **{label}**: {requests} requests to {server} at {url}, {how}, at most "
               "{tokens} new tokens each, {chat}, {created} — stopped before the end: the "
               "partial load.") if run.stopped else
             _("Showing **{label}**: {requests} requests to {server} at {url}, {how}, at most "
               "{tokens} new tokens each, {chat}, {created}."))
    st.caption(shown.format(label=plain(shown_label(label)), requests=run.config.requests,
                            server=plain(run.server), url=plain(run.config.base_url), how=how,
                            tokens=run.config.max_new_tokens, chat=chat,
                            created=plain(run.created)))
    st.caption(_("Gantt: grey = not yet sent (the concurrency limit or its arrival time), red = "
                 "sent → first token (the client's TTFT: the server's queue and prefill, plus "
                 "HTTP), blue = decode, | = done, × = error, ○ = stopped. Tokens/s: chunks "
                 "received per second, and the server's own generation counter between "
                 "samples."))


def shown_load(slots: LiveSlots) -> LoadRun | None:
    found = remote_results()
    if found.run is None:
        st.info(_("No load yet. Run one above, or open a load-test file at the bottom of the "
                  "page (no server needed).") if not hosted() else
                _("No load yet: open the sample load above, or a load-test file at the bottom "
                  "of the page."))
        return None
    run = cut_short(found.run)  # kept mid-run by a reload: what came is all there is
    if run is not found.run:
        keep_remote(run=run, label=found.label)
    draw_live(run, slots, "final")
    load_caption(run, found.label)
    results_section(run)
    return run


header()
if hosted():
    hosted_notice()
    FORM = None
else:
    FORM = load_form(server_section())
    st.button(_("Stop"), icon=":material/stop:", key="remote_stop",
              help=_("Stop the running load: the streams end and what arrived is kept."))
    # its click's rerun ends the running load (see run_load)
SLOTS = LiveSlots.make(*VIEWS)
if FORM is not None:
    run_load(FORM, SLOTS)
elif replay_asked("load") and remote_results().run is not None:
    replay_load(remote_results().run, SLOTS)
SHOWN = shown_load(SLOTS)
if SHOWN is not None:
    compare_section(SHOWN, remote_results().label)
load_files_section()
