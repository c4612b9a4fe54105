"""The trace file: one zip (numpy .npz) of JSON metadata plus plain numeric arrays.

No pickle anywhere: metadata is JSON, arrays are plain numbers. The metadata carries a format name
and version; older versions are upgraded on load, newer ones are refused with a clear message. A
file may also carry the experiment results computed on its trace (a "lecture pack"): this module
writes and reads that "experiments" section as plain JSON without knowing its contents, so the
record format depends on none of the subsystems whose results it carries; engine/experiments.py
converts it and engine/files.py reads whole files (`read_trace_file`, `load_trace`). See
docs/trace-format.md.

Files come from strangers (uploads on a hosted demo), so the reader never trusts a size it has not
checked: each zip member must be one this format names, an `.npy` array of that member's dtype,
whose header (shape × item size) matches the member's stated size; the file's total decompressed
size is capped (`max_bytes`) before anything is read, and no array is allocated before its header
passed. Then `tracecheck.check_trace` checks every invariant of the trace itself.
"""

from __future__ import annotations

import io
import json
import math
import re
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Protocol

import numpy as np

from ..errors import TooLargeError, TraceFormatError
from ..settings import MAX_NEW_TOKENS_LIMIT, GenerationSettings
from ..spec import ModelSpec
from .fileformat import RecordFormat, mb
from .trace import BranchOf, DecoderUsed, MachineLoad, Speculation, Step, Trace
from .tracecheck import check_trace

FORMAT_NAME = "inference-explorer-trace"
FORMAT_VERSION = 8
META_KEY = "meta.json"
MAX_TRACE_BYTES = 1 << 30  # decompressed; the app passes a smaller cap (hosted: smaller still)
MAX_META_BYTES = 8 << 20
MAX_MEMBERS = 4 * (MAX_NEW_TOKENS_LIMIT + 1) + 1
MAX_JSON_CONTAINERS = 1 << 16  # objects and lists in the metadata; a real trace has ~3 per step
_MEMBER = re.compile(r"step(0|[1-9][0-9]{0,4})\.(top_ids|top_probs|attention|hidden)\.npy")


def _add_experiments(meta: dict[str, Any]) -> dict[str, Any]:
    return {**meta, "version": 2, "experiments": None}


def _add_machine(meta: dict[str, Any]) -> dict[str, Any]:
    """Version 3 records the forward time, CPU time and the machine's load; older files did not
    measure them, so they stay unknown (None), never guessed."""
    return {**meta, "version": 3, "machine": None}


def _add_decoder(meta: dict[str, Any]) -> dict[str, Any]:
    """Version 4 records which decoder ran the decode steps and the weights it read; older files
    ran torch on the loaded weights but did not say so, so it stays unknown (None)."""
    return {**meta, "version": 4, "decoder": None}


def _add_speculation(meta: dict[str, Any]) -> dict[str, Any]:
    """Version 5 records speculative decoding's verify steps; older files come from plain runs,
    one forward per token, so there is none (None) — a fact, not an unknown."""
    return {**meta, "version": 5, "speculation": None}


def _residual_stream(meta: dict[str, Any]) -> dict[str, Any]:
    """Version 6 records the hidden states' last row as the last layer's output, the residual
    stream; older files recorded it after the final norm. Their hidden states are left out on
    load (`OLD_HIDDEN`): a lens or residual-stream chart read from them would mix the two."""
    return {**meta, "version": 6}


def _add_branch(meta: dict[str, Any]) -> dict[str, Any]:
    """Version 7 records a branch's origin (the What if page); older files are runs from a
    prompt, none of them a branch (None) — a fact, not an unknown."""
    return {**meta, "version": 7, "branch": None}


def _add_batch(meta: dict[str, Any]) -> dict[str, Any]:
    """Version 8 records how many runs shared each step's forward (batched steps); older files
    ran every step alone (1) — a fact, not an unknown."""
    steps = meta.get("steps")
    if isinstance(steps, list):
        steps = [{**step, "batch": 1} if isinstance(step, dict) else step for step in steps]
    return {**meta, "version": 8, "steps": steps}


# version n → function turning version-n metadata into version n+1.
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _add_experiments,
                                                                   2: _add_machine,
                                                                   3: _add_decoder,
                                                                   4: _add_speculation,
                                                                   5: _residual_stream,
                                                                   6: _add_branch,
                                                                   7: _add_batch}
OLD_HIDDEN = 6  # files older than this hold hidden states whose last row is final-normed


class ExperimentsSection(Protocol):
    """What the file needs of the experiment results it carries (engine/experiments.py's
    Experiments): whether there are any, and their plain-JSON form."""

    @property
    def empty(self) -> bool: ...

    def to_dict(self) -> dict[str, Any]: ...


_ARRAY_FIELDS = {  # name → allowed dtype
    "top_ids": np.int64, "top_probs": np.float32, "attention": np.float16, "hidden": np.float32,
}
_SCALAR_STEP_FIELDS = ("index", "phase", "token_id", "piece", "text", "position", "context_len",
                       "latency_ms", "kv_bytes", "kv_bytes_per_layer", "chosen_prob", "chosen_rank")
