"""Work formulas against hand computation, micro-benchmarks and sweeps."""

from __future__ import annotations

import pytest
import torch

from engine import GenerationSettings, generate_trace
from engine.kernels import microbench
from engine.kernels.microbench import Ceilings
from engine.spec import ModelSpec
from engine.timing.roofline import Work, forward_work, step_work, utilization
from engine.timing.sweeps import batch_sweep, context_sweep, prompt_length_sweep

TINY = ModelSpec(name="hand", model_type="llama", layers=2, heads=4, kv_heads=2, head_dim=8,
                 hidden_size=32, intermediate_size=64, vocab_size=100, dtype="float32",
                 param_count=10_000, weight_bytes=40_000, max_context=128, rope_theta=1e4,
                 sliding_window=None, tie_word_embeddings=True)


def test_forward_work_by_hand():
    # decode: 1 new token after 9 cached. embed = 100·32 = 3,200.
    work = forward_work(TINY, 1, 9)
    matmul = 2 * (10_000 - 3_200) * 1 + 2 * 3_200  # 13,600 + 6,400 = 20,000
    attention = 4 * 2 * 4 * 8 * 10  # sees 10 positions: 2,560
    assert work.flops == matmul + attention == 22_560
    kv_per_token = 2 * 2 * 2 * 8 * 4  # 256 B
    assert work.bytes == 40_000 + kv_per_token * 10 == 42_560
    assert work.intensity == pytest.approx(22_560 / 42_560)
    # prefill of 3 tokens: token i sees i positions → 1 + 2 + 3 = 6
    pre = forward_work(TINY, 3, 0)
    assert pre.flops == 2 * 6_800 * 3 + 2 * 3_200 + 4 * 2 * 4 * 8 * 6 == 48_736
    assert pre.bytes == 40_000 + 256 * 3
    assert forward_work(TINY, 3, 0, kv_cache=False).bytes == 40_000


def test_step_work_follows_the_trace(tiny_lm):
    trace = generate_trace(tiny_lm, "Hello there", GenerationSettings(max_new_tokens=3))
    t = len(trace.prompt_token_ids)
    assert step_work(trace, trace.steps[0]) == forward_work(trace.model, t, 0)
    assert step_work(trace, trace.steps[2]) == forward_work(trace.model, 1, t + 1)
    off = generate_trace(tiny_lm, "Hello there", GenerationSettings(max_new_tokens=3, kv_cache=False))
    assert step_work(off, off.steps[2]) == forward_work(off.model, t + 2, 0, kv_cache=False)


def test_ceilings_are_positive_finite_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERENCE_EXPLORER_CACHE", str(tmp_path / "models"))
    first = microbench.ceilings("cpu", megabytes=16, n=128, spread_s=0.0)
    assert not first.cached
    assert 0 < first.bandwidth_gb_s < 1e4 and 0 < first.matmul_tflop_s < 1e4
    assert first.ridge > 0
    again = microbench.ceilings("cpu", megabytes=16, n=128, spread_s=0.0)
    assert again.cached and again.bandwidth_gb_s == first.bandwidth_gb_s
    assert (tmp_path / "ceilings.json").is_file()
    fresh = microbench.ceilings("cpu", refresh=True, megabytes=16, n=128, spread_s=0.0)
    assert not fresh.cached


def test_sweeps_give_one_point_per_size(tiny_lm):
    assert [p.size for p in prompt_length_sweep(tiny_lm, [4, 16, 32], repeats=1)] == [4, 16, 32]
    points = list(context_sweep(tiny_lm, [8, 24], steps=2, repeats=1))
    assert [p.size for p in points] == [8, 24] and all(p.ms > 0 for p in points)
    batch = list(batch_sweep(tiny_lm, [1, 2, 4], prompt_tokens=8, steps=2, repeats=1))
    assert [p.size for p in batch] == [1, 2, 4]
    for p in batch:
        assert p.tokens_per_s == pytest.approx(p.size * 1000 / p.ms)


def test_utilization_by_hand():
    ceil = Ceilings(device="x", bandwidth_gb_s=20.0, matmul_tflop_s=0.1, dtype="float32",
                    measured_at="now")
    assert ceil.ridge == 5.0  # 1e11 FLOP/s ÷ 2e10 B/s
    decode = utilization(Work(flops=2e8, bytes=5e8), ms=50.0, ceil=ceil)
    assert decode.flop_s == 4e9 and decode.bytes_s == 1e10
    assert decode.mfu == 0.04 and decode.mbu == 0.5 and decode.bound == "memory bandwidth"
    prefill = utilization(Work(flops=8e9, bytes=5e8), ms=200.0, ceil=ceil)  # 16 FLOP/B > 5
    assert prefill.bound == "compute" and prefill.mfu == 0.4
    bare = utilization(Work(flops=1.0, bytes=1.0), ms=1000.0)
    assert bare.mfu is None and bare.bound is None and bare.flop_s == 1.0


def test_ceilings_follow_the_weights_dtype(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERENCE_EXPLORER_CACHE", str(tmp_path / "models"))
    half = microbench.ceilings("cpu", "float16", megabytes=16, n=64, spread_s=0.0)
    assert half.dtype == "torch.float16"
    assert microbench.ceilings("cpu", "float16", megabytes=16, n=64, spread_s=0.0).cached
    assert not microbench.ceilings("cpu", "float32", megabytes=16, n=64, spread_s=0.0).cached


def test_ceilings_keep_the_best_reading(tmp_path, monkeypatch):
    """A ceiling is the best this machine has shown: a refresh in a slow moment keeps the old
    bandwidth, a faster read seen between decode runs raises it, nothing is measured unasked."""
    monkeypatch.setenv("INFERENCE_EXPLORER_CACHE", str(tmp_path / "models"))
    assert not microbench.raise_bandwidth("cpu", 1e3)  # nothing stored yet
    assert not (tmp_path / "ceilings.json").exists()
    monkeypatch.setattr(microbench, "measure_bandwidth", lambda *_a, **_k: 40.0)
    assert microbench.ceilings("cpu", megabytes=16, n=64, spread_s=0.0).bandwidth_gb_s == 40.0
    monkeypatch.setattr(microbench, "measure_bandwidth", lambda *_a, **_k: 30.0)
    assert microbench.ceilings("cpu", refresh=True, megabytes=16, n=64, spread_s=0.0).bandwidth_gb_s == 40.0
    assert not microbench.raise_bandwidth("cpu", 35.0)
    assert microbench.ceilings("cpu", "float16", megabytes=16, n=64, spread_s=0.0).bandwidth_gb_s == 40.0
    assert microbench.raise_bandwidth("cpu", 52.5)
    assert microbench.ceilings("cpu").bandwidth_gb_s == 52.5
    assert microbench.ceilings("cpu", "float16").bandwidth_gb_s == 52.5  # a device figure


def test_one_read_of_a_bandwidth_buffer():
    buffer = microbench.bandwidth_buffer(torch.device("cpu"), megabytes=8)
    assert buffer.nbytes == 8 * 2**20 and 0 <= float(buffer.min()) and float(buffer.max()) <= 1
    assert 0 < microbench.read_gb_s(buffer) < 1e4
