"""The load-test file (engine/remote/loadfile.py): a LoadRun built by hand round-trips exactly, and
crafted files — the way an uploader on a hosted demo could break one — each get one
TraceFormatError sentence, never a traceback or a memory spike.
"""

from __future__ import annotations

import copy
import json
import math
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from engine.errors import TraceFormatError
from engine.remote.loadfile import (
    FORMAT_NAME,
    FORMAT_VERSION,
    load_loadtest,
    load_to_bytes,
    load_to_dict,
)
from engine.remote.record import Histogram, LoadConfig, LoadRun, MetricsSample, RemoteRequest

MEMORY_BOUND = 96 << 20  # peak traced allocation while refusing any one (small) crafted file

TTFT_BOUNDS = (0.001, 0.01, 0.1, 0.5, 1.0, math.inf)
ITL_BOUNDS = (0.01, 0.05, 0.1, math.inf)


def make_run() -> LoadRun:
    """Every kind of request and sample a load can leave: finished by length and by stop, cut by
    an error after tokens, refused before any, stopped mid-stream, never sent; server-side
    samples with and without histograms and speculative counters."""
    config = LoadConfig("http://127.0.0.1:8011/v1", "smollm2-135m",
                        ("What is recursion?", "Name a colour. ünïcødé ✓"), 6, 4, 2,
                        rate=2.5, chat_template=True, seed=7)
    requests = (
        RemoteRequest(0, "What is recursion?", 0.0, (210.5, 260.25, 311.0, 360.125),
                      (1, 1, 1, 1), (51, 52, 53, 54), "Recursion is", 12, "length", None,
                      (1, 9690, 2683)),
        RemoteRequest(1, "Name a colour. ünïcødé ✓", 400.0, (650.0, 700.0), (2, 1), (7, 8, 9),
                      "Blue.\n", 9, "stop"),
        RemoteRequest(2, "What is recursion?", 801.5, (1000.0,), (1,), (), "It", None, "error",
                      "the server closed the stream after 1 tokens"),
        RemoteRequest(3, "x", 900.0, (), (), (), "", None, "error", "HTTP 400: too long"),
        RemoteRequest(4, "What is recursion?", 1200.0, (1300.0,), (1,), (5,), "A", 12,
                      "stopped"),
        RemoteRequest(5, "Name a colour. ünïcødé ✓", None, (), (), (), "", None, "stopped"),
    )
    ttft0 = Histogram(TTFT_BOUNDS, (0.0, 0.0, 1.0, 4.0, 5.0, 5.0), 1.25, 5.0)
    ttft1 = Histogram(TTFT_BOUNDS, (0.0, 0.0, 2.0, 7.0, 9.0, 10.0), 4.5, 10.0)
    itl = Histogram(ITL_BOUNDS, (0.0, 30.0, 70.0, 71.0), 4.75, 71.0)
    samples = (
        MetricsSample(0.0, 0.0, 0.0, 0.0, 0.0, 120.0, 32.0, None, None, 900.0, ttft0, itl),
        MetricsSample(512.5, 2.0, 1.0, 0.0625, 1.0, 150.0, 48.0, 40.0, 25.0, 910.0, ttft1,
                      None),
        MetricsSample(1600.0, None, None, None, None, None, None, None, None, None, None, None),
    )
    return LoadRun(config, "smollm2-135m", requests, samples, "2026-12-03T13:00:00+00:00",
                   stopped=True, error=None, metrics_error="no server metrics: HTTP 503: busy",
                   kv_block_size=16, kv_blocks=23831)


@pytest.fixture(scope="module")
def run() -> LoadRun:
    return make_run()


@pytest.fixture(scope="module")
def base(run) -> dict[str, Any]:
    return json.loads(load_to_bytes(run))


def test_a_run_round_trips_exactly(run):
    data = load_to_bytes(run)
    again = load_loadtest(data)
    assert again == run
    assert again.samples[0].ttft.bounds[-1] == math.inf
    assert again.requests[5].sent_ms is None and again.samples[2].ttft is None
    assert load_to_bytes(again) == data  # and writes back byte for byte


