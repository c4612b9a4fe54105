"""The block pool and the scheduler without a model: allocation, sharing, copy-on-write, reuse,
preemption, static vs continuous admission."""

import pytest

from engine.serving.block_manager import BlockManager
from engine.serving.record import RequestSpec, ServingConfig
from engine.serving.scheduler import Scheduler, Sequence


def test_blocks_are_taken_only_when_the_last_one_is_full():
    pool = BlockManager(num_blocks=8, block_size=4, prefix_sharing=False)
    assert pool.allocate(0, [1, 2, 3, 4, 5]) == 0
    assert pool.tables[0].blocks == [0, 1] and pool.free_blocks == 6
    assert pool.append(0, [6, 7, 8]) == [5, 6, 7]  # block 1 (slots 4..7) fills up
    assert len(pool.tables[0].blocks) == 2
    assert pool.append(0, [9]) == [2 * 4]  # a new block, physical 2
    assert pool.context_slots(0) == list(range(9))


def test_full_blocks_of_an_equal_prefix_are_shared_and_the_rest_is_not():
    pool = BlockManager(num_blocks=16, block_size=4, prefix_sharing=True)
    pool.allocate(0, list(range(10)))  # blocks: [0..3] [4..7] [8, 9]
    cached = pool.allocate(1, list(range(8)) + [50, 51, 52])
    assert cached == 8
    assert pool.tables[1].blocks[:2] == pool.tables[0].blocks[:2]
    assert pool.tables[1].blocks[2] != pool.tables[0].blocks[2]
    assert pool.shared_blocks() == 2
    assert pool.ref[pool.tables[0].blocks[0]] == 2
    # a different first block: nothing after it can be shared either (the key is the whole prefix)
    assert pool.allocate(2, [99] + list(range(1, 8)) + [1]) == 0


def test_sharing_off_shares_nothing():
    pool = BlockManager(num_blocks=16, block_size=4, prefix_sharing=False)
    pool.allocate(0, list(range(8)))
    assert pool.allocate(1, list(range(8))) == 0
    assert pool.shared_blocks() == 0


def test_a_fully_cached_prompt_recomputes_its_last_token_in_a_copy():
    pool = BlockManager(num_blocks=16, block_size=4, prefix_sharing=True)
    pool.allocate(0, list(range(8)))
    cached = pool.allocate(1, list(range(8)))
    assert cached == 7  # the last token is always computed, for its logits
    first, second = pool.tables[0].blocks, pool.tables[1].blocks
    assert second[0] == first[0]  # still shared
    assert second[1] != first[1]  # copied before writing into it
    assert pool.copies == [(first[1], second[1])]
    assert pool.ref[first[1]] == 1


def test_freed_blocks_are_reused_and_keep_their_prefix_until_then():
    pool = BlockManager(num_blocks=4, block_size=4, prefix_sharing=True)
    pool.allocate(0, list(range(8)))
    held = list(pool.tables[0].blocks)
    pool.free(0)
    assert pool.free_blocks == 4
    assert pool.allocate(1, list(range(8)) + [9]) == 8  # found again after its owner left
    assert pool.tables[1].blocks[:2] == held
    pool.free(1)
    pool.allocate(2, [40 + i for i in range(16)])  # takes every block, the cached ones too
    assert sorted(pool.tables[2].blocks) == [0, 1, 2, 3]
    pool.free(2)
    assert pool.allocate(3, list(range(8))) == 0  # their old contents are forgotten


def test_can_allocate_counts_the_first_new_token_and_cached_blocks():
    pool = BlockManager(num_blocks=3, block_size=4, prefix_sharing=True)
    assert pool.can_allocate(list(range(11)))  # 11 + 1 tokens → 3 blocks
    assert not pool.can_allocate(list(range(12)))  # 12 + 1 → 4 blocks
    pool.allocate(0, list(range(8)))
    assert pool.free_blocks == 1
    assert pool.can_allocate(list(range(8)) + [70, 71, 72])  # 2 blocks cached, 1 new


