"""One experiment shape: every page action that runs the shared model goes through
`run_experiment`, which takes the model turn (showing the queue and its wait estimate), shows
progress, writes the budget note, turns an engine error into one message and keeps the result.
A page only describes the form, the work and the result.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import streamlit as st

from engine import EngineError
from i18n import N_, _, chinese
from ui import shared
from ui.clients import current_client
from ui.config import config
from ui.text import message

T = TypeVar("T")
WAITING = N_("Waiting for the model: another run is using it…")  # the bar's text while queued


def sentences(*parts: str) -> str:
    """Sentences one after another: with a space between them in English, none in Chinese (its
    full stop is full width); empty parts left out."""
    return ("" if chinese() else " ").join(part for part in parts if part)


def limit_text() -> str:
    """The hosted per-click budget, in the words every page uses for it."""
    return _("this demo's limit of {s:.0f} s of model time per click").format(
        s=config().limits.click_s or 0)


def limit_advice(less: str | None = None) -> str:
    """What a visitor can do about a run the per-click budget stopped; `less`: what this page
    can ask for less of (in the session's language)."""
    return _("To finish within the limit: ask for less in one click ({less}), try again when "
             "fewer visitors are running theirs, or run the app on your own machine (make run), "
             "where there is no such limit.").format(
                 less=less or _("fewer tokens, requests or settings"))


def budget_note(kept: bool = True) -> str:
    """What a page says when an experiment stopped at the per-click budget: with what it kept,
    or (`kept` False: it needs every part to show anything) that the visitor may try again;
    then what they can do about it."""
    limit = config().limits.click_s or 0
    return sentences((_("Stopped at this demo's limit of {s:.0f} s of model time per click, so that "
                     "no visitor waits long for another; what was measured is shown.") if kept
                   else _("Stopped at this demo's limit of {s:.0f} s of model time per click, so "
                          "that no visitor waits long for another; try again.")).format(s=limit),
                  limit_advice())


def wait_text(place: int, held_s: float, estimate_s: float | None) -> str:
    """What a waiting visitor reads: their place, how long the current run has taken, and when
    theirs should start (`FairLock.wait_estimate_s`, from measured run times)."""
    busy = (_("Busy: another visitor's run is using the model; yours is next in the queue (the "
              "current run has taken {held:.0f} s so far).") if place == 1
            else _("Busy: {place} runs are ahead of yours in the queue (the current run has taken "
                   "{held:.0f} s so far).")).format(place=place, held=held_s)
    if estimate_s is None:
        estimate = _("The current run is taking longer than recent runs like it, so there is no "
                     "estimate yet.") if held_s >= 1 else ""
    elif estimate_s < 1:
        estimate = _("Yours should start any moment (estimated from recent runs' measured times).")
    else:
        estimate = _("Yours should start in about {s:.0f} s (estimated from recent runs' measured "
                     "times, by kind of run).").format(s=estimate_s)
    return sentences(busy, estimate, _("Yours starts by itself: keep this page open."))


def job_kind(work: Callable[..., Any]) -> str:
    """A job's kind for the wait estimates: the function that does it (one per page action)."""
    return f"{getattr(work, '__module__', '')}.{getattr(work, '__qualname__', type(work).__name__)}"


@contextlib.contextmanager
def model_turn(stop: threading.Event | None = None, kind: str = "") -> Iterator[threading.Event]:
    """Hold the process-wide turn while this session runs the shared model: one run at a time,
    so no visitor's timings are measured while another visitor's forward shares the cores.
    The turn rotates between clients (this session's visitor: `current_client`), not tabs: a
    visitor's next run waits behind every other visitor who waits, so opening tabs buys no
    turns. Waiting visitors see their place in the queue and an estimate (`kind` names this job
    for the estimates). Yields `stop` (or a new event), which is set once this turn has used the
    hosted per-click budget (`Limits.click_s`): loops check it and end early (see
    `budget_note`)."""
    stop = stop or threading.Event()
    notice = st.empty()
    lock = shared.LOCK

    def waiting(place: int, held_s: float) -> None:
        notice.info(wait_text(place, held_s, lock.wait_estimate_s(place, held_s)),
                    icon=":material/hourglass:")

    budget = config().limits.click_s
    try:
        with lock.turn(on_wait=waiting, kind=kind, client=current_client()):
            notice.empty()
            timer = threading.Timer(budget, stop.set) if budget else None
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                yield stop
            finally:
                if timer is not None:
                    timer.cancel()
    finally:
        notice.empty()


@dataclass(slots=True)
class Job:
    """A running experiment as its work sees it: the stop event (set when the per-click budget
    is spent, or by the page), and the progress bar (None: the page draws its own progress)."""

    stop: threading.Event
    bar: Any = None

    def progress(self, fraction: float, text: str) -> None:
        if self.bar is not None:
            self.bar.progress(min(max(fraction, 0.0), 1.0), text=text)

    def say(self, text: str, fraction: float) -> None:
        """`progress` in the (text, fraction) order of the engine's `say` callbacks."""
        self.progress(fraction, text)

    @property
    def spent(self) -> bool:
        return self.stop.is_set()


def run_experiment(work: Callable[[Job], T], *, progress: str | None = None, where: Any = None,
                   spinner: str | None = None, stop: threading.Event | None = None,
                   turn: bool = True, failed: str = "",
                   errors: tuple[type[Exception], ...] = (EngineError,),
                   cut: bool | Callable[[T], bool] = True,
                   keep: Callable[[T], None] | None = None,
                   on_error: Callable[[str], None] | None = None) -> T | None:
    """`work(job)` under the model turn (`turn` False: a job that needs no turn, like loading a
    float model); its result, or None after one message for an engine error (or one of
    `errors`), `failed` before it, shown here or handed to `on_error` (a page that shows it
    elsewhere). `progress`: a progress bar's first text once the work starts ("": none), drawn
    in `where` (default here), which `job.progress` moves — while another run holds the model
    the bar says WAITING instead, never when the turn is free; `spinner`: a spinner's text
    instead. `cut`: whether to say the budget stopped it — True: when the stop event is set; a
    test of the result; False: the page says it itself. `keep(result)` stores the result in the
    session record."""
    job = Job(stop or threading.Event())
    busy = turn and shared.LOCK.locked()  # another session's run holds the model now
    if progress is not None:
        job.bar = (st if where is None else where).progress(
            0.0, text=_(WAITING) if busy else progress or None)
    try:
        with st.spinner(spinner) if spinner else contextlib.nullcontext():
            with model_turn(job.stop, job_kind(work)) if turn else contextlib.nullcontext():
                if busy:
                    job.progress(0.0, progress or "")
                result = work(job)
    except errors as err:
        (on_error or st.error)(message(f"{failed}{err}"))
        return None
    finally:
        if job.bar is not None:
            job.bar.empty()
    stopped = cut(result) if callable(cut) else (cut and job.spent)
    if stopped:
        st.info(budget_note())
    if keep is not None:
        keep(result)
    return result
