"""One replay for every recorded kind — a trace, a serving run, a load test: the recorded pace
(sped up within a replay's bounds: a replay is a view, and must not hold a server thread for
long, whatever a file says), drawn frame by frame into the same live slots a run draws into."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from engine import Trace
from engine.timing.metrics import replay_pace
from ui.state import app_state

REPLAY_MAX_S = 20.0  # a replay holds a server thread this long at most
REPLAY_STEP_MAX_S = 2.0  # a trace's step, at most (a serving run or a load: its frames)
REPLAY_FRAMES = 40  # a serving run or a load: frames drawn at most
LOAD_FRAME_MS = 250.0  # a load: one frame per this much recorded time (fewer for a short load)


@dataclass(frozen=True, slots=True)
class LiveSlots:
    """Where a (partial) record is drawn, live and when done: a status line (progress, or the
    replay's banner), then one placeholder per view, in the page's order."""

    status: DeltaGenerator
    views: dict[str, DeltaGenerator]

    @classmethod
    def make(cls, *views: str) -> LiveSlots:
        return cls(st.empty(), {name: st.empty() for name in views})

    def __getitem__(self, view: str) -> DeltaGenerator:
        return self.views[view]


def paced(gaps_s: Sequence[float], max_total_s: float = REPLAY_MAX_S,
          max_step_s: float = math.inf) -> list[float]:
    """The waits before each frame: the recorded gaps, each within [0, `max_step_s`], sped up
    together so that the replay ends within `max_total_s` (engine/timing/metrics.py
    `replay_pace`'s rule, for records that are not traces)."""
    waits = [min(max(g, 0.0), max_step_s) for g in gaps_s]
    total = sum(waits)
    scale = max_total_s / total if total > max_total_s else 1.0
    return [w * scale for w in waits]


def trace_waits(trace: Trace, speed: float | None) -> list[float]:
    """Seconds before each step of a trace's replay at `speed` × the recorded pace (None: at
    once): `replay_pace`, its bounds scaled so that a slowed replay still ends within
    REPLAY_MAX_S."""
    if speed is None:
        return [0.0] * len(trace.steps)
    slower = min(speed, 1.0)
    return [w / speed for w in replay_pace(trace, REPLAY_MAX_S * slower, REPLAY_STEP_MAX_S * slower)]


def step_frames(steps: int, frames: int = REPLAY_FRAMES) -> list[int]:
    """How many of a run's `steps` each frame shows (at most `frames` frames, the last whole)."""
    return sorted({max(1, math.ceil(i * steps / frames)) for i in range(1, frames + 1)})


def even_frames(end_ms: float) -> list[float]:
    """The recorded moments (ms) a load's frames show: evenly spaced up to `end_ms`."""
    count = max(1, min(REPLAY_FRAMES, int(end_ms / LOAD_FRAME_MS) + 1))
    return [end_ms * k / count for k in range(1, count + 1)]


def replay(slots: LiveSlots, banner: str, waits: Sequence[float],
           draw: Callable[[int], None]) -> None:
    """The replay loop: the banner in the status line, then frame n (1, 2, …) drawn after its
    wait."""
    slots.status.info(banner, icon=":material/replay:")
    for n, wait in enumerate(waits, start=1):
        time.sleep(wait)
        draw(n)


def ask_replay(kind: str) -> None:
    """The next page run replays the shown record of `kind` ("trace", "serving", "load")."""
    app_state().page.replays.add(kind)


def replay_asked(kind: str) -> bool:
    """Whether this page run replays `kind` (asked once: the next run does not)."""
    replays = app_state().page.replays
    asked = kind in replays
    replays.discard(kind)
    return asked
