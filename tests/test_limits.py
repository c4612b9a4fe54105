"""Server-side caps: every engine call that runs the model on a visitor's input refuses, with one
line, what is over the limit it is given — before any forward."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine import GenerationSettings, InputError, Run
from engine.__main__ import main
from engine.kv.cachelab import cache_on_off, compare_caches
from engine.kv.kvcache import CacheConfig
from engine.lens.inspect_head import capture_qkv
from engine.timing.metrics import replay_pace


def test_cache_on_off_refuses_long_outputs_and_prompts(tiny_lm):
    with pytest.raises(InputError, match="between 1 and 64"):
        next(cache_on_off(tiny_lm, "Hi", [256], max_prompt_tokens=256, max_new_tokens=64))
    with pytest.raises(InputError, match="limit is 8"):
        next(cache_on_off(tiny_lm, "word " * 50, [4], max_prompt_tokens=8, max_new_tokens=64))


def test_teacher_forcing_and_the_one_head_view_refuse_long_or_foreign_sequences(tiny_lm):
    with pytest.raises(InputError, match="at most 10"):
        next(compare_caches(tiny_lm, list(range(8)), list(range(5)), [CacheConfig("int8")], 10))
    with pytest.raises(InputError, match="at most 10"):
        capture_qkv(tiny_lm, list(range(11)), 0, max_tokens=10)
    with pytest.raises(InputError, match="vocabulary"):
        capture_qkv(tiny_lm, [1, tiny_lm.spec.vocab_size], 0, max_tokens=10)
    assert capture_qkv(tiny_lm, [1, 2, 3], 0, max_tokens=10).query.shape[1] == 3


def test_a_replay_never_sleeps_long(tiny_lm):
    trace = Run(tiny_lm, "Hi", GenerationSettings(max_new_tokens=4, seed=0)).run_all()
    assert sum(replay_pace(trace)) == pytest.approx(trace.token_times_ms[-1] / 1000)
    slow = replace(trace, steps=tuple(replace(s, latency_ms=3_600_000.0) for s in trace.steps))
    waits = replay_pace(slow, max_total_s=20, max_step_s=2)
    assert max(waits) <= 2 and sum(waits) <= 20 + 1e-9 and len(waits) == len(trace.steps)


@pytest.mark.parametrize("source", ["x" * 300, "a/" * 10 + "b" * 300, "nul\0byte", "~nobody-here/x",
                                    "y" * 5000])
def test_odd_model_ids_are_one_line(source, capsys):
    assert main(["run", "hi", "--model", source]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