def test_truncate_frees_blocks_and_forgets_rewritten_keys():
    pool = BlockManager(num_blocks=8, block_size=4, prefix_sharing=True)
    pool.allocate(0, list(range(10)))
    pool.truncate(0, 6)
    assert len(pool.tables[0].blocks) == 2 and pool.free_blocks == 6
    assert pool.allocate(1, list(range(8)) + [5]) == 4  # block 2 (positions 4..7) may change now


def _scheduler(policy: str, max_batch: int = 2, blocks: int = 32) -> Scheduler:
    config = ServingConfig(scheduler=policy, max_batch=max_batch, block_size=4, num_blocks=blocks,
                           prefix_sharing=False)
    return Scheduler(config, BlockManager(blocks, 4, False))


def _seq(i: int, prompt_len: int = 5) -> Sequence:
    return Sequence(i, RequestSpec("p", tuple(range(1, prompt_len + 1)), 8))


def _produce(scheduler: Scheduler, plan, finished: set[int] = frozenset()) -> None:
    members = [s for s, *_ in plan.decodes] + [s for s, _ in plan.prefills]
    for seq in members:
        seq.output.append(7)
        if seq.id in finished:
            scheduler.finish(seq, "length")


@pytest.mark.parametrize("policy, admitted_second", [("continuous", [2]), ("static", [])])
def test_continuous_refills_a_free_slot_static_waits_for_the_batch(policy, admitted_second):
    scheduler = _scheduler(policy)
    for i in range(3):
        scheduler.arrive(_seq(i))
    plan = scheduler.schedule()
    assert [s.id for s, _ in plan.prefills] == [0, 1]
    _produce(scheduler, plan, finished={0})
    plan = scheduler.schedule()
    assert [s.id for s, *_ in plan.decodes] == [1]
    assert [s.id for s, _ in plan.prefills] == admitted_second


def test_a_full_pool_preempts_the_newest_request_which_waits_first_in_line():
    scheduler = _scheduler("continuous", max_batch=4, blocks=4)
    for i in range(3):
        scheduler.arrive(_seq(i, prompt_len=7))  # 7 + 1 tokens: 2 blocks each; two fit
    plan = scheduler.schedule()
    assert [s.id for s, _ in plan.prefills] == [0, 1] and scheduler.blocks.free_blocks == 0
    _produce(scheduler, plan)
    plan = scheduler.schedule()  # position 7 still fits both second blocks
    assert [s.id for s, *_ in plan.decodes] == [0, 1] and not plan.preempted
    _produce(scheduler, plan)
    plan = scheduler.schedule()  # position 8 needs a third block each: none is free
    assert [s.id for s in plan.preempted] == [1]
    assert [s.id for s, *_ in plan.decodes] == [0] and not plan.prefills
    assert [s.id for s in scheduler.waiting] == [1, 2]
    assert scheduler.waiting[0].preemptions == 1
    assert len(scheduler.blocks.tables[0].blocks) == 3


def test_serving_file_round_trip_and_a_crafted_file_gets_one_sentence():
    from engine.errors import TraceFormatError
    from engine.serving.record import BlockTableRow, RequestRecord, ServingRun, StepRecord
    from engine.serving.servingfile import load_serving, serving_to_bytes

    spec = RequestSpec("hi", (1, 2, 3), 4, 0.0)
    request = RequestRecord(0, spec, 0.1, (5, 6), (10.0, 20.0), (0, 1), "ab", 0, 0, "length")
    steps = (StepRecord(0, 0.1, 9.9, "prefill", (0,), (3,), (BlockTableRow(0, (2,), 3),), 3, 0, 0, 0,
                        cpu_ms=19.0, others_share=0.5),
             StepRecord(1, 10.0, 10.0, "decode", (0,), (1,), (BlockTableRow(0, (2,), 4),), 3, 0, 0, 0,
                        cpu_ms=5.0, others_share=0.5))
    run = ServingRun("m", "fp32", ServingConfig(block_size=4, num_blocks=4), (request,), steps, 2,
                     "now", cores=2)
    assert load_serving(serving_to_bytes(run)) == run
    assert run.delayed_steps() == (1,)  # 5 ms of CPU in 10 ms on 2 threads, others at 50 %
    assert run.throughput_tok_s == pytest.approx(100.0) and request.itl_ms == (10.0,)
    good = serving_to_bytes(run).decode()
    for bad, says in [(good.replace('"num_blocks":4', '"num_blocks":2'), "outside the pool"),
                      (good.replace('"token_steps":[0,1]', '"token_steps":[0,7]'), "did not run"),
                      (good.replace('"version":1', '"version":9'), "newer"),
                      (good.replace('"others_share":0.5', '"others_share":7', 1), "between 0 and 1"),
                      (good.replace('"cached_tokens":0', '"cached_tokens":9223372036854775808'),
                       "more cached tokens"),
                      (good.replace('"token_ids":[5,6]', '"token_ids":[5,4294967296]'), "vocabulary"),
                      (good.replace('"preemptions":0', '"preemptions":3'), "preempted more often"),
                      (good.replace('"arrival_ms":0.0', '"arrival_ms":1e300'), "beyond a day"),
                      ("[" * ((1 << 20) + 1), "too many"), ("[" * 100000, "not JSON"),
                      ("\xff", "not JSON"), ('{"format": "x"}', "format"),
                      (good.replace('"version":1', '"version":1' + "0" * 5000), "not JSON")]:
        with pytest.raises(TraceFormatError, match=says):
            load_serving(bad.encode("utf-8", "surrogateescape") if bad != "\xff" else b"\xff")


