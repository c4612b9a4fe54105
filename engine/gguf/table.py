"""A GGUF file's tensor table as a record: what each tensor is stored as, and what it costs.

Kept on a model opened from a GGUF (`LoadedModel.gguf_tensors`) because the torch model holds
float32 copies: the table is the only place that still says the file stored blk.0.attn_q.weight as
Q4_1 in 207,360 bytes (5.0 bits per weight). `python -m engine gguf-info FILE` prints it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor of the file."""

    name: str  # llama.cpp's name, e.g. "blk.0.attn_q.weight"
    ggml_type: str  # "F32", "Q4_1", …
    shape: tuple[int, ...]  # torch order (rows, cols): the reverse of GGUF's ne[]
    nbytes: int  # as stored
    offset: int  # of its first byte, from the start of the file

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def bits_per_weight(self) -> float:
        return self.nbytes * 8 / self.n_elements

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.ggml_type, "shape": list(self.shape),
                "bytes": self.nbytes, "bits_per_weight": self.bits_per_weight,
                "offset": self.offset}


@dataclass(frozen=True, slots=True)
class GGUFTable:
    """Every tensor of one file, in file order, and the file facts around them."""

    path: str
    file_bytes: int
    version: int
    architecture: str
    name: str | None  # general.name
    tensors: tuple[GGUFTensor, ...]

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def n_elements(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def bits_per_weight(self) -> float:
        """Over every tensor, norms included (llama.cpp's "BPW" of a file)."""
        return self.tensor_bytes * 8 / max(1, self.n_elements)

    def by_name(self) -> dict[str, GGUFTensor]:
        return {t.name: t for t in self.tensors}

    def type_counts(self) -> dict[str, int]:
        """GGML type → how many tensors are stored in it, most common first."""
        return dict(Counter(t.ggml_type for t in self.tensors).most_common())

    def to_json(self) -> dict[str, Any]:
        return {"file": self.path, "file_bytes": self.file_bytes, "version": self.version,
                "architecture": self.architecture, "name": self.name,
                "tensor_count": len(self.tensors), "tensor_bytes": self.tensor_bytes,
                "parameters": self.n_elements, "bits_per_weight": self.bits_per_weight,
                "types": self.type_counts(), "tensors": [t.to_json() for t in self.tensors]}

    def lines(self) -> list[str]:
        """The table as aligned text: a summary line, a header, one tensor a line."""
        types = ", ".join(f"{k} ×{v}" for k, v in self.type_counts().items())
        out = [f"{self.path}: GGUF v{self.version}, {self.architecture}"
               + (f" ({self.name})" if self.name else "")
               + f", {len(self.tensors)} tensors, {self.n_elements:,} weights in "
               f"{self.tensor_bytes:,} bytes ({self.bits_per_weight:.2f} bits/weight): {types}",
               f"{'name':32} {'type':6} {'shape (rows, cols)':>20} {'bytes':>12} {'bits/w':>7}"]
        for t in self.tensors:
            shape = " × ".join(str(d) for d in t.shape)
            out.append(f"{t.name:32} {t.ggml_type:6} {shape:>20} {t.nbytes:12,} "
                       f"{t.bits_per_weight:7.3f}")
        return out
