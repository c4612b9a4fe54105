"""Does a GGUF fit here? What opening it costs, against the memory this process can really use.

A model opened from a GGUF is memory-mapped and runs on its stored blocks (engine/gguf/mapped.py),
so what it holds is: the file's tensor bytes (pages of the mapping, read in as the steps touch
them), the KV cache at the chosen context (float32 keys and values, 2 · layers · KV heads ·
head_dim · 4 bytes a position), the small float copies (norms, biases) and work buffers, and the
recording budget. The memory available is the container's limit where there is one (cgroup v2
`memory.max`, or v1 `memory.limit_in_bytes`) less what the container already uses, and never more
than what the host has available: in a 6 GiB Docker or Space container the host's free memory
says nothing about what the kernel will allow before it kills the process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from i18n import N_, _

from ..errors import ModelLoadError

GB = 1e9
# Work buffers of a forward beyond the weights and the cache: activations of a 512-token prompt
# of an 8B model (512 · 14336 · 4 bytes per intermediate, a few of them) and the logits.
WORK_BYTES = 256 * 2**20
_CGROUP_V2 = Path("/sys/fs/cgroup")
_CGROUP_V1 = Path("/sys/fs/cgroup/memory")


@dataclass(frozen=True, slots=True)
class Memory:
    """Bytes this process may still use, and where that figure comes from."""

    available: int
    source: str  # "container limit" or "free memory"


@dataclass(frozen=True, slots=True)
class Need:
    """What opening a model at a context costs, in bytes."""

    weights: int
    kv: int
    work: int
    recording: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.work + self.recording


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _own_cgroups() -> list[tuple[str, str]]:
    """(hierarchy, path) of this process's memory cgroups from /proc/self/cgroup: the unified
    one ("" controllers, v2) and v1's "memory"."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[1] == "" or "memory" in parts[1].split(",")):
            found.append(("v2" if parts[1] == "" else "v1", parts[2]))
    return found


def _limits(base: Path, files: tuple[str, str], path: str) -> list[tuple[int, int]]:
    """(limit, usage) of the cgroup at `path` under `base` and of each parent up to the root
    (a container sees its own cgroup as the root); the files say "max" where there is none."""
    found = []
    folder = base / path.strip("/") if path.strip("/") else base
    while True:
        limit = _read_int(folder / files[0])
        if limit is not None and limit < 1 << 60:  # v1 writes 2^63 - page for "no limit"
            found.append((limit, _read_int(folder / files[1]) or 0))
        if folder == base or base not in folder.parents:
            return found
        folder = folder.parent


def container_limit() -> tuple[int, int] | None:
    """(limit, usage) of the tightest memory cgroup this process is in, or None without one:
    its own cgroup's or any parent's (cgroup v2 memory.max / memory.current, v1's
    memory.limit_in_bytes / memory.usage_in_bytes)."""
    files = {"v2": (_CGROUP_V2, ("memory.max", "memory.current")),
             "v1": (_CGROUP_V1, ("memory.limit_in_bytes", "memory.usage_in_bytes"))}
    found = []
    for kind, path in _own_cgroups() or [("v2", "/"), ("v1", "/")]:
        base, names = files[kind]
        found += _limits(base, names, path)
    if not found:
        for kind in ("v2", "v1"):  # no /proc: the root files, as a container shows them
            found += _limits(files[kind][0], files[kind][1], "/")
    return min(found, key=lambda lu: lu[0] - lu[1]) if found else None


def host_available() -> int:
    try:
        import psutil
    except ImportError:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(psutil.virtual_memory().available)


def available_memory() -> Memory:
    """The bytes this process can still take: the container's room where it is the smaller."""
    host = host_available()
    limit = container_limit()
    if limit is not None and limit[0] - limit[1] < host:
        return Memory(max(0, limit[0] - limit[1]), N_("container limit"))
    return Memory(host, N_("free memory"))


def kv_bytes(layers: int, kv_heads: int, head_dim: int, positions: int) -> int:
    """Float32 keys and values: 2 · layers · KV heads · head_dim · 4 bytes per position."""
    return 2 * layers * kv_heads * head_dim * 4 * positions


def need(weight_bytes: int, layers: int, kv_heads: int, head_dim: int, context: int,
         recording: int = 0) -> Need:
    return Need(weight_bytes, kv_bytes(layers, kv_heads, head_dim, context), WORK_BYTES, recording)


def fit_problem(name: str, cost: Need, memory: Memory | None = None) -> str | None:
    """One line saying what `name` needs and what is free, when it does not fit; else None."""
    memory = memory or available_memory()
    if cost.total <= memory.available:
        return None
    return _("{name} needs {total:.1f} GB ({weights:.1f} GB of weights as stored + {kv:.1f} GB of "
             "KV cache + {work:.1f} GB of work and recording buffers), but only {free:.1f} GB is "
             "available ({source}): {more:.1f} GB more is needed").format(
        name=name, total=cost.total / GB, weights=cost.weights / GB, kv=cost.kv / GB,
        work=(cost.work + cost.recording) / GB, free=memory.available / GB,
        source=_(memory.source), more=(cost.total - memory.available) / GB)


def check_fit(name: str, cost: Need) -> None:
    """ModelLoadError (exit 2, a sidebar message) with `fit_problem`'s line, before any load."""
    problem = fit_problem(name, cost)
    if problem:
        raise ModelLoadError(problem)