def test_the_file_is_plain_json_with_its_name_and_version(run):
    d = json.loads(load_to_bytes(run).decode("utf-8"))
    assert (d["format"], d["version"]) == (FORMAT_NAME, FORMAT_VERSION) == (
        "inference-explorer-loadtest", 1)
    assert d["samples"][0]["ttft"]["bounds"][-1] == "+Inf"
    assert set(d) == {"format", "version", "server", "created", "stopped", "error",
                      "metrics_error", "kv_block_size", "kv_blocks", "config", "requests",
                      "samples"}
    assert set(d["requests"][0]) == {"prompt", "sent_ms", "chunk_ms", "chunk_tokens",
                                     "token_ids", "text", "prompt_tokens", "finish", "error",
                                     "prompt_token_ids"}
    assert load_to_dict(run) == d


def test_an_older_file_without_prompt_token_ids_still_loads(base):
    d = copy.deepcopy(base)
    for r in d["requests"]:
        del r["prompt_token_ids"]
    assert load_loadtest(json.dumps(d).encode()).requests[0].prompt_token_ids == ()


# --- crafted files ------------------------------------------------------------------------------

def top(key: str, value: Any) -> Callable[[dict], None]:
    return lambda d: d.__setitem__(key, value)


def cfg(key: str, value: Any) -> Callable[[dict], None]:
    return lambda d: d["config"].__setitem__(key, value)


def req(i: int, **changes: Any) -> Callable[[dict], None]:
    return lambda d: d["requests"][i].update(changes)


def sample(i: int, **changes: Any) -> Callable[[dict], None]:
    return lambda d: d["samples"][i].update(changes)


def hist(i: int, **changes: Any) -> Callable[[dict], None]:
    return lambda d: d["samples"][i]["ttft"].update(changes)


