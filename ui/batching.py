"""Batched Generate runs on a shared server: each visitor's run joins the model's StepBatcher
(engine/serving/batcher.py) instead of queueing for the whole machine, as servers batch users.

Only runs the batcher can decode: the KV cache on, the decoder not forced to torch, a model the
paged runner serves. Everything else (sweeps, studies, patching, other runs) keeps the fair turn
(ui/turns.py) — and the batcher takes that same turn for its steps (prefills included), as one
client, holding it while runs are in the batch (for a click's budget at most
while others wait), so a whole-machine experiment still gets the machine to itself.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import streamlit as st

from engine import EngineError
from engine.serving.batcher import SLICE_S
from engine.settings import GenerationSettings
from i18n import _
from ui import shared
from ui.config import config
from ui.experiment import wait_text
from ui.session_model import SessionModel

BATCH_CLIENT = "\0batched runs"  # the turn's client for batched steps: no address looks like it
SLOTS = 4096  # token positions of K/V the pool holds for all batched runs together (hosted: the
# two weights entries and their pools stay within HOSTED_MODEL_MB)
MAX_BATCH = 32


def server_busy() -> bool:
    """Whether other visitors' runs are decoding in a batch, or waiting for the turn, now."""
    batchers = [entry.extras.get("batcher") for entry in shared.MODELS.entries()]
    return shared.LOCK.waiting > 0 or any(
        getattr(b, "running", 0) > 0 for b in batchers if b is not None)


class FairTurn:
    """The app's fair turn (ui/turns.py) as the batch takes it: one client, BATCH_CLIENT."""

    def acquire(self, on_wait: Any = None) -> None:
        shared.LOCK.acquire(on_wait, kind="batched runs", client=BATCH_CLIENT)

    def release(self) -> None:
        shared.LOCK.release()

    @property
    def others_waiting(self) -> bool:
        return shared.LOCK.waiting > 0


class Seat:
    """engine/runner.py's Seats for one visitor's run: admission to the batch, its wait shown
    in `notice` (an st.empty)."""

    def __init__(self, batcher: Any, notice: Any) -> None:
        self.batcher, self.notice = batcher, notice

    def admit(self, tokens: int, stop: threading.Event) -> Any:
        def waiting(place: int) -> None:
            self.notice.info(_("The batch is full ({n} runs share each step); yours joins as soon "
                               "as a place frees up ({place} in line). Keep this page open.").format(
                                   n=self.batcher.max_batch, place=place),
                             icon=":material/hourglass:")
        def turn_elsewhere(place: int, held_s: float) -> None:  # the prefill waits for the turn
            self.notice.info(wait_text(place, held_s, shared.LOCK.wait_estimate_s(place, held_s)),
                             icon=":material/hourglass:")

        try:
            decoder = self.batcher.decoder(tokens, stop, waiting)
        finally:
            self.notice.empty()
        decoder.on_wait, decoder.on_turn = turn_elsewhere, self.notice.empty
        return decoder


def batched_seat(model: SessionModel, settings: GenerationSettings) -> Seat | None:
    """This run's seat in the batch, or None when it runs alone in the fair turn: batching off
    (`config().batching`), a setting the batch does not decode (cache off, torch asked), or a
    model the batcher cannot serve."""
    if not config().batching or not settings.kv_cache or settings.decoder == "torch":
        return None
    try:
        batcher = model.entry.batcher(FairTurn(), max_batch=MAX_BATCH, slots=SLOTS,
                                      max_tokens=config().limits.sequence_tokens,
                                      slice_s=config().limits.click_s or SLICE_S)
    except EngineError:
        return None
    return Seat(batcher, st.empty())


FRAME_S = 0.1  # a live run alone redraws at most this often
CHART_EVERY_S = 1.0  # and its chart
FRAME_STEPS = 8  # a run in a batch redraws on the batch's every FRAME_STEPS-th step
WALL_LIMITS = 8  # a batched run also stops after this many per-click limits of wall time


class ModelShare:
    """A batched run's per-click budget: its share of model time — each decode step's forward
    divided by the runs that shared it, the prefill's forward whole (prompts differ in length,
    and a forward that took one took longest for it) — against the hosted limit (a run in
    the turn gets the limit as the time it holds the machine). `budget` is set once the share
    reaches the limit (the run stops before its next step), or after WALL_LIMITS limits of
    wall time, so a crowded server still ends every run."""

    def __init__(self, budget: threading.Event, limit: float | None) -> None:
        self.budget, self.limit, self.used_s = budget, limit, 0.0

    def add(self, step: Any) -> None:
        """One more step of the run (a trace's Step)."""
        if self.limit is None:
            return
        ms = step.forward_ms if step.forward_ms is not None else step.latency_ms
        self.used_s += ms / 1000 / (step.batch if step.index > 0 else 1)
        if self.used_s >= self.limit:
            self.budget.set()


@contextlib.contextmanager
def batched_budget(budget: threading.Event, batched: bool) -> Iterator[ModelShare | None]:
    """A batched run's ModelShare (None for a run in the turn, whose budget the turn sets)."""
    limit = config().limits.click_s
    if not batched:
        yield None
        return
    timer = threading.Timer(limit * WALL_LIMITS, budget.set) if limit else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield ModelShare(budget, limit)
    finally:
        if timer is not None:
            timer.cancel()


class LiveFrames:
    """When a live run redraws on the Generate page (its tokens, answer and metrics; its partial
    trace kept) and when its chart does.

    Alone: the tokens at most every FRAME_S (the first at once) — a faster model than the eye
    needs would spend a core of the visitor's machine, and of a shared server, on frames no one
    reads — and the chart at most every CHART_EVERY_S, the first time that long after the run
    starts (the browser's redraw runs on the same cores as the model on one machine, and the
    step after a redraw runs several times slower than the others).

    Sharing its steps with other runs: no live chart (drawn once, at the end) and the tokens on
    the batch's every FRAME_STEPS-th step (its shared step count), so that every page of the
    batch draws on the same step: the batch waits for its slowest page before each step, and a
    frame costs a page a few milliseconds to ~60 ms (measured with 20 visitors: frames drawn at
    different steps made the pages' frames take more of each step than the forward)."""

    def __init__(self, run: Any, clock: Any = time.monotonic) -> None:
        self.run = run
        self.clock = clock
        self.framed = self.drawn = clock()  # the chart not right after the prefill
        self.mark: int | None = None

    @property
    def batcher(self) -> Any:
        """The run's batch, once it has one (a run is seated when its steps start)."""
        return getattr(self.run.native, "batcher", None)

    def due(self, step: Any) -> bool:
        now = self.clock()
        if step.index > 0:
            if step.batch > 1 and self.batcher is not None:
                mark = self.batcher.steps // FRAME_STEPS
                if mark == self.mark:
                    return False
            elif now - self.framed < FRAME_S:
                return False
        self.framed = now
        if self.batcher is not None:
            self.mark = self.batcher.steps // FRAME_STEPS
        return True

    def chart_due(self, step: Any) -> bool:
        """(Called on a frame.) Whether the chart redraws too."""
        if step.batch > 1 or self.clock() - self.drawn < CHART_EVERY_S:
            return False
        self.drawn = self.clock()
        return True
