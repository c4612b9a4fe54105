"""Trace file: exact round trip, no pickle, clear errors on damaged or foreign files."""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import replace

import numpy as np
import pytest

from engine import GenerationSettings, TraceFormatError, generate_trace, load_trace, save_trace
from engine.records.trace import traces_equal
from engine.records.tracefile import FORMAT_VERSION, META_KEY, trace_to_bytes


@pytest.fixture(scope="module")
def trace(tiny_lm):
    return generate_trace(tiny_lm, "Emoji 🌍 and 世界", GenerationSettings(max_new_tokens=6,
                                                                           temperature=0.8, seed=3))


def test_round_trip_is_exact(trace, tmp_path):
    path = tmp_path / "run.trace.npz"
    save_trace(trace, path)
    back = load_trace(path)
    assert traces_equal(trace, back)
    assert back.output_text == trace.output_text and back.ttft_ms == trace.ttft_ms
    assert back.steps[0].attention.dtype == np.float16
    assert traces_equal(load_trace(path.read_bytes()), trace)


def test_traces_equal_notices_differences(trace):
    other = load_trace(trace_to_bytes(trace))
    other.steps[1].attention[0, 0, 0, 0] += 1
    assert not traces_equal(trace, other)


def test_partial_trace_round_trips(tiny_lm):
    from engine import Run

    run = Run(tiny_lm, "Hello", GenerationSettings(max_new_tokens=20))
    for step in run:
        if step.index == 1:
            run.stop()
    partial = run.trace()
    assert partial.stop_reason == "stopped"
    assert traces_equal(load_trace(trace_to_bytes(partial)), partial)


def _rewrite_meta(data: bytes, change) -> bytes:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(arrays[META_KEY].tobytes())
    change(meta)
    arrays[META_KEY] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def test_unknown_version_is_refused(trace):
    newer = _rewrite_meta(trace_to_bytes(trace), lambda m: m.update(version=FORMAT_VERSION + 1))
    with pytest.raises(TraceFormatError, match="newer"):
        load_trace(newer)


def test_foreign_format_is_refused(trace):
    foreign = _rewrite_meta(trace_to_bytes(trace), lambda m: m.update(format="something-else"))
    with pytest.raises(TraceFormatError, match="not an Inference Explorer trace"):
        load_trace(foreign)


@pytest.mark.parametrize("cut", [10, 1000, -200])
def test_truncated_file_is_refused(trace, cut):
    data = trace_to_bytes(trace)
    with pytest.raises(TraceFormatError):
        load_trace(data[:cut])


def test_random_bytes_and_other_zips_are_refused():
    with pytest.raises(TraceFormatError):
        load_trace(b"\x00" * 100)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("hello.txt", "hi")
    with pytest.raises(TraceFormatError, match="no metadata"):
        load_trace(buffer.getvalue())


