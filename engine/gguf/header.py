"""Read a GGUF file's header — metadata and tensor table — checking every count and size against
the bytes the file really has before anything is allocated.

Why our own parser: gguf-py's `GGUFReader` memory-maps the file and believes what it reads. A
string length or array count of 2^40 becomes a loop of 2^40 steps or a view it then copies, and a
tensor that claims 10^12 elements a memmap the reader indexes later. Here each length is compared
with what is left of the file first (a string of n bytes needs n bytes; an array of n values at
least n · their smallest size), so a damaged or hostile file costs at most about its own size in
memory and is refused with one line (`GGUFError`). It is also faster: GGUFReader turns each of the
default model's 98,052 vocabulary strings into numpy views (2.3 s); this reads them once (~0.1 s).

The layout (GGUF v2 and v3, little-endian): magic "GGUF", version u32, tensor count u64, metadata
count u64; each metadata entry a string key, a u32 value type and the value (arrays: element type
u32, count u64, elements); each tensor its name, dimension count u32, dims u64 (ne[0] first, the
row length), GGML type u32 and offset u64 into the data section, which starts at the next multiple
of `general.alignment` (32 unless stated).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import ModelLoadError
from .table import GGUFTable, GGUFTensor

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # v1 counted in 32 bits; no llama-family file in use still has it
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_KEY_BYTES = 1 << 16
# Caps on what a header may list, so that a file of many tiny entries (each a Python object of
# ~60-200 bytes here) stays within a few hundred MB whatever its size; real files are far below:
MAX_ARRAY = 1 << 22  # elements in one metadata array (a 256k vocabulary has 2^18)
MAX_STRINGS = 1 << 22  # strings in all (vocabulary + merges of a 256k model: ~2^19)
MAX_KV = 1 << 16  # metadata entries (llama.cpp writes ~40)
MAX_TENSORS = 1 << 17  # a 70B llama has 723; a 256-expert MoE some 10^4
MAX_ELEMENTS = 1 << 48  # one tensor; its bytes are checked against the file anyway

# value type → (struct format, bytes); 8 (string) and 9 (array) have no fixed size
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
            6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
          10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


class GGUFError(ModelLoadError):
    """A file that is not a GGUF this engine can read, said in one line."""


@dataclass(frozen=True, slots=True, eq=False)
class Header:
    """What the file says, checked: its metadata and tensor table."""

    metadata: dict[str, Any]  # key → int / float / bool / str, a tuple of str, or a numpy array
    table: GGUFTable
    data_start: int  # absolute offset of the data section

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)


class _Cursor:
    """Reads a file front to back, refusing any read past its end before making it."""

    def __init__(self, f: BinaryIO, size: int, path: Path) -> None:
        self.f, self.size, self.pos, self.path = f, size, 0, path
        self.strings = 0

    def left(self) -> int:
        return self.size - self.pos

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path.name} is not a usable GGUF file: {what}")

    def take(self, n: int, what: str) -> bytes:
        if n > self.left():
            raise self.fail(f"{what} needs {n:,} bytes at offset {self.pos:,} but the file has "
                            f"{self.left():,} left (truncated or damaged)")
        data = self.f.read(n)
        self.pos += n
        return data

    def scalar(self, kind: int, what: str) -> Any:
        fmt, n = _SCALARS[kind]
        return struct.unpack(fmt, self.take(n, what))[0]

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.u64(f"the length of {what}")
        if limit is not None and n > limit:
            raise self.fail(f"{what} claims {n:,} bytes (at most {limit:,})")
        self.strings += 1
        if self.strings > MAX_STRINGS:
            raise self.fail(f"more than {MAX_STRINGS:,} strings in the metadata")
        return self.take(n, what).decode("utf-8", errors="replace")

    def value(self, kind: int, what: str) -> Any:
        if kind in _SCALARS:
            return self.scalar(kind, what)
        if kind == _STRING:
            return self.string(what)
        if kind != _ARRAY:
            raise self.fail(f"{what} has unknown value type {kind}")
        elem = self.u32(f"the element type of {what}")
        count = self.u64(f"the length of {what}")
        smallest = _SCALARS[elem][1] if elem in _SCALARS else 8 if elem == _STRING else None
        if smallest is None:
            raise self.fail(f"{what} is an array of type {elem} (nested or unknown)")
        if count > MAX_ARRAY or count * smallest > self.left():
            raise self.fail(f"{what} claims {count:,} elements, more than the file's "
                            f"{self.left():,} remaining bytes can hold")
        if elem == _STRING:
            return tuple(self.string(f"element {i} of {what}") for i in range(count))
        raw = self.take(count * smallest, what)
        values = np.frombuffer(raw, dtype=_NUMPY[elem])
        return values.astype(bool) if elem == 7 else values


def read_header(path: str | os.PathLike) -> Header:
    """The checked header of the GGUF at `path`; GGUFError (one line) for anything wrong."""
    path = Path(path)
    try:
        size = path.stat().st_size
        f = open(path, "rb")
    except OSError as err:
        raise GGUFError(f"cannot read {path}: {err.strerror or err}") from err
    with f:
        return _parse(_Cursor(f, size, path))


def _parse(c: _Cursor) -> Header:
    if c.left() < 4 or c.take(4, "the magic") != MAGIC:
        raise c.fail("it does not start with the GGUF magic bytes")
    version = c.u32("the version")
    if version not in VERSIONS:
        raise c.fail(f"GGUF version {version} (this reader knows {VERSIONS[0]} and {VERSIONS[1]})")
    n_tensors = c.u64("the tensor count")
    n_kv = c.u64("the metadata count")
    if n_kv > MAX_KV or n_kv * 13 > c.left():  # a key length (8), a type (4), one byte
        raise c.fail(f"{n_kv:,} metadata entries cannot fit in {c.left():,} bytes")
    if n_tensors > MAX_TENSORS or n_tensors * 32 > c.left():  # name len, dims, type, offset
        raise c.fail(f"{n_tensors:,} tensors cannot fit in {c.left():,} bytes")
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = c.string(f"metadata key {i}", MAX_KEY_BYTES)
        metadata[key] = c.value(c.u32(f"the type of {key!r}"), repr(key))
    entries = [_tensor_info(c, i) for i in range(n_tensors)]
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise c.fail(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-c.pos // alignment) * alignment
    tensors = tuple(_placed(c, e, data_start, alignment) for e in entries)
    _apart(c, tensors)
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise c.fail("two tensors share a name")
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise c.fail("general.architecture is missing")
    name = metadata.get("general.name")
    table = GGUFTable(str(c.path), c.size, version, arch, name if isinstance(name, str) else None,
                      tensors)
    return Header(metadata, table, data_start)


def _apart(c: _Cursor, tensors: tuple[GGUFTensor, ...]) -> None:
    """Every tensor's bytes its own: a file whose tensors share bytes (all at offset 0, say)
    would have a loader hold, pack or dequantize far more than the file holds (a 9.4 MB file
    ran with 3.3 GB); no writer makes one."""
    ordered = sorted(tensors, key=lambda t: t.offset)
    for before, after in zip(ordered, ordered[1:]):
        if after.offset < before.offset + before.nbytes:
            raise c.fail(f"tensor {after.name} starts inside tensor {before.name} (bytes "
                         f"{before.offset:,} to {before.offset + before.nbytes:,}): each "
                         "tensor's bytes must be its own")


def _tensor_info(c: _Cursor, i: int) -> tuple[str, tuple[int, ...], int, int]:
    import gguf

    name = c.string(f"the name of tensor {i}", 1024)
    n_dims = c.u32(f"the dimension count of {name}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise c.fail(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS})")
    ne = tuple(c.u64(f"a dimension of {name}") for _ in range(n_dims))
    kind = c.u32(f"the type of {name}")
    offset = c.u64(f"the offset of {name}")
    if kind not in {t.value for t in gguf.GGMLQuantizationType}:
        raise c.fail(f"tensor {name} has unknown GGML type {kind}")
    n = 1
    for d in ne:
        if d == 0:
            raise c.fail(f"tensor {name} has a dimension of 0")
        n *= d
        if n > MAX_ELEMENTS:
            raise c.fail(f"tensor {name} claims more than {MAX_ELEMENTS:,} elements")
    return name, ne, kind, offset


def _placed(c: _Cursor, entry: tuple[str, tuple[int, ...], int, int], data_start: int,
            alignment: int) -> GGUFTensor:
    """A tensor whose bytes lie inside the file, aligned, in whole blocks."""
    import gguf

    name, ne, kind, offset = entry
    qtype = gguf.GGMLQuantizationType(kind)
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if ne[0] % block:
        raise c.fail(f"tensor {name}'s rows of {ne[0]} are not whole {qtype.name} blocks of {block}")
    n = 1
    for d in ne:
        n *= d
    nbytes = n // block * type_size
    start = data_start + offset
    if offset % alignment:
        raise c.fail(f"tensor {name} starts at an unaligned offset {offset}")
    if start + nbytes > c.size:
        raise c.fail(f"tensor {name} ({qtype.name}, {n:,} elements) needs {nbytes:,} bytes at "
                     f"offset {start:,}, past the end of the {c.size:,}-byte file")
    return GGUFTensor(name, qtype.name, tuple(reversed(ne)), nbytes, start)
