"""Every record file kind, read one way: trace files (.npz), serving files and load-test files
(JSON), for the CLI and the app alike.

Each kind is one RecordFormat (engine/records/fileformat.py): its format name and newest version,
its size cap and the cap on JSON containers, and its decoder. `read_record(kind, source)` reads
any of them — bytes, a path or an open stream — and refuses anything damaged, foreign, newer or
oversized with one TraceFormatError sentence. A trace file's experiment results come back as
an `Experiments` (engine/experiments.py), checked like the trace itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, overload

from .errors import TraceFormatError
from .experiments import Experiments, experiments_from_dict
from .records.fileformat import MAX_EXPANSION, RecordFormat, Source
from .records.trace import Trace
from .records.tracefile import MAX_TRACE_BYTES, TRACE_FORMAT, decode_trace
from .remote.loadfile import LOADTEST_FORMAT
from .remote.record import LoadRun
from .serving.record import ServingRun
from .serving.servingfile import SERVING_FORMAT

Kind = Literal["trace", "serving", "load-test"]


@dataclass(frozen=True, slots=True, eq=False)
class TraceFile:
    """What a trace file holds: the trace, and the experiment results saved with it (maybe
    none)."""

    trace: Trace
    experiments: Experiments


def _decode_trace_file(data: bytes, max_bytes: int) -> TraceFile:
    trace, section = decode_trace(data, max_bytes)
    try:
        return TraceFile(trace, experiments_from_dict(section))
    except TraceFormatError:
        raise
    except Exception as err:  # noqa: BLE001 — the section is untrusted JSON: any surprise is damage
        raise TraceFormatError(f"not a valid trace file (damaged experiment results): "
                               f"{type(err).__name__}") from err


TRACE_FILE: RecordFormat[TraceFile] = replace(TRACE_FORMAT, decode=_decode_trace_file)
FORMATS: dict[str, RecordFormat[Any]] = {"trace": TRACE_FILE, "serving": SERVING_FORMAT,
                                         "load-test": LOADTEST_FORMAT}


@overload
def read_record(kind: Literal["trace"], source: Source, max_bytes: int | None = None,
                max_expansion: float = MAX_EXPANSION) -> TraceFile: ...
@overload
def read_record(kind: Literal["serving"], source: Source, max_bytes: int | None = None,
                max_expansion: float = MAX_EXPANSION) -> ServingRun: ...
@overload
def read_record(kind: Literal["load-test"], source: Source, max_bytes: int | None = None,
                max_expansion: float = MAX_EXPANSION) -> LoadRun: ...
def read_record(kind: Kind, source: Source, max_bytes: int | None = None,
                max_expansion: float = MAX_EXPANSION) -> Any:
    """The record in a file of this kind (its own size cap unless `max_bytes`; decoded, at most
    `max_expansion` times the file's size), or TraceFormatError with one sentence."""
    if kind not in FORMATS:
        raise TraceFormatError(f"unknown file kind {kind!r}: one of {', '.join(FORMATS)}")
    return FORMATS[kind].read(source, max_bytes, max_expansion)


def read_trace_file(source: Source, max_bytes: int = MAX_TRACE_BYTES,
                    max_expansion: float = MAX_EXPANSION) -> TraceFile:
    """The trace and its experiment results; see `read_record`."""
    return TRACE_FILE.read(source, max_bytes, max_expansion)


def load_trace(source: Source, max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """The trace alone (its experiment results are checked all the same)."""
    return read_trace_file(source, max_bytes).trace