def test_pickled_arrays_are_never_loaded(trace):
    with np.load(io.BytesIO(trace_to_bytes(trace)), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["step0.top_ids"] = np.array([object()], dtype=object)
    out = io.BytesIO()
    np.savez(out, **arrays)
    with pytest.raises(TraceFormatError):
        load_trace(out.getvalue())


def test_wrong_dtype_is_refused(trace):
    with np.load(io.BytesIO(trace_to_bytes(trace)), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["step0.attention"] = arrays["step0.attention"].astype(np.float64)
    out = io.BytesIO()
    np.savez(out, **arrays)
    with pytest.raises(TraceFormatError, match="dtype"):
        load_trace(out.getvalue())


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(TraceFormatError, match="cannot read"):
        load_trace(tmp_path / "nope.npz")


def _experiments():
    from engine.experiments import Experiments
    from engine.kernels.compiled import DecodeComparison
    from engine.kv.cachelab import OnOff, VariantRun
    from engine.kv.kvcache import CacheConfig
    from engine.kv.shrink.needle import LengthPoint, NeedleResult, NeedleRun
    from engine.kv.shrink.run import ShrinkRun
    from engine.timing.dtype_compare import DtypeComparison, DtypeRun
    from engine.timing.roofline import Work
    from engine.timing.sweeps import SweepPoint

    return Experiments(
        sweeps={"batch": (SweepPoint(1, 20.0, 50.0, (21.0, 20.0, 19.5)),
                          SweepPoint(8, 24.0, 333.3, (24.0, 25.0, 23.0)))},
        cache_on_off=(OnOff(16, np.array([5.0, 6.0]), np.array([9.0, 30.0]), True),),
        cache_variants=(VariantRun(CacheConfig("window", 32, 4), np.array([0.0, 0.25]),
                                   np.array([True, False]), np.array([100.0, 120.0])),),
        decode_comparison=DecodeComparison(40, 32, 3, 90.0, None, 0.0, True, (5, 6), Work(2e8, 5e8),
                                           17.5, "", 41.0),
        dtype_comparison=DtypeComparison(64, 16, 2, "float32", (
            DtypeRun("float32", 80.0, (81.0, 79.0), 1.0, True, (5, 6)),
            DtypeRun("bfloat16", 40.0, (41.0, 39.0), 0.5, False, (5, 7)))),
        cache_shrink=(ShrinkRun("h2o", "25%", 3, 10, np.array([0.0, 0.5, 0.25]),
                                np.array([True, False, True]), np.array([1.5, 2.0]),
                                np.array([1.0, 1.5]), np.array([700.0, 720.0, 720.0]),
                                np.array([900.0, 990.0, 1080.0]), np.array([720.0, 740.0]),
                                np.array([990.0, 1080.0]), np.array([3.0, 3.5]),
                                np.array([2.0, 2.5]), 1,
                                np.full((2, 2, 12), 1 / 12, dtype=np.float32)),),
        long_context=(LengthPoint(256, 1_769_472, 210.0, 31.0), LengthPoint(512, 3_538_944, 400.0, 33.5)),
        needle=NeedleRun(1000, 0.25, (NeedleResult(None, "full", True, -0.4, 900),
                                      NeedleResult("h2o", "64", False, -9.9, 90))))


def test_a_lecture_pack_carries_its_experiment_results(trace):
    from engine.files import read_trace_file

    found = _experiments()
    back = read_trace_file(trace_to_bytes(trace, found))
    assert traces_equal(back.trace, trace)
    got = back.experiments
    assert got.sweeps == found.sweeps
    assert got.cache_on_off[0].speedup == pytest.approx(39 / 11)
    assert got.cache_on_off[0].same_tokens
    assert got.cache_variants[0].config.label == "window 32 + 4 sinks"
    assert got.cache_variants[0].agreement == 0.5
    assert got.decode_comparison == found.decode_comparison  # a plain dataclass: field equality
    assert got.dtype_comparison == found.dtype_comparison
    assert got.sweeps["batch"][0].repeats_ms == (21.0, 20.0, 19.5)
    shrink, want = got.cache_shrink[0], found.cache_shrink[0]
    assert (shrink.method, shrink.budget, shrink.count, shrink.layer) == ("h2o", "25%", 3, 1)
    assert shrink.summary() == want.summary()
    assert np.allclose(shrink.rows, want.rows, atol=1e-4)
    assert got.long_context == found.long_context and got.needle == found.needle
    assert read_trace_file(trace_to_bytes(trace)).experiments.empty


def _older_file(trace, version: int) -> bytes:
    """The trace written as format `version` wrote it: v1 had no experiments, v1 and v2 no
    forward / CPU time and no machine record, v1–v3 no decoder record, v1–v6 no branch record."""
    buffer = io.BytesIO(trace_to_bytes(trace))
    with zipfile.ZipFile(buffer) as archive:
        parts = {i.filename: archive.read(i) for i in archive.infolist()}
    meta = json.loads(np.load(io.BytesIO(parts["meta.json.npy"])).tobytes())
    meta["version"] = version
    del meta["decoder"], meta["branch"]
    for record in meta["steps"]:
        del record["batch"]
    if version <= 2:
        del meta["machine"]
        for record in meta["steps"]:
            for name in ("forward_ms", "cpu_ms", "others_share"):
                del record[name]
    if version == 1:
        del meta["experiments"]
    out = io.BytesIO()
    np.savez_compressed(out, **{name.removesuffix(".npy"): np.load(io.BytesIO(data))
                                for name, data in parts.items() if name != "meta.json.npy"},
                        **{META_KEY: np.frombuffer(json.dumps(meta).encode(), np.uint8)})
    return out.getvalue()


def _unmeasured(trace, version: int):
    """What an older file gives: unknown timing and decoder, and no hidden states (version 6)."""
    if version == 3:
        return replace(trace, decoder=None, steps=tuple(replace(s, hidden=None) for s in trace.steps))
    steps = tuple(replace(s, forward_ms=None, cpu_ms=None, others_share=None, hidden=None)
                  for s in trace.steps)
    return replace(trace, steps=steps, machine=None, decoder=None)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_older_files_are_upgraded_with_unknown_timing(trace, version):
    from engine.files import read_trace_file

    back = read_trace_file(_older_file(trace, version))
    assert traces_equal(back.trace, _unmeasured(trace, version)) and back.experiments.empty
    assert back.trace.decoder is None and trace.decoder is not None
    assert (back.trace.machine is None) == (version <= 2)
    assert (back.trace.steps[1].cpu_ms is None) == (version <= 2)
    assert FORMAT_VERSION == 8


def test_a_version_7_file_ran_every_step_alone_and_batch_sizes_round_trip(trace):
    """Version 8 records each step's batch size; a version 7 file's steps all ran alone."""
    batched = replace(trace, steps=(trace.steps[0], *(replace(s, batch=3) for s in trace.steps[1:])))
    assert [s.batch for s in load_trace(trace_to_bytes(batched)).steps] == \
        [1] + [3] * (len(trace.steps) - 1)
    def as_version_7(meta):
        meta["version"] = 7
        for record in meta["steps"]:
            del record["batch"]

    back = load_trace(_rewrite_meta(trace_to_bytes(batched), as_version_7))
    assert [s.batch for s in back.steps] == [1] * len(trace.steps)


def test_the_decoder_record_round_trips_and_is_checked(trace):
    from engine.records.trace import DecoderUsed

    assert trace.decoder.name == "torch" and trace.decoder.weights == "fp32"
    native = replace(trace, decoder=DecoderUsed("native", None, "q4_0", 12_345))
    assert load_trace(trace_to_bytes(native)).decoder == native.decoder
    for bad in ({"name": "native", "reason": None, "weights": "q4_0", "weight_bytes": -1},
                {"name": "native", "reason": None, "weights": "", "weight_bytes": 1},
                {"name": "gpu", "reason": None, "weights": "fp32", "weight_bytes": 1},
                {"name": "torch", "reason": None, "weights": "fp32", "weight_bytes": 1},
                {"name": "native", "reason": "why", "weights": "fp32", "weight_bytes": 1},
                {"name": "torch", "reason": "x", "weights": "fp32", "weight_bytes": 1, "extra": 1}):
        with pytest.raises(TraceFormatError):
            load_trace(_rewrite_meta(trace_to_bytes(trace), lambda m, bad=bad: m.update(decoder=bad)))


def test_timing_and_machine_records_round_trip(trace):
    back = load_trace(trace_to_bytes(trace))
    assert trace.machine is not None and back.machine == trace.machine
    for a, b in zip(trace.steps, back.steps):
        assert (a.forward_ms, a.cpu_ms, a.others_share) == (b.forward_ms, b.cpu_ms, b.others_share)
        assert 0 < a.forward_ms <= a.latency_ms and a.cpu_ms >= 0


def test_a_version_5_file_opens_without_its_final_normed_hidden_states(trace):
    """Version 5 recorded the hidden states' last row after the final norm; read as the residual
    stream it would be wrong, so such a file opens without hidden states, the rest intact."""
    assert all(s.hidden is not None for s in trace.steps)
    back = load_trace(_rewrite_meta(trace_to_bytes(trace), lambda m: m.update(version=5)))
    assert all(s.hidden is None for s in back.steps)
    assert traces_equal(back, replace(trace, steps=tuple(replace(s, hidden=None) for s in trace.steps)))
    assert all(s.hidden is not None for s in load_trace(trace_to_bytes(trace)).steps)
