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
