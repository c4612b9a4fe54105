"""Live runs decoded in one batch (engine/serving/batcher.py): each run's trace equals its solo
run's — tokens, attention (the prompt's whole matrices and every step's row), residual stream,
KV bytes — and its steps, the prefill's too, say they were shared."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from engine.runner import Run
from engine.serving.batcher import StepBatcher
from engine.settings import GenerationSettings

PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.",
           "List three prime numbers.", "Why is the sky blue?")


def settings(**kw) -> GenerationSettings:
    return GenerationSettings(max_new_tokens=10, decoder="torch", **kw)


def run_together(lm, batcher, prompts, how) -> list:
    """Each prompt's run in a thread of its own, all started at once; their traces."""
    traces: list = [None] * len(prompts)
    start = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        start.wait()
        traces[i] = Run(lm, prompts[i], how, native=batcher).run_all()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return traces


def test_batched_runs_equal_their_solo_runs(lm):
    how = settings(record_hidden=True)
    batched_how = GenerationSettings(max_new_tokens=10, record_hidden=True)
    solo = [Run(lm, p, how).run_all() for p in PROMPTS]
    batcher = StepBatcher(lm, lm.model, "fp32", lm.spec.weight_bytes, slots=1024, max_tokens=256)
    together = run_together(lm, batcher, PROMPTS, batched_how)
    assert max(step.batch for t in together for step in t.steps) > 1, "no step was shared"
    assert max(t.steps[0].batch for t in together) > 1, "no prompts went through one forward"
    for alone, shared in zip(solo, together):
        assert shared.decoder.name == "batched"
        assert [s.token_id for s in shared.steps] == [s.token_id for s in alone.steps]
        for a, b in zip(alone.steps, shared.steps):
            assert a.kv_bytes == b.kv_bytes
            assert b.attention.shape == a.attention.shape
            np.testing.assert_allclose(b.attention.astype(np.float32),
                                       a.attention.astype(np.float32), atol=2e-3)
            np.testing.assert_allclose(b.hidden, a.hidden, rtol=1e-3, atol=1e-3)
            np.testing.assert_allclose(b.top_probs, a.top_probs, atol=1e-4)
            assert b.forward_ms <= b.latency_ms
    assert batcher.running == 0 and batcher.reserved_blocks == 0


def test_a_full_batch_seats_the_next_run_when_one_leaves(lm):
    batcher = StepBatcher(lm, lm.model, "fp32", lm.spec.weight_bytes, max_batch=2, slots=1024,
                          max_tokens=256)
    traces = run_together(lm, batcher, PROMPTS, GenerationSettings(max_new_tokens=6))
    assert all(len(t.steps) == 6 or t.stop_reason == "eos" for t in traces)
    assert max(step.batch for t in traces for step in t.steps) == 2
    assert batcher.running == 0


def test_a_stopped_or_abandoned_run_gives_its_place_back(lm):
    batcher = StepBatcher(lm, lm.model, "fp32", lm.spec.weight_bytes, slots=512, max_tokens=256)
    stop = threading.Event()
    run = Run(lm, PROMPTS[0], GenerationSettings(max_new_tokens=20), stop_event=stop,
              native=batcher)
    steps = iter(run)
    next(steps), next(steps)
    assert batcher.running == 1
    stop.set()
    assert list(steps) == [] and run.stop_reason == "stopped"
    assert batcher.running == 0 and batcher.reserved_blocks == 0
    abandoned = iter(Run(lm, PROMPTS[1], GenerationSettings(max_new_tokens=20), native=batcher))
    next(abandoned), next(abandoned)
    abandoned.close()  # a page that left mid-run
    assert batcher.running == 0


def test_runs_coming_and_going_under_load_all_finish_and_the_pool_is_reused(lm):
    """Twelve short runs through a batch of 3 whose pool holds three of them: runs leave while
    others prefill and load, and every later one finds its blocks (no deadlock, no leak)."""
    how = GenerationSettings(max_new_tokens=4)
    batcher = StepBatcher(lm, lm.model, "fp32", lm.spec.weight_bytes, max_batch=3,
                          slots=3 * 48, max_tokens=48)
    prompts = [f"Count to {n}." for n in range(12)]
    traces: list = [None] * len(prompts)

    def one(i: int) -> None:
        traces[i] = Run(lm, prompts[i], how, native=batcher).run_all()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "a run never finished"
    assert all(t.decoder.name == "batched" and len(t.steps) >= 1 for t in traces)
    assert batcher.running == 0 and batcher.reserved_blocks == 0


def test_a_run_longer_than_a_seat_is_refused_in_one_line(lm):
    batcher = StepBatcher(lm, lm.model, "fp32", lm.spec.weight_bytes, slots=512, max_tokens=64)
    trace = Run(lm, PROMPTS[0], GenerationSettings(max_new_tokens=60), native=batcher).run_all()
    assert trace.decoder.name == "torch" and "exceed" in trace.decoder.reason


@pytest.mark.parametrize("batch", [0, 5000, 1.5])
def test_the_trace_reader_checks_the_batch_size(lm, batch):
    from dataclasses import replace

    from engine.records.tracecheck import check_trace
    from engine.records.tracefile import TraceFormatError

    trace = Run(lm, "Hi", GenerationSettings(max_new_tokens=2)).run_all()
    bad = replace(trace, steps=(trace.steps[0], replace(trace.steps[1], batch=batch)))
    with pytest.raises(TraceFormatError, match="batch size"):
        check_trace(bad)


