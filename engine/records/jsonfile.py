"""Reading a JSON record file that came from a stranger (serving runs, load tests): the size is
capped before parsing, JSON containers are counted on the raw bytes before they are built (a
container bomb is refused without building it), and anything that is not UTF-8 JSON — a number
of over 4,300 digits included — is one TraceFormatError sentence."""

from __future__ import annotations

import json
from typing import Any

from ..errors import TraceFormatError
from .tracefile import _JSON_STRING


def parse_json_file(data: bytes, kind: str, max_bytes: int, max_containers: int) -> Any:
    """The parsed JSON of a `kind` file ("serving", "load-test"), or TraceFormatError."""
    if len(data) > max_bytes:
        raise TraceFormatError(f"this {kind} file is {len(data) / 2**20:,.0f} MB; the limit here "
                               f"is {max_bytes / 2**20:,.0f} MB")
    containers = _JSON_STRING.sub(b"", data).translate(None, b"]}")
    if containers.count(b"{") + containers.count(b"[") > max_containers:
        raise TraceFormatError(f"not a valid {kind} file: it holds too many objects and lists")
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or an integer of 4,300+ digits
        raise TraceFormatError(f"not an Inference Explorer {kind} file (not JSON)") from None


def check_format(d: dict[str, Any], name: str, newest: int, kind: str) -> int:
    """The file's format version, after checking its format name and that this app reads that
    version (TraceFormatError with one sentence otherwise)."""
    if d.get("format") != name:
        raise TraceFormatError(f"not an Inference Explorer {kind} file (wrong format name)")
    version = d.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TraceFormatError(f"not a valid {kind} file: invalid format version "
                               f"{str(version)[:20]!r}")
    if version > newest:
        raise TraceFormatError(f"{kind} file version {version} is newer than this app reads (up "
                               f"to {newest}); update Inference Explorer")
    return version
