"""A fuzz of crafted trace files: every one gets one clear line, never a traceback or a memory spike.

Each case starts from a real trace file (the tiny model's) and breaks one thing, the way an
uploader on a hosted demo could. The reader, the CLI (`show --json`) and the app's upload path
must refuse each with one `TraceFormatError` line (CLI: exit 2), while the process's traced
allocations stay under MEMORY_BOUND — the bombs (a 2 MB file that inflates to 1.5 GB, a header
declaring 1.8 TiB, a 1.2 GB metadata member) are refused before anything that size is allocated.
"""

from __future__ import annotations

import io
import json
import tracemalloc
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from engine import GenerationSettings, Run, TraceFormatError, load_trace
from engine.__main__ import main
from engine.files import read_trace_file
from engine.records.tracefile import trace_to_bytes

MEMORY_BOUND = 64 << 20  # peak traced allocation while refusing any one file
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def base(tiny_lm) -> bytes:
    settings = GenerationSettings(max_new_tokens=3, seed=0, chat_template=False)
    return trace_to_bytes(Run(tiny_lm, "Hello there", settings).run_all())


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def header_only(descr: str, shape: tuple[int, ...], fortran: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": fortran,
                                                  "shape": shape})
    return buffer.getvalue()


def zipped(parts: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        warnings.simplefilter("ignore")  # "Duplicate name": one case writes a member twice
        for name, data in parts:
            archive.writestr(name, data)
    return buffer.getvalue()


def with_meta(data: bytes, edit: Callable[[dict], object]) -> bytes:
    parts = members(data)
    meta = json.loads(np.load(io.BytesIO(parts["meta.json.npy"])).tobytes())
    edit(meta)
    parts["meta.json.npy"] = npy(np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    return zipped(list(parts.items()))


def with_member(data: bytes, name: str, content: bytes | None) -> bytes:
    parts = members(data)
    if content is None:
        parts.pop(name)
    else:
        parts[name] = content
    return zipped(list(parts.items()))


# an .npy header whose dict never closes (an open triple-quoted string): numpy's parser fails
UNPARSABLE_NPY = (b"\x93NUMPY\x01\x00" + (118).to_bytes(2, "little")
                  + (b"{'descr': '<i8', 'fortran_order': False, 'shape': (10,), " + b"'" * 3)
                  .ljust(117) + b"\n")


def damaged(data: bytes, name: str, method: int = zipfile.ZIP_DEFLATED) -> bytes:
    """`data` with member `name` compressed by `method`, then bytes flipped mid-stream."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for member, content in members(data).items():
            archive.writestr(member, content)
    out = bytearray(buffer.getvalue())
    with zipfile.ZipFile(io.BytesIO(bytes(out))) as archive:
        info = archive.getinfo(name)
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for k in range(start + 10, start + min(info.compress_size, 60), 7):
        out[k] ^= 0xA5
    return bytes(out)


def flagged(data: bytes, name: str, bit: int) -> bytes:
    """`data` with a general-purpose flag bit (0x1: encrypted) set on member `name`."""
    out = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = archive.getinfo(name)
    out[info.header_offset + 6] |= bit  # the local header's flags
    central = out.find(b"PK\x01\x02")
    while central >= 0:  # and the central directory's entry for the same member
        length = int.from_bytes(out[central + 28: central + 30], "little")
        if out[central + 46: central + 46 + length] == name.encode():
            out[central + 8] |= bit
            break
        central = out.find(b"PK\x01\x02", central + 4)
    return bytes(out)


class _Repeated:
    """A member's compressor that deflates `chunk` once, ending on a full flush (so what follows
    owes it nothing), and hands out those bytes each time the same chunk is written: the deflate
    stream a compressor makes with a sync point before each chunk, without deflating gigabytes."""

    def __init__(self, real, chunk: bytes) -> None:
        self.real, self.chunk = real, chunk
        once = zlib.compressobj(9, zlib.DEFLATED, -15)
        self.block = once.compress(chunk) + once.flush(zlib.Z_FULL_FLUSH)

    def compress(self, data: bytes) -> bytes:
        if data is self.chunk:
            return self.real.flush(zlib.Z_FULL_FLUSH) + self.block
        return self.real.compress(data)

    def flush(self, *mode: int) -> bytes:
        return self.real.flush(*mode)


def bomb(data: bytes, name: str, header: bytes, size: int, fill: bytes = b"\0") -> bytes:
    """`data` with member `name` replaced by `header` and `size` bytes of `fill`, deflated."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for member, content in members(data).items():
            if member != name:
                archive.writestr(member, content)
        with archive.open(name, "w", force_zip64=True) as out:
            chunk = fill * ((16 << 20) // len(fill))
            out._compressor = _Repeated(out._compressor, chunk)
            out.write(header)
            for _ in range(size // len(chunk)):
                out.write(chunk)
    return buffer.getvalue()


def step(at: int, **changes) -> Callable[[dict], None]:
    return lambda meta: meta["steps"][at].update(changes)


def spec(**changes) -> Callable[[dict], None]:
    return lambda meta: meta["model"].update(changes)


def meta_key(key: str, value) -> Callable[[dict], None]:
    return lambda meta: meta.__setitem__(key, value)


# a shrink run as a file keeps it (engine/experiments.py shrink_to_dict): two positions, one step
SHRINK = {"method": "h2o", "budget": "8", "count": 8, "prompt_tokens": 5, "layer": 0,
          "kl": [0.0, 0.1], "agree": [True, True], "nll": [1.0], "dense_nll": [1.0],
          "kv_bytes": [1.0, 2.0], "dense_kv_bytes": [1.0, 2.0], "read_bytes": [2.0],
          "dense_read_bytes": [2.0], "step_ms": [1.0], "dense_step_ms": [1.0], "rows": None}

META_CASES: dict[str, Callable[[dict], object]] = {
    "layers 10^9": spec(layers=10**9),
    "heads and kv_heads 10^9": spec(heads=10**9, kv_heads=10**9),
    "head_dim 10^9": spec(head_dim=10**9),
    "vocab 10^12": spec(vocab_size=10**12),
    "vocab 0": spec(vocab_size=0),
    "layers as text": spec(layers="thirty"),
    "negative latency": step(1, latency_ms=-5.0),
    "NaN latency": step(1, latency_ms=float("nan")),
    "text latency": step(1, latency_ms="fast"),
    "10^9 ms latency": step(1, latency_ms=1e9),
    "negative tokenize time": meta_key("tokenize_ms", -1.0),
    "attention layers 999 and -1": meta_key("attention_layers", [999, -1]),
    "duplicate step index": step(2, index=1),
    "token id outside the vocabulary": step(1, token_id=10**7),
    "prompt id outside the vocabulary": lambda m: m["prompt_token_ids"].__setitem__(0, -3),
    "kv per layer of the wrong length": step(0, kv_bytes_per_layer=[0]),
    "kv bytes that do not add up": step(0, kv_bytes=1),
    "step 0 marked decode": step(0, phase="decode"),
    "unknown phase": step(1, phase="warmup"),
    "position off by one": step(1, position=999, context_len=999),
    "chosen probability NaN": step(0, chosen_prob=float("nan")),
    "chosen rank negative": step(0, chosen_rank=-1),
    "pieces and ids differ in length": lambda m: m["prompt_pieces"].append("x"),
    "empty prompt ids": lambda m: m.update(prompt_token_ids=[], prompt_pieces=[],
                                           prompt_special=[]),
    "metadata is a list": lambda m: m.clear(),
    "steps not a list": meta_key("steps", "many"),
    "a step is a list": lambda m: m["steps"].__setitem__(0, [1, 2]),
    "5,000 steps": lambda m: m.__setitem__("steps", m["steps"] * 1700),
    "newer version": meta_key("version", 99),
    "unknown stop reason": meta_key("stop_reason", "exploded"),
    "experiments with text": meta_key("experiments", {"sweeps": {"batch": [[1, "x", 2]]}}),
    "sweep repeats NaN": meta_key("experiments", {"sweeps": {"batch": [[1, 2.0, 2.0, [float("nan")]]]}}),
    "sweep with 40 repeats": meta_key("experiments", {"sweeps": {"batch": [[1, 2.0, 2.0, [1.0] * 40]]}}),
    "dtype run twice": meta_key("experiments", {"dtype_comparison": {
        "prompt_tokens": 4, "new_tokens": 4, "rounds": 1, "source_dtype": "float32", "runs": [
            {"dtype": "float16", "itl_ms": 1, "round_ms": [1], "ratio": 1, "same_tokens": True,
             "tokens": [1]}] * 2}}),
    "dtype unknown": meta_key("experiments", {"dtype_comparison": {
        "prompt_tokens": 4, "new_tokens": 4, "rounds": 1, "source_dtype": "int3", "runs": []}}),
    "unknown experiment": meta_key("experiments", {"sweeps": {"mining": []}}),
    "experiment times negative": meta_key("experiments", {"cache_on_off": [
        {"new_tokens": 4, "on_ms": [-1], "off_ms": [1], "same_tokens": True}]}),
    "prompt that is not text": meta_key("prompt", [["a"]]),
    "settings with bad types": meta_key("settings", {"max_new_tokens": "lots"}),
    "400-digit tokenize time": meta_key("tokenize_ms", 10**400),
    "400-digit latency": step(1, latency_ms=10**400),
    "zero latency": step(0, latency_ms=0.0),
    "forward longer than its step": step(1, forward_ms=1e6),
    "CPU time NaN": step(1, cpu_ms=float("nan")),
    "others' CPU share 3": step(0, others_share=3.0),
    "machine with 10⁹ threads": meta_key("machine", {"threads": 10**9, "cores": 2,
                                                      "load_before": 1.0, "load_after": 1.0,
                                                      "others_share": 0.1}),
    "machine with an extra field": meta_key("machine", {"threads": 2, "cores": 2,
                                                         "load_before": 1.0, "load_after": 1.0,
                                                         "others_share": 0.1, "x": 1}),
    "machine is a list": meta_key("machine", [1, 2]),
    "chosen probability true": step(0, chosen_prob=True),
    "fractional position": step(1, position=4.5),
    "version true": meta_key("version", True),
    "400-digit experiment number": meta_key("experiments", {"sweeps": {"batch": [[1, 10**400, 2]]}}),
    "cache variant without memory": meta_key("experiments", {"cache_variants": [
        {"kind": "int8", "kl": [0.1], "agree": [True], "kv_bytes": []}]}),
    "cache variant series of different lengths": meta_key("experiments", {"cache_variants": [
        {"kind": "int8", "kl": [0.1, 0.2], "agree": [True], "kv_bytes": [5, 6]}]}),
    "shrink run of an unknown method": meta_key("experiments", {"cache_shrink": [
        {**SHRINK, "method": "pickle"}]}),
    "shrink run with a bad budget": meta_key("experiments", {"cache_shrink": [
        {**SHRINK, "budget": "lots"}]}),
    "shrink run's rows past their shape": meta_key("experiments", {"cache_shrink": [
        {**SHRINK, "rows": {"shape": [1, 1, 2], "values": [0.5, 0.5, 0.5]}}]}),
    "shrink run's huge rows": meta_key("experiments", {"cache_shrink": [
        {**SHRINK, "rows": {"shape": [1, 10**6, 10**6], "values": []}}]}),
    "shrink run's series of different lengths": meta_key("experiments", {"cache_shrink": [
        {**SHRINK, "kv_bytes": [1.0]}]}),
    "long-context point of three numbers": meta_key("experiments", {"long_context": [[1, 2, 3]]}),
    "needle deeper than the text": meta_key("experiments", {"needle": {
        "tokens": 100, "depth": 1.5, "results": []}}),
    "needle with a positive log-probability": meta_key("experiments", {"needle": {
        "tokens": 100, "depth": 0.5, "results": [{"method": None, "budget": "full", "found": True,
                                                  "answer_logprob": 3.0, "kv_bytes": 1}]}}),
    "cache on/off of different lengths": meta_key("experiments", {"cache_on_off": [
        {"new_tokens": 4, "on_ms": [1, 2], "off_ms": [1], "same_tokens": True}]}),
    "kernel comparison of 0 ms": meta_key("experiments", {"decode_comparison": {
        "prompt_tokens": 4, "new_tokens": 4, "rounds": 1, "eager_itl_ms": 5e-324,
        "compiled_itl_ms": None, "compile_s": 0, "same_tokens": True, "tokens": [1],
        "flops": 1, "bytes": 1}}),
}


def _attention_shape(data: bytes) -> tuple[int, ...]:
    return np.load(io.BytesIO(members(data)["step0.attention.npy"])).shape


MEMBER_CASES: dict[str, Callable[[bytes], bytes]] = {
    "raw metadata member": lambda d: with_member(d, "meta.json.npy", b'{"format": 1}'),
    "raw array member": lambda d: with_member(d, "step0.top_ids.npy", b"\x01\x02\x03\x04"),
    "header declaring 1.8 TiB": lambda d: with_member(
        d, "step0.attention.npy", header_only("<f2", (2**40,)) + b"\0" * 64),
    "header larger than the member": lambda d: with_member(
        d, "step0.top_ids.npy", header_only("<i8", (1000,)) + b"\0" * 80),
    "attention stored as float32": lambda d: with_member(
        d, "step0.attention.npy", npy(np.zeros(_attention_shape(d), np.float32))),
    "attention of the wrong shape": lambda d: with_member(
        d, "step0.attention.npy", npy(np.zeros((1, 1, 2, 2), np.float16))),
    "attention with infinities": lambda d: with_member(
        d, "step0.attention.npy", npy(np.full(_attention_shape(d), np.inf, np.float16))),
    "hidden of the wrong shape": lambda d: with_member(
        d, "step0.hidden.npy", npy(np.zeros((2, 2), np.float32))),
    "top probabilities above 1": lambda d: with_member(
        d, "step0.top_probs.npy", npy(np.full(10, 7.0, np.float32))),
    "top ids outside the vocabulary": lambda d: with_member(
        d, "step1.top_ids.npy", npy(np.full(10, 10**9, np.int64))),
    "pickled object array": lambda d: with_member(
        d, "step0.top_ids.npy", npy(np.array([{"a": 1}] * 10, dtype=object))),
    "Fortran-order array": lambda d: with_member(
        d, "step0.hidden.npy", header_only("<f4", (3, 65), fortran=True) + b"\0" * 780),
    "missing top-k array": lambda d: with_member(d, "step1.top_probs.npy", None),
    "array for a step that does not exist": lambda d: with_member(
        d, "step9.top_ids.npy", npy(np.zeros(10, np.int64))),
    "unexpected member": lambda d: with_member(d, "evil.npy", npy(np.zeros(3))),
    "path-like member name": lambda d: with_member(d, "../../etc/passwd", b"root"),
    "member named twice": lambda d: zipped(list(members(d).items()) + [
        ("step0.top_ids.npy", npy(np.zeros(10, np.int64)))]),
    "20,000 members": lambda d: zipped([(f"x{i}", b"") for i in range(20_000)]),
    "no metadata": lambda d: with_member(d, "meta.json.npy", None),
    "attention only on the prefill": lambda d: with_member(d, "step1.attention.npy", None),
    "damaged deflate stream": lambda d: damaged(d, "step0.hidden.npy"),
    "encrypted member flag": lambda d: flagged(d, "step0.top_ids.npy", 0x1),
    "damaged LZMA member": lambda d: damaged(d, "step0.hidden.npy", zipfile.ZIP_LZMA),
    "unparsable .npy header": lambda d: with_member(d, "step0.top_ids.npy", UNPARSABLE_NPY),
    "metadata of 2 million empty objects": lambda d: with_member(d, "meta.json.npy", npy(
        np.frombuffer(b"[" + b"{}," * 2_000_000 + b"{}]", dtype=np.uint8))),
    "metadata nested 100,000 deep": lambda d: with_member(d, "meta.json.npy", npy(
        np.frombuffer(b"[" * 100_000 + b"]" * 100_000, dtype=np.uint8))),
    "truncated": lambda d: d[: len(d) // 2],
    "empty file": lambda d: b"",
    "random bytes": lambda d: bytes(np.random.default_rng(0).integers(0, 256, 4096, np.uint8)),
    "attention inflating to 1.5 GB": lambda d: bomb(
        d, "step0.attention.npy", header_only("<f2", (750 * 2**20,)), 1500 * 2**20),
    "metadata inflating to 1.2 GB": lambda d: bomb(
        d, "meta.json.npy", header_only("|u1", (1200 * 2**20,)), 1200 * 2**20, b" "),
}
CASES = {**{k: (lambda d, e=e: with_meta(d, e)) for k, e in META_CASES.items()}, **MEMBER_CASES}


@pytest.fixture(scope="module")
def crafted(base, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("crafted")
    files = {}
    for i, (name, make) in enumerate(CASES.items()):
        files[name] = folder / f"case{i}.trace.npz"
        files[name].write_bytes(make(base))
    return files


def test_the_base_file_is_valid(base):
    assert read_trace_file(base).trace.steps


def test_the_bombs_are_small_files(crafted):
    assert crafted["attention inflating to 1.5 GB"].stat().st_size < 3 << 20
    assert crafted["metadata inflating to 1.2 GB"].stat().st_size < 3 << 20


@pytest.mark.parametrize("case", list(CASES))
def test_each_crafted_file_gets_one_line_and_no_memory_spike(case, crafted):
    data = crafted[case].read_bytes()
    tracemalloc.start()
    try:
        with pytest.raises(TraceFormatError) as caught:
            load_trace(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert message and "\n" not in message and len(message) < 300, message
    assert peak < MEMORY_BOUND, f"{case}: peak {peak / 2**20:.0f} MB"


def test_the_cli_refuses_every_crafted_file_with_exit_2(crafted, capsys):
    for case, path in crafted.items():
        assert main(["show", str(path), "--json"]) == 2, case
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: ") and err.count("\n") == 1, (case, err)


def test_a_real_cli_process_prints_no_traceback(crafted, engine_cli):
    for case in ("header declaring 1.8 TiB", "attention inflating to 1.5 GB", "10^9 ms latency"):
        done = engine_cli("show", str(crafted[case]), "--json")
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1


def test_the_cli_refuses_what_is_not_a_regular_file(capsys):
    assert main(["show", "/dev/zero"]) == 2  # would otherwise read for ever
    assert "not a regular file" in capsys.readouterr().err


def test_views_refuse_traces_too_large_to_draw(base):
    """A small valid file must not ask a page for gigabytes (heads × S² floats) or a million
    model-view tiles; the app also holds files to its token limit."""
    from dataclasses import replace

    from engine.records.tracecheck import check_viewable

    trace = load_trace(base)
    assert check_viewable(trace, 100) is trace
    with pytest.raises(TraceFormatError, match="up to 4"):
        check_viewable(trace, 4)
    with pytest.raises(TraceFormatError, match="too large to view"):
        check_viewable(replace(trace, model=replace(trace.model, heads=10**8)), 100)
    many = replace(trace, model=replace(trace.model, heads=10_000), attention_layers=(0, 1))
    with pytest.raises(TraceFormatError, match="too many to view"):
        check_viewable(many, 100)


def test_a_cap_below_the_file_size_refuses_it(base):
    with pytest.raises(TraceFormatError, match="limit here is"):
        load_trace(base, max_bytes=1024)
