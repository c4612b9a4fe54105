"""The trace file: one zip (numpy .npz) of JSON metadata plus plain numeric arrays.

No pickle anywhere: arrays are written and read with `allow_pickle=False`, metadata is JSON. The
metadata carries a format name and version; older versions are upgraded on load, newer ones are
refused with a clear message. See docs/trace-format.md.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from .errors import TraceFormatError
from .settings import GenerationSettings
from .spec import ModelSpec
from .trace import Step, Trace

FORMAT_NAME = "inference-explorer-trace"
FORMAT_VERSION = 1
META_KEY = "meta.json"

# version n → function turning version-n metadata into version n+1 (none needed yet).
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}

_ARRAY_FIELDS = {  # name → allowed dtype
    "top_ids": np.int64, "top_probs": np.float32, "attention": np.float16, "hidden": np.float32,
}
_SCALAR_STEP_FIELDS = ("index", "phase", "token_id", "piece", "text", "position", "context_len",
                       "latency_ms", "kv_bytes", "kv_bytes_per_layer", "chosen_prob", "chosen_rank")


def trace_to_bytes(trace: Trace) -> bytes:
    meta = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "model": trace.model.to_dict(),
        "settings": trace.settings.to_dict(),
        "prompt": trace.prompt,
        "prompt_token_ids": list(trace.prompt_token_ids),
        "prompt_pieces": list(trace.prompt_pieces),
        "prompt_special": list(trace.prompt_special),
        "stop_reason": trace.stop_reason,
        "tokenize_ms": trace.tokenize_ms,
        "device": trace.device,
        "attention_layers": list(trace.attention_layers),
        "created_at": trace.created_at,
        "engine_version": trace.engine_version,
        "steps": [],
    }
    arrays: dict[str, np.ndarray] = {}
    for step in trace.steps:
        record = {name: getattr(step, name) for name in _SCALAR_STEP_FIELDS}
        record["kv_bytes_per_layer"] = list(step.kv_bytes_per_layer)
        record["top_pieces"] = list(step.top_pieces)
        meta["steps"].append(record)
        for name in _ARRAY_FIELDS:
            value = getattr(step, name)
            if value is not None:
                arrays[f"step{step.index}.{name}"] = value
    arrays[META_KEY] = np.frombuffer(json.dumps(meta, ensure_ascii=False).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def save_trace(trace: Trace, path: str | Path) -> None:
    Path(path).write_bytes(trace_to_bytes(trace))


def load_trace(source: str | Path | bytes | BinaryIO) -> Trace:
    """Read a trace file; any damage or foreign content raises TraceFormatError."""
    if isinstance(source, (str, Path)):
        try:
            source = Path(source).read_bytes()
        except OSError as err:
            raise TraceFormatError(f"cannot read trace file: {err.strerror or err}") from None
    data = source if isinstance(source, bytes) else source.read()
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            if META_KEY not in npz.files:
                raise TraceFormatError("not an Inference Explorer trace (no metadata)")
            meta = json.loads(npz[META_KEY].tobytes().decode())
            meta = _check_and_upgrade(meta)
            arrays = {name: npz[name] for name in npz.files if name != META_KEY}
            return _build(meta, arrays)
    except TraceFormatError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, TypeError,
            UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TraceFormatError(f"not a valid trace file (damaged, truncated or foreign): "
                               f"{type(err).__name__}") from None


def _check_and_upgrade(meta: Any) -> dict[str, Any]:
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise TraceFormatError("not an Inference Explorer trace (wrong format name)")
    version = meta.get("version")
    if not isinstance(version, int) or version < 1:
        raise TraceFormatError(f"trace has an invalid format version: {version!r}")
    if version > FORMAT_VERSION:
        raise TraceFormatError(f"trace format version {version} is newer than this app reads "
                               f"(up to {FORMAT_VERSION}); update Inference Explorer")
    while version < FORMAT_VERSION:
        meta = UPGRADES[version](meta)
        version += 1
    return meta


def _array(arrays: dict[str, np.ndarray], index: int, name: str) -> np.ndarray | None:
    value = arrays.get(f"step{index}.{name}")
    if value is not None and value.dtype != _ARRAY_FIELDS[name]:
        raise TraceFormatError(f"step {index} {name} has dtype {value.dtype}, "
                               f"expected {np.dtype(_ARRAY_FIELDS[name])}")
    return value


def _build(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Trace:
    steps = []
    for record in meta["steps"]:
        index = int(record["index"])
        fields = {name: record[name] for name in _SCALAR_STEP_FIELDS}
        fields["kv_bytes_per_layer"] = tuple(int(v) for v in record["kv_bytes_per_layer"])
        fields["top_pieces"] = tuple(str(v) for v in record["top_pieces"])
        fields.update({name: _array(arrays, index, name) for name in _ARRAY_FIELDS})
        if fields["top_ids"] is None or fields["top_probs"] is None:
            raise TraceFormatError(f"step {index} is missing its top-k arrays")
        steps.append(Step(**fields))
    return Trace(
        model=ModelSpec.from_dict(meta["model"]),
        settings=GenerationSettings.from_dict(meta["settings"]),
        prompt=str(meta["prompt"]),
        prompt_token_ids=tuple(int(v) for v in meta["prompt_token_ids"]),
        prompt_pieces=tuple(str(v) for v in meta["prompt_pieces"]),
        prompt_special=tuple(bool(v) for v in meta["prompt_special"]),
        steps=tuple(steps),
        stop_reason=meta["stop_reason"],
        tokenize_ms=float(meta["tokenize_ms"]),
        device=str(meta["device"]),
        attention_layers=tuple(int(v) for v in meta["attention_layers"]),
        created_at=str(meta["created_at"]),
        engine_version=str(meta["engine_version"]),
    )