class _Turn:
    """ui/turns.py's FairLock as a batch's turn (ui/batching.py's FairTurn, without the app)."""

    def __init__(self, lock) -> None:
        self.lock = lock

    def acquire(self, on_wait=None) -> None:
        self.lock.acquire(on_wait, client="batch")

    def release(self) -> None:
        self.lock.release()

    @property
    def others_waiting(self) -> bool:
        return self.lock.waiting > 0


@pytest.mark.parametrize("slice_s", [0.0, 600.0])
def test_the_batch_holds_the_fair_turn_while_runs_decode(lm, slice_s):
    """The batch takes the app's turn as one client and keeps it while runs decode — another
    visitor's whole-machine job gets it between two steps once the batch has held its slice
    (0 here: at once), or when the batch empties — and gives it back at the end."""
    from ui.turns import FairLock

    lock = FairLock()
    batcher = StepBatcher(lm, lm.model, "fp32", lm.spec.weight_bytes, slots=1024, max_tokens=256,
                          turn=_Turn(lock), slice_s=slice_s)
    how = GenerationSettings(max_new_tokens=12)
    got: list[tuple[int, float]] = []  # (runs in the batch, when) as the other job got the turn
    runs = [Run(lm, p, how, native=batcher) for p in PROMPTS[:2]]
    steps = [iter(r) for r in runs]
    for s in steps:
        next(s)  # both prefilled: the batch holds the turn
    assert lock.locked() and batcher.running == 2

    def other() -> None:
        with lock.turn(client="other"):
            got.append((batcher.running, time.monotonic()))

    job = threading.Thread(target=other)
    job.start()
    threads = [threading.Thread(target=lambda s=s: [None for _ in s]) for s in steps]
    for t in threads:
        t.start()
    for t in threads + [job]:
        t.join(120)
    assert got, "the other job never got the turn"
    assert (got[0][0] == 2) == (slice_s == 0.0)  # mid-batch only when the slice is spent
    assert all(len(r.steps) == 12 or r.stop_reason == "eos" for r in runs)
    assert not lock.locked() and batcher.running == 0


def test_a_prefill_waiting_for_the_turn_does_not_count_the_wait(lm):
    """As a run in the queue does not count its wait, a batched run's prefill step is timed from
    when it has the model: its wait for another job's turn is not its TTFT."""
    from ui.turns import FairLock

    lock = FairLock()
    batcher = StepBatcher(lm, lm.model, "fp32", lm.spec.weight_bytes, slots=512, max_tokens=256,
                          turn=_Turn(lock))
    lock.acquire(client="other")
    threading.Timer(1.5, lock.release).start()
    start = time.monotonic()
    trace = Run(lm, PROMPTS[0], GenerationSettings(max_new_tokens=2), native=batcher).run_all()
    assert time.monotonic() - start >= 1.5
    assert trace.steps[0].latency_ms < 1500 and trace.decoder.name == "batched"


def test_prompts_and_steps_share_forwards_and_a_step_waits_for_runs_joining(lm, monkeypatch):
    """Prefills first: while a run is joining (its prefill not yet asked for), a decoding run's
    next step waits for it, at most PREFILL_FIRST_S; then the prompt and the step are one
    forward. Prompts beyond STEP_TOKENS go in the next forward."""
    import engine.serving.batcher as batching
    from engine.forward import prepare_prompt

    batcher = StepBatcher(lm, lm.model, "fp32", lm.spec.weight_bytes, slots=1024, max_tokens=256)
    ids = [prepare_prompt(lm.tokenizer, p, chat_template=False) for p in PROMPTS]
    decoding = batcher.decoder(64)  # a run that decodes: its prompt's K/V in the pool
    first = decoding.prefill(ids[0])
    assert first.batch == 1 and decoding.member in batcher._decoding
    token = int(first.logits.argmax())
    joiner = batcher.decoder(64)
    got: dict[str, object] = {}

    def join() -> None:
        with joiner.joining():
            time.sleep(0.5)  # the run's own work before it asks
            got["prefill"] = joiner.prefill(ids[1])

    thread = threading.Thread(target=join)
    thread.start()
    time.sleep(0.1)
    start = time.monotonic()
    step = decoding.step(token, len(ids[0]))
    thread.join(30)
    assert 0.3 <= time.monotonic() - start < batching.PREFILL_FIRST_S
    assert step.batch == 2 and got["prefill"].batch == 2  # one forward for both

    monkeypatch.setattr(batching, "PREFILL_FIRST_S", 0.3)
    with batcher.joining(-1):  # a run that never asks: the step waits PREFILL_FIRST_S only
        start = time.monotonic()
        decoding.step(int(step.logits.argmax()), len(ids[0]) + 1)
        assert 0.3 <= time.monotonic() - start < 10

    def two_prompts() -> list[int]:
        """Two runs joining at once (the step waits for both to ask): their prefills' batches."""
        late = [batcher.decoder(64), batcher.decoder(64)]
        both_in = threading.Barrier(2)
        outs: list = [None, None]

        def one(k: int) -> None:
            with late[k].joining():
                both_in.wait()
                outs[k] = late[k].prefill(ids[2 + k])

        threads = [threading.Thread(target=one, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for d in late:
            d.release()
        return [o.batch for o in outs]

    monkeypatch.setattr(batching, "PREFILL_FIRST_S", 5.0)
    assert two_prompts() == [2, 2]
    monkeypatch.setattr(batching, "STEP_TOKENS", len(ids[2]) + 1)
    assert two_prompts() == [1, 1]  # over STEP_TOKENS together: two forwards
    for d in (decoding, joiner):
        d.release()
