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
    at = generate(fresh(monkeypatch, hosted=True).run(), "Name a colour.", tokens=4)
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