_TIMING_STEP_FIELDS = ("forward_ms", "cpu_ms", "others_share")  # version 3; None when unknown
_BATCH_STEP_FIELDS = ("batch",)  # version 8


def trace_to_bytes(trace: Trace, experiments: ExperimentsSection | None = None) -> bytes:
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
        "machine": trace.machine.to_dict() if trace.machine is not None else None,
        "decoder": trace.decoder.to_dict() if trace.decoder is not None else None,
        "speculation": trace.speculation.to_dict() if trace.speculation is not None else None,
        "branch": trace.branch.to_dict() if trace.branch is not None else None,
        "experiments": None if experiments is None or experiments.empty
        else experiments.to_dict(),
        "steps": [],
    }
    arrays: dict[str, np.ndarray] = {}
    for step in trace.steps:
        record = {name: getattr(step, name)
                  for name in _SCALAR_STEP_FIELDS + _TIMING_STEP_FIELDS + _BATCH_STEP_FIELDS}
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


def save_trace(trace: Trace, path: str | Path,
               experiments: ExperimentsSection | None = None) -> None:
    Path(path).write_bytes(trace_to_bytes(trace, experiments))


def decode_trace(data: bytes, max_bytes: int) -> tuple[Trace, dict[str, Any] | None]:
    """The trace in a file's bytes and its experiments section as written (plain JSON, or None);
    refuses (TraceFormatError, one line) anything whose members decompress to more than
    `max_bytes` together, before reading them. The section is bounded by the metadata's caps
    (MAX_META_BYTES, MAX_JSON_CONTAINERS); engine/experiments.py checks what it holds."""
    try:
        meta_bytes, arrays = _read_members(data, max_bytes)
        TRACE_FORMAT.check_containers(meta_bytes, "the metadata")
        written = json.loads(meta_bytes.decode())
        if TRACE_FORMAT.check_version(written) < OLD_HIDDEN:  # see _residual_stream
            arrays = {name: a for name, a in arrays.items() if not name.endswith(".hidden")}
        meta = _check_and_upgrade(written)
        trace = check_trace(_build(meta, arrays))
        return trace, meta.get("experiments")
    except TraceFormatError:
        raise
    except Exception as err:  # noqa: BLE001 — everything in here parses untrusted bytes: zlib,
        # lzma, zip encryption flags, numpy's header tokenizer, JSON, int overflow… all say "damaged"
        raise TraceFormatError(f"not a valid trace file (damaged, truncated or foreign): "
                               f"{type(err).__name__}") from err


# The trace file kind as the record formats describe it; its decoder gives the trace and the
# experiments section as written (engine/files.py's reader converts the section).
TRACE_FORMAT = RecordFormat("trace", FORMAT_NAME, FORMAT_VERSION, MAX_TRACE_BYTES,
                            MAX_JSON_CONTAINERS, decode_trace)


def _read_members(data: bytes, max_bytes: int) -> tuple[bytes, dict[str, np.ndarray]]:
    """(metadata JSON bytes, arrays by member name without ".npy"), every size checked first."""
    if data.count(b"PK\x01\x02") > MAX_MEMBERS:  # central-directory entries, before parsing them
        raise TraceFormatError(f"not a trace file: more than {MAX_MEMBERS:,} members")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
        names = [info.filename for info in infos]
        if len(set(names)) != len(names):
            raise TraceFormatError("not a valid trace file: a member name appears twice")
        total = sum(info.file_size for info in infos)
        if total > max_bytes:
            raise TooLargeError(f"this trace decompresses to {mb(total)}; the limit here is "
                                f"{mb(max_bytes)}", total)
        if META_KEY + ".npy" not in names:
            raise TraceFormatError("not an Inference Explorer trace (no metadata)")
        meta, arrays = b"", {}
        for info in infos:
            name = info.filename.removesuffix(".npy")
            if info.filename == META_KEY + ".npy":
                if info.file_size > MAX_META_BYTES:
                    raise TraceFormatError(f"the trace metadata is over {mb(MAX_META_BYTES)}")
                with archive.open(info) as member:
                    meta = _read_npy(member, info.file_size, np.uint8, name).tobytes()
                continue
            match = _MEMBER.fullmatch(info.filename)
            if match is None:
                raise TraceFormatError(f"not a valid trace file: unexpected member "
                                       f"{info.filename[:80]!r}")
            with archive.open(info) as member:
                arrays[name] = _read_npy(member, info.file_size, _ARRAY_FIELDS[match[2]], name)
    return meta, arrays


