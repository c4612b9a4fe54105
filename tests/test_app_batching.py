"""Batched Generate runs in the app (ui/batching.py): hosted, a visitor's run decodes in the
server's batch and says so; with batching off, or a setting the batch does not decode, it runs
alone in the fair turn as before."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.test_app import fresh, generate
from ui.state import state_of

pytestmark = pytest.mark.real_model


def test_a_hosted_run_decodes_in_the_servers_batch(monkeypatch):
    monkeypatch.delenv("INFERENCE_EXPLORER_BATCHING", raising=False)
    at = fresh(monkeypatch, hosted=True).run()
    assert any("Decoder: **server's batch" in c.value for c in at.sidebar.caption)
    at = generate(at, "Name a colour.", tokens=4)
    assert not at.exception
    trace = state_of(at.session_state).trace
    assert trace.decoder.name == "batched" and len(trace.steps) >= 2
    assert all(s.batch >= 1 for s in trace.steps)
    assert any("decode steps by the server's batch" in c.value for c in at.caption)


@pytest.mark.parametrize("how", ["batching off", "cache off"])
def test_runs_the_batch_cannot_take_keep_the_turn(monkeypatch, how):
    monkeypatch.setenv("INFERENCE_EXPLORER_BATCHING", "0" if how == "batching off" else "1")
    at = fresh(monkeypatch, hosted=True).run()
    if how == "cache off":
        state = state_of(at.session_state)
        state.settings = replace(state.settings, kv_cache=False)
    at = generate(at, "Name a colour.", tokens=3)
    assert not at.exception
    assert state_of(at.session_state).trace.decoder.name != "batched"


def test_the_hosted_model_store_holds_both_weights_with_their_batches():
    """Hosted offers fp32 and q4_0: both entries, with their native decoders and their batches'
    K/V pools, fit HOSTED_MODEL_MB together (else visitors of one evict the other's model)."""
    from engine.models import ModelStore
    from ui.batching import MAX_BATCH, SLOTS
    from ui.config import HOSTED_MODEL_MB

    store = ModelStore(HOSTED_MODEL_MB << 20)
    for weights in ("fp32", "q4_0"):
        entry = store.get("default", weights)
        entry.native()
        entry.batcher(None, max_batch=MAX_BATCH, slots=SLOTS, max_tokens=320)
    assert len(store.entries()) == 2
    assert sum(e.nbytes for e in store.entries()) <= HOSTED_MODEL_MB << 20


def test_the_serving_page_shows_this_servers_batch_without_anyones_text(monkeypatch):
    monkeypatch.delenv("INFERENCE_EXPLORER_BATCHING", raising=False)
    at = generate(fresh(monkeypatch, hosted=True).run(), "Name a secret colour.", tokens=4)
    at.switch_page("pages/serving.py").run()
    assert not at.exception
    assert any(h.value == "This server's own batch, live" for h in at.subheader)
    labels = {m.label: m.value for m in at.metric}
    assert {"Runs decoding now", "Waiting to join", "Runs per step, last minute"} <= labels.keys()
    assert labels["Runs decoding now"] == "0"  # the run has ended: it left the batch
    assert labels["Runs per step, last minute"] == "1.0"  # it decoded alone
    assert not any("secret" in m.value for m in at.markdown if "batch" in m.value.lower())


def test_a_batchs_pages_draw_on_the_same_steps_and_a_run_alone_at_most_every_frame():
    from types import SimpleNamespace as NS

    from ui.batching import CHART_EVERY_S, FRAME_S, FRAME_STEPS, LiveFrames

    now = [0.0]
    batcher = NS(steps=0)
    run = NS(native=None)  # as a Run before its steps start: seated in the batch by its first
    frames = LiveFrames(run, clock=lambda: now[0])
    run.native = NS(batcher=batcher)
    drawn = []
    for i in range(3 * FRAME_STEPS):  # in a batch of 5: every FRAME_STEPS-th shared step
        batcher.steps += 1
        now[0] += 0.3
        step = NS(index=i, batch=5)
        if frames.due(step):
            drawn.append(batcher.steps)
            assert not frames.chart_due(step)  # a shared run's chart: at its end only
    assert drawn == [1, FRAME_STEPS, 2 * FRAME_STEPS, 3 * FRAME_STEPS]
    alone = LiveFrames(NS(native=None), clock=lambda: now[0])
    start, due, charts = now[0], [], []
    for i in range(200):  # 5 s of steps 25 ms apart
        now[0] += FRAME_S / 4
        step = NS(index=i, batch=1)
        if alone.due(step):
            due.append(i)
            if alone.chart_due(step):
                charts.append(now[0] - start)
    assert due[0] == 0 and all(b - a >= 4 for a, b in zip(due, due[1:]))
    assert charts[0] >= CHART_EVERY_S and len(charts) >= 3
    assert all(b - a >= CHART_EVERY_S - 1e-9 for a, b in zip(charts, charts[1:]))


def test_runs_per_step_weighs_each_step_by_its_forward_time():
    from ui.sections.server_batch import batch_over_time

    # one run alone for 18 quick steps, then three together for 29 slower ones (a walk's case:
    # the median of the steps said 1 while the chart's bars were mostly 3 runs high)
    recent = [(0.0, 1, 50.0)] * 18 + [(0.0, 3, 120.0)] * 29
    assert batch_over_time(recent) == (18 * 50 + 3 * 29 * 120) / (18 * 50 + 29 * 120)
    assert 2.5 < batch_over_time(recent) < 3
