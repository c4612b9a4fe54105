"""One typed reader for every file kind: what a record file must be before its fields are read.

Trace files (.npz), serving files and load-test files (JSON) come from strangers (uploads on a
hosted demo). Each kind is described once by a :class:`RecordFormat` — its name in messages, the
format name a file carries, the newest version this code reads, the size cap and the cap on JSON
objects and lists — and read by one entry, `RecordFormat.read`: the source (bytes, a path or a
stream) is size-capped before it is read, JSON containers are counted on the raw bytes before they
are built (a container bomb is refused without building it), the format name and version are
checked, then the kind's own decoder checks every field. Anything wrong is one TraceFormatError
sentence, never a traceback. engine/files.py lists every kind (`read_record`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Generic, TypeVar

from ..errors import TooLargeError, TraceFormatError

Record = TypeVar("Record")
Source = bytes | str | Path | BinaryIO  # a file's bytes, its path, or an open binary stream
JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


# How many times its size a file may grow when decoded (a trace's members decompressed): real
# traces grow 1.2–1.5× (attention weights compress poorly), while a crafted file of zeros grows
# hundreds of times and would make a few small uploads fill a server's memory. Files below
# EXPANSION_FLOOR may grow to it whatever their ratio. The hosted app passes a smaller ratio.
MAX_EXPANSION = 64.0
EXPANSION_FLOOR = 1 << 20


def mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def size_text(n: int) -> str:
    return mb(n) if n >= 1 << 20 else f"{max(n >> 10, 1):,} KB"


def container_count(raw: bytes) -> int:
    """JSON objects and lists in `raw`, counted without parsing (brackets inside strings are
    not counted)."""
    containers = JSON_STRING.sub(b"", raw).translate(None, b"]}")
    return containers.count(b"{") + containers.count(b"[")


@dataclass(frozen=True, slots=True)
class RecordFormat(Generic[Record]):
    """One file kind. `decode(data, max_bytes)` turns the file's bytes into the record, checking
    everything (the JSON kinds call `parse_json` and `check_version` first)."""

    kind: str  # how messages name it: "trace", "serving", "load-test"
    name: str  # the format name every file of this kind carries
    version: int  # the newest version this code reads; older ones are read or upgraded
    max_bytes: int  # the size cap when the caller gives none
    max_containers: int  # JSON objects and lists allowed before parsing
    decode: Callable[[bytes, int], Record]

    def read(self, source: Source, max_bytes: int | None = None,
             max_expansion: float = MAX_EXPANSION) -> Record:
        """The record in `source`, or TraceFormatError with one sentence. Decoded, it may hold
        at most `max_bytes` and at most `max_expansion` times the file's size (EXPANSION_FLOOR
        at least): both are checked on the sizes a file declares, before anything is inflated."""
        cap = self.max_bytes if max_bytes is None else max_bytes
        data = self.source_bytes(source, cap)
        grown = max(int(len(data) * max_expansion), EXPANSION_FLOOR)
        if grown >= cap:
            return self.decode(data, cap)
        try:
            return self.decode(data, grown)
        except TooLargeError as err:
            if err.size > cap:
                raise TooLargeError(f"this {self.kind} file decompresses to "
                                    f"{size_text(err.size)}; the limit here is {mb(cap)}",
                                    err.size) from None
            raise TooLargeError(f"this {self.kind} file decompresses to {size_text(err.size)}, "
                                f"{err.size / len(data):,.0f} times its {size_text(len(data))}; "
                                f"files may grow at most {max_expansion:g}× here",
                                err.size) from None

    def source_bytes(self, source: Source, max_bytes: int) -> bytes:
        """The bytes of a file, a path or a stream, refusing more than the cap allows (a zip is at
        most slightly larger than what it holds, so 1 MB of slack) before reading them."""
        limit = max_bytes + (1 << 20)
        if isinstance(source, (str, Path)):
            try:
                path = Path(source)
                if not path.exists():
                    raise TraceFormatError(f"cannot read {self.kind} file: no such file "
                                           f"{str(source)[:200]}")
                if not path.is_file():
                    raise TraceFormatError(f"not a {self.kind} file: {str(source)[:200]} is not "
                                           "a regular file")
                if path.stat().st_size > limit:
                    raise TraceFormatError(f"the file is over {mb(limit)}")
                return path.read_bytes()
            except OSError as err:
                raise TraceFormatError(f"cannot read {self.kind} file: "
                                       f"{err.strerror or err}") from err
        data = source if isinstance(source, bytes) else source.read(limit + 1)
        if len(data) > limit:
            raise TraceFormatError(f"the file is over {mb(limit)}")
        return data

    def check_containers(self, raw: bytes, what: str = "it") -> None:
        """Refuse JSON with more objects and lists than this kind can have, before parsing it:
        megabytes of `{},` would parse into millions of dicts only to be refused afterwards."""
        if container_count(raw) > self.max_containers:
            raise TraceFormatError(f"not a valid {self.kind} file: {what} holds too many objects "
                                   "and lists")

    def parse_json(self, data: bytes, max_bytes: int) -> Any:
        """The parsed JSON of a file of this kind, size and containers checked first."""
        if len(data) > max_bytes:
            raise TraceFormatError(f"this {self.kind} file is {len(data) / 2**20:,.0f} MB; the "
                                   f"limit here is {max_bytes / 2**20:,.0f} MB")
        self.check_containers(data)
        try:
            return json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, or a 4,300+ digit int
            raise TraceFormatError(f"not an Inference Explorer {self.kind} file (not JSON)") from err

    def check_version(self, d: Any) -> int:
        """The file's format version, after checking its format name and that this code reads
        that version."""
        if not isinstance(d, dict) or d.get("format") != self.name:
            raise TraceFormatError(f"not an Inference Explorer {self.kind} file (wrong format name)")
        version = d.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise TraceFormatError(f"not a valid {self.kind} file: invalid format version "
                                   f"{str(version)[:20]!r}")
        if version > self.version:
            raise TraceFormatError(f"{self.kind} file version {version} is newer than this app "
                                   f"reads (up to {self.version}); update Inference Explorer")
        return version


def json_format(kind: str, name: str, version: int, max_bytes: int, max_containers: int,
                from_dict: Callable[[Any], Record]) -> RecordFormat[Record]:
    """A JSON file kind: parsed (size and containers capped), then `from_dict`, which checks the
    format name and version (`check_version`) and every field."""

    def decode(data: bytes, cap: int) -> Record:
        return from_dict(fmt.parse_json(data, cap))

    fmt = RecordFormat(kind, name, version, max_bytes, max_containers, decode)
    return fmt