def _read_npy(member: BinaryIO, size: int, dtype: type, name: str) -> np.ndarray:
    """One `.npy` member of `size` bytes, checked against its header before any allocation."""
    version = np.lib.format.read_magic(member)  # ValueError if not .npy
    if version == (1, 0):
        shape, fortran, found = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, fortran, found = np.lib.format.read_array_header_2_0(member)
    else:
        raise TraceFormatError(f"{name}: unsupported .npy version {version}")
    if found != np.dtype(dtype) or found.hasobject or fortran:
        raise TraceFormatError(f"{name} has dtype {found}, expected {np.dtype(dtype)}")
    nbytes = math.prod(shape) * found.itemsize
    header = member.tell() if member.seekable() else None
    if nbytes > size or (header is not None and header + nbytes != size):
        raise TraceFormatError(f"{name}: its header claims {nbytes:,} bytes, the member holds "
                               f"{size:,}")
    buffer = bytearray(nbytes)
    view, done = memoryview(buffer), 0
    while done < nbytes:
        got = member.readinto(view[done:done + (1 << 20)])
        if not got:
            raise TraceFormatError(f"{name} is truncated")
        done += got
    return np.frombuffer(buffer, dtype=found).reshape(shape)


def _check_and_upgrade(meta: Any) -> dict[str, Any]:
    version = TRACE_FORMAT.check_version(meta)
    while version < FORMAT_VERSION:
        meta = UPGRADES[version](meta)
        version += 1
    return meta


def _array(arrays: dict[str, np.ndarray], index: int, name: str) -> np.ndarray | None:
    return arrays.get(f"step{index}.{name}")


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TraceFormatError(f"not a valid trace: the {what} must be text")
    return value


def _build(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Trace:
    steps = []
    records = meta["steps"]
    if not isinstance(records, list) or len(records) > MAX_NEW_TOKENS_LIMIT:
        raise TraceFormatError(f"a trace has a list of at most {MAX_NEW_TOKENS_LIMIT} steps")
    for i, record in enumerate(records):
        fields = {name: record[name] for name in _SCALAR_STEP_FIELDS}
        fields.update({name: record.get(name) for name in _TIMING_STEP_FIELDS})
        fields.update({name: record[name] for name in _BATCH_STEP_FIELDS})
        fields["kv_bytes_per_layer"] = tuple(record["kv_bytes_per_layer"])
        fields["top_pieces"] = tuple(str(v) for v in record["top_pieces"])
        fields.update({name: _array(arrays, i, name) for name in _ARRAY_FIELDS})
        if fields["top_ids"] is None or fields["top_probs"] is None:
            raise TraceFormatError(f"step {i} is missing its top-k arrays")
        steps.append(Step(**fields))
    if len(arrays) != sum(_array(arrays, i, f) is not None for i in range(len(steps))
                          for f in _ARRAY_FIELDS):
        raise TraceFormatError("not a valid trace file: arrays for steps that are not in it")
    return Trace(
        model=ModelSpec.from_dict(meta["model"]),
        settings=GenerationSettings.from_dict(meta["settings"]),
        prompt=_text(meta["prompt"], "prompt"),
        prompt_token_ids=tuple(meta["prompt_token_ids"]),
        prompt_pieces=tuple(str(v) for v in meta["prompt_pieces"]),
        prompt_special=tuple(bool(v) for v in meta["prompt_special"]),
        steps=tuple(steps),
        stop_reason=meta["stop_reason"],
        tokenize_ms=meta["tokenize_ms"],
        device=str(meta["device"]),
        attention_layers=tuple(meta["attention_layers"]),
        created_at=str(meta["created_at"]),
        engine_version=str(meta["engine_version"]),
        machine=_machine(meta["machine"]),
        decoder=_decoder(meta["decoder"]),
        speculation=_speculation(meta["speculation"]),
        branch=_branch(meta["branch"]),
    )


def _machine(value: Any) -> MachineLoad | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != set(MachineLoad.__slots__):
        raise TraceFormatError("not a valid trace: the machine record has other fields")
    return MachineLoad(**value)


def _decoder(value: Any) -> DecoderUsed | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != set(DecoderUsed.__slots__):
        raise TraceFormatError("not a valid trace: the decoder record has other fields")
    return DecoderUsed(**value)


_SPECULATION_LISTS = ("step_proposed", "step_accepted", "step_tokens", "step_ms")


def _speculation(value: Any) -> Speculation | None:
    """The speculation record as written; its numbers are checked by tracecheck."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != set(Speculation.__slots__):
        raise TraceFormatError("not a valid trace: the speculation record has other fields")
    if any(not isinstance(value[name], list) or len(value[name]) > MAX_NEW_TOKENS_LIMIT
           for name in _SPECULATION_LISTS):
        raise TraceFormatError(f"not a valid trace: the speculation record's per-step entries "
                               f"must be lists of at most {MAX_NEW_TOKENS_LIMIT} values")
    return Speculation(**{name: tuple(value[name]) if name in _SPECULATION_LISTS else value[name]
                          for name in Speculation.__slots__})


def _branch(value: Any) -> BranchOf | None:
    """The branch record as written; its numbers are checked by tracecheck."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != set(BranchOf.__slots__):
        raise TraceFormatError("not a valid trace: the branch record has other fields")
    parent = value["parent_tokens"]
    if not isinstance(parent, list) or len(parent) > MAX_NEW_TOKENS_LIMIT:
        raise TraceFormatError(f"not a valid trace: the branch's parent tokens must be a list of "
                               f"at most {MAX_NEW_TOKENS_LIMIT} ids")
    return BranchOf(**{**value, "parent_tokens": tuple(parent)})