EDITS: dict[str, Callable[[dict], object]] = {
    "wrong format name": top("format", "inference-explorer-serving"),
    "no format name": lambda d: d.__delitem__("format"),
    "newer version": top("version", FORMAT_VERSION + 1),
    "version 0": top("version", 0),
    "version as text": top("version", "1"),
    "version true": top("version", True),
    "the file is a list": lambda d: ("replace", [d]),
    "config is a list": top("config", [1, 2]),
    "requests is an object": top("requests", {"0": {}}),
    "samples is text": top("samples", "many"),
    "a request is a list": lambda d: d["requests"].__setitem__(0, [1, 2]),
    "a sample is a number": lambda d: d["samples"].__setitem__(0, 3),
    "stopped as text": top("stopped", "yes"),
    "server missing": lambda d: d.__delitem__("server"),
    "prompt that is not text": req(0, prompt=["a"]),
    "sent_ms as text": req(0, sent_ms="soon"),
    "fractional chunk tokens": req(0, chunk_tokens=[1, 1.5, 1, 1]),
    "chunk tokens true": req(0, chunk_tokens=[1, True, 1, 1]),
    "zero-token chunk": req(0, chunk_tokens=[1, 0, 1, 1]),
    "unknown finish": req(0, finish="exploded"),
    "chunk times and counts differ in length": req(0, chunk_tokens=[1, 1, 1]),
    "chunks out of order": req(0, chunk_ms=[210.5, 311.0, 260.25, 360.125]),
    "chunk before it was sent": req(1, chunk_ms=[300.0, 700.0]),
    "chunks of a request never sent": req(5, chunk_ms=[5.0], chunk_tokens=[1], finish="stop"),
    "more tokens than allowed": req(0, chunk_tokens=[1, 1, 1, 2]),
    "more token ids than allowed": req(0, token_ids=[1, 2, 3, 4, 5]),
    "negative time": req(0, sent_ms=-1.0),
    "time beyond a day": req(0, chunk_ms=[210.5, 260.25, 311.0, 1e12]),
    "huge time": req(0, sent_ms=1e300),
    "infinite time": req(0, sent_ms=float("inf")),
    "NaN time": req(0, sent_ms=float("nan")),
    "400-digit time": req(0, sent_ms=10**400),
    "400-digit count": req(0, chunk_tokens=[10**400, 1, 1, 1]),
    "2**63 chunk tokens": req(0, chunk_tokens=[2**63, 1, 1, 1]),
    "2**63 prompt tokens": req(0, prompt_tokens=2**63),
    "2**63 token id": req(0, token_ids=[2**63]),
    "negative token id": req(0, token_ids=[-1]),
    "2**63 requests": cfg("requests", 2**63),
    "2**63 max new tokens": cfg("max_new_tokens", 2**63),
    "2**63 concurrency": cfg("concurrency", 2**63),
    "zero concurrency": cfg("concurrency", 0),
    "rate 0": cfg("rate", 0.0),
    "rate NaN": cfg("rate", float("nan")),
    "no prompts": cfg("prompts", []),
    "an empty prompt": cfg("prompts", ["  "]),
    "chat template as text": cfg("chat_template", "yes"),
    "request count mismatch": lambda d: d["requests"].__delitem__(-1),
    "more requests than the load had": lambda d: d["requests"].append(d["requests"][0]),
    "KV pool of 0 blocks": top("kv_blocks", 0),
    "KV block size as text": top("kv_block_size", "16"),
    "KV usage above 1": sample(1, kv_usage=1.5),
    "KV usage negative": sample(1, kv_usage=-0.1),
    "running NaN": sample(1, running=float("nan")),
    "counter as text": sample(1, generation_tokens="many"),
    "sample time missing": sample(0, t_ms=None),
    "histogram not cumulative": hist(0, counts=[0.0, 0.0, 4.0, 1.0, 5.0, 5.0]),
    "histogram bounds unsorted": hist(0, bounds=[0.01, 0.001, 0.1, 0.5, 1.0, "+Inf"]),
    "histogram lengths differ": hist(0, counts=[0.0, 0.0, 1.0]),
    "histogram bound as other text": hist(0, bounds=[0.001, 0.01, 0.1, 0.5, 1.0, "inf"]),
    "histogram bound -Inf": hist(0, bounds=["-Inf", 0.01, 0.1, 0.5, 1.0, "+Inf"]),
    "histogram count NaN": hist(0, count=float("nan")),
    "histogram is a list": sample(0, ttft=[1, 2]),
}


def raw(text: str) -> Callable[[bytes], bytes]:
    return lambda data: text.encode()


BYTES_CASES: dict[str, Callable[[bytes], bytes]] = {
    "empty file": lambda data: b"",
    "truncated": lambda data: data[: len(data) // 2],
    "not UTF-8": lambda data: data.replace(b'"text":"', b'"text":"\xfc', 1),  # ü as Latin-1
    "UTF-16": lambda data: data.decode().encode("utf-16"),
    "a byte-order mark": lambda data: b"\xef\xbb\xbf" + data,
    "a trace file": lambda data: b"PK\x03\x04" + bytes(200),
    "5,000-digit version": lambda data: data.replace(b'"version":1', b'"version":' + b"1" * 5000),
    "5,000-digit time": lambda data: data.replace(b'"sent_ms":0.0', b'"sent_ms":' + b"9" * 5000),
    "JSON container bomb (2 million objects)": lambda data: data[:-1] + b',"x":['
    + b"{}," * 2_000_000 + b"{}]}",
    "JSON nested 100,000 deep": lambda data: data[:-1] + b',"x":' + b"[" * 100_000
    + b"]" * 100_000 + b"}",
}


def edited(base: dict[str, Any], edit: Callable[[dict], object]) -> bytes:
    d = copy.deepcopy(base)
    out = edit(d)  # edits change `d` in place, or return ("replace", what to write instead)
    return json.dumps(out[1] if isinstance(out, tuple) else d).encode()


CASES: dict[str, Callable[[dict, bytes], bytes]] = {
    **{k: (lambda base, data, e=e: edited(base, e)) for k, e in EDITS.items()},
    **{k: (lambda base, data, m=m: m(data)) for k, m in BYTES_CASES.items()},
}


def test_the_edits_start_from_a_valid_file(base):
    assert load_loadtest(json.dumps(base).encode()) == make_run()


KNOWN_BUGS: dict[str, str] = {}  # engine/remote/loadfile.py faults (all fixed)


@pytest.mark.parametrize("case", [
    pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[k]))
    if k in KNOWN_BUGS else k for k in CASES])