def test_the_engine_refuses_what_it_must_not_start(tiny_lm, monkeypatch):
    from engine.errors import InputError
    from engine.serving.engine import ServingEngine

    ok = RequestSpec("p", (1, 2, 3), 4)
    with pytest.raises(InputError, match="outside the vocabulary"):
        ServingEngine(tiny_lm, [RequestSpec("p", (1, 10**9), 4)], ServingConfig())
    with pytest.raises(InputError, match="after an hour"):
        ServingEngine(tiny_lm, [ok, RequestSpec("p", (1,), 4, 1e10)], ServingConfig())
    with pytest.raises(ValueError, match="at most 262,144 token slots"):
        ServingConfig(block_size=1024, num_blocks=65536)
    monkeypatch.setattr("engine.quant.variants.available_memory", lambda: 10_000)
    with pytest.raises(InputError, match="half of the"):
        ServingEngine(tiny_lm, [ok], ServingConfig())


def test_the_consumers_time_between_steps_is_not_the_streams(tiny_lm):
    import time

    from engine.serving.engine import ServingEngine

    specs = [RequestSpec("p", (1, 2, 3), 6), RequestSpec("q", (4, 5), 6)]
    engine = ServingEngine(tiny_lm, specs, ServingConfig(block_size=4, num_blocks=16))
    start, slept = time.perf_counter(), 0.0
    for _ in engine:
        time.sleep(0.05)  # a page drawing its charts
        slept += 0.05
    wall_ms = (time.perf_counter() - start) * 1000
    run = engine.record()
    # the stream's clock paused for every sleep: its span is at most the wall time less them
    # (no bound on how fast a step is: a busy machine only makes both sides longer)
    assert run.duration_ms <= wall_ms - slept * 1000 + 1.0, (run.duration_ms, wall_ms, slept)


def test_passed_over_counts_requests_a_step_left_out():
    from engine.serving.metrics import passed_over
    from engine.serving.record import BlockTableRow, RequestRecord, ServingRun, StepRecord

    def request(i, admitted):
        return RequestRecord(i, RequestSpec("p", (1, 2), 2, 0.0), admitted, (5,), (admitted + 5,),
                             (0 if admitted < 1 else 1,), "", 0, 0, "length")
    steps = (StepRecord(0, 0.2, 5.0, "prefill", (0,), (2,), (BlockTableRow(0, (0,), 2),), 3, 0, 0, 1),
             StepRecord(1, 5.2, 5.0, "mixed", (0, 1), (1, 2), (BlockTableRow(1, (1,), 2),), 3, 0, 0, 0))
    run = ServingRun("m", "fp32", ServingConfig(max_batch=1, block_size=4, num_blocks=4),
                     (request(0, 0.2), request(1, 5.2)), steps, 2, "now")
    assert [r.id for r in passed_over(run)] == [1]  # 0 waited 0.2 ms for the first step: not
