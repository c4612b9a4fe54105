"""engine/files.py: one reader for every file kind (trace, serving, load-test), from bytes, a path
or a stream, with the same checks and one-line errors whatever the kind (no model needed)."""

from __future__ import annotations

import io
import json

import pytest

from engine.errors import TraceFormatError
from engine.files import FORMATS, TraceFile, load_trace, read_record, read_trace_file
from engine.records.examples import EXAMPLES_DIR
from engine.remote.loadfile import load_to_bytes
from engine.serving.record import (
    BlockTableRow,
    RequestRecord,
    RequestSpec,
    ServingConfig,
    ServingRun,
    StepRecord,
)
from engine.serving.servingfile import serving_to_bytes
from tests.test_remote_loadfile import make_run as make_load_run

QA = EXAMPLES_DIR / "qa.npz"


def serving_run() -> ServingRun:
    request = RequestRecord(0, RequestSpec("hi", (1, 2, 3), 4, 0.0), 0.1, (5, 6), (10.0, 20.0),
                            (0, 1), "ab", 0, 0, "length")
    steps = (StepRecord(0, 0.1, 9.9, "prefill", (0,), (3,), (BlockTableRow(0, (2,), 3),), 3, 0, 0,
                        0),
             StepRecord(1, 10.0, 10.0, "decode", (0,), (1,), (BlockTableRow(0, (2,), 4),), 3, 0, 0,
                        0))
    return ServingRun("m", "fp32", ServingConfig(block_size=4, num_blocks=4), (request,), steps, 2,
                      "now")


def files() -> dict[str, bytes]:
    return {"trace": QA.read_bytes(), "serving": serving_to_bytes(serving_run()),
            "load-test": load_to_bytes(make_load_run())}


def test_every_kind_reads_from_bytes_a_path_and_a_stream(tmp_path):
    for kind, data in files().items():
        path = tmp_path / f"record.{kind}"
        path.write_bytes(data)
        got = [read_record(kind, source) for source in (data, path, str(path), io.BytesIO(data))]
        if kind == "trace":
            assert all(isinstance(g, TraceFile) for g in got)
            assert {g.trace.prompt for g in got} == {load_trace(QA).prompt}
        else:
            assert all(g == got[0] for g in got)
    assert read_record("serving", files()["serving"]) == serving_run()
    assert read_record("load-test", files()["load-test"]) == make_load_run()
    assert read_trace_file(QA).experiments.empty


@pytest.mark.parametrize("kind", list(FORMATS))
def test_each_kind_refuses_the_same_way(kind, tmp_path):
    """Another kind's file, a missing file, a folder, an oversized file: one line each."""
    others = [data for other, data in files().items() if other != kind]
    cases = {"another kind's file": others[0], "no such file": tmp_path / "missing",
             "a folder": tmp_path, "over the cap": files()[kind]}
    for case, source in cases.items():
        cap = 64 if case == "over the cap" else None
        with pytest.raises(TraceFormatError) as caught:
            read_record(kind, source, cap)
        message = str(caught.value)
        assert message and "\n" not in message and len(message) < 300, (case, message)
    with pytest.raises(TraceFormatError, match="no such file"):
        read_record(kind, tmp_path / "missing")
    with pytest.raises(TraceFormatError, match="not a regular file"):
        read_record(kind, tmp_path)


@pytest.mark.parametrize("kind", ["serving", "load-test"])
def test_json_kinds_share_the_name_and_version_checks(kind):
    d = json.loads(files()[kind])
    newer = json.dumps({**d, "version": FORMATS[kind].version + 1}).encode()
    with pytest.raises(TraceFormatError, match=f"{kind} file version .* is newer than this app"):
        read_record(kind, newer)
    foreign = json.dumps({**d, "format": "something-else"}).encode()
    with pytest.raises(TraceFormatError, match=f"not an Inference Explorer {kind} file"):
        read_record(kind, foreign)
    with pytest.raises(TraceFormatError, match="too many objects and lists"):
        read_record(kind, b"[" + b"{}," * (FORMATS[kind].max_containers + 1) + b"{}]")


def test_an_unknown_kind_is_one_line():
    with pytest.raises(TraceFormatError, match="unknown file kind 'pickle'"):
        read_record("pickle", b"")  # type: ignore[call-overload]