def test_each_crafted_file_gets_one_sentence_and_no_memory_spike(case, base, run):
    data = CASES[case](base, load_to_bytes(run))
    tracemalloc.start()
    try:
        with pytest.raises(TraceFormatError) as caught:
            load_loadtest(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert message and "\n" not in message and len(message) < 300, message
    assert "Traceback" not in message
    assert peak < MEMORY_BOUND, f"{case}: peak {peak / 2**20:.0f} MB"


@pytest.mark.parametrize("case, words", [
    ("wrong format name", "not an Inference Explorer load-test file"),
    ("newer version", "newer than this app reads"),
    ("chunks out of order", "not in time order"),
    ("chunk before it was sent", "not in time order"),
    ("more tokens than allowed", "more tokens than it was allowed"),
    ("KV usage above 1", "KV usage is a fraction"),
    ("request count mismatch", "holds 5 requests, but its load had 6"),
    ("not UTF-8", "not JSON"),
    ("JSON container bomb (2 million objects)", "too many objects and lists"),
    ("2**63 chunk tokens", "out of range"),
    ("NaN time", "within a day"),
])
def test_the_sentence_says_what_is_wrong(case, words, base, run):
    with pytest.raises(TraceFormatError, match=words):
        load_loadtest(CASES[case](base, load_to_bytes(run)))


def test_brackets_inside_strings_are_not_counted_as_containers(run):
    """The container count skips JSON strings: a prompt of two million brackets is text."""
    from dataclasses import replace

    text = "[{" * 2_000_000
    big = replace(run, requests=(replace(run.requests[0], text=text), *run.requests[1:]))
    assert load_loadtest(load_to_bytes(big)).requests[0].text == text


def test_a_file_over_the_size_cap_is_refused_before_parsing(run):
    data = load_to_bytes(run)
    with pytest.raises(TraceFormatError, match="limit here is"):
        load_loadtest(data, max_bytes=len(data) - 1)
    assert load_loadtest(data, max_bytes=len(data)) == run
    with pytest.raises(TraceFormatError, match="limit here is 64 MB"):
        load_loadtest(b" " * ((64 << 20) + 1))


def test_the_shipped_sample_load_is_a_real_vllm_recording():
    """assets/examples/vllm-load.json (the Serving engine page's sample): it opens through the
    app's one reader, every request finished, and vLLM's own counters agree with what the client
    received — the server counted the tokens the client streamed."""
    from engine.files import read_record
    from ui.sections.serving_engine import SAMPLE_LOAD

    run = read_record("load-test", SAMPLE_LOAD)
    assert run.error is None and run.metrics_error is None and not run.stopped
    assert len(run.requests) == 8 and run.kv_blocks  # vLLM reported its KV-cache blocks
    assert all(r.finish in ("length", "stop") and r.output_tokens == len(r.token_ids) > 0
               for r in run.requests)
    first, last = run.samples[0], run.samples[-1]
    assert first.running == 0 and max(s.running for s in run.samples) > 1  # batched on the server
    counted = last.generation_tokens - first.generation_tokens
    assert counted == sum(r.output_tokens for r in run.requests)
    assert last.ttft is not None and last.itl is not None  # the server's own histograms
