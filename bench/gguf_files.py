"""The GGUF benchmark's inputs: synthetic files of real shapes in a cache outside git, the prompt
ids both engines are given, and whether a file sits in the page cache.

Why a cache: an 8B Q4_K_M file is 4.9 GB and takes ~20 s to write; the benchmark and the
`big_model` tests open the same files, so each (shape, arch, type, vocabulary, seed) is written
once, under a name that holds all five, and reused.
Why the page-cache check: opening a memory-mapped file costs a disk read for every page not in
the page cache, and a benchmark cannot empty the cache on a shared machine without hurting
others (and needs root to). So nothing is dropped; each measurement says how much of the file
was resident before it started, and rows with different residency are not comparable.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from pathlib import Path

SHAPES = ("135m", "1b", "3b", "8b")
TYPES = ("q4_0", "q8_0", "q4_k_m")
BIG_SHAPES = ("1b", "3b", "8b")
SEED = 0
# SmolLM2-135M is a Llama 2 style model (no RoPE factors); scripts/synth_gguf.py's tests give it
# the SentencePiece vocabulary. The Llama 3.x shapes get llama3 (rope_freqs) and their own.
ARCH_VOCAB = {"135m": ("llama", "llama2")}
DEFAULT_ARCH_VOCAB = ("llama3", "llama3_1")
FIRST_ID = 256  # prompt ids start past every vocabulary's byte and special tokens
LAST_ID = 32000  # and stop before the smallest vocabulary's end (llama2's 32000)


def synth_dir() -> Path:
    """Where synthetic files are kept: INFERENCE_EXPLORER_SYNTH, else the per-user cache."""
    named = os.environ.get("INFERENCE_EXPLORER_SYNTH")
    if named:
        return Path(named)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "inference-explorer" / "synth"


def arch_vocab(shape: str) -> tuple[str, str]:
    """The (architecture, vocabulary) a shape is written with."""
    return ARCH_VOCAB.get(shape, DEFAULT_ARCH_VOCAB)


def synthetic_path(shape: str, qtype: str, seed: int = SEED) -> Path:
    arch, vocab = arch_vocab(shape)
    return synth_dir() / f"{shape}-{arch}-{qtype}-{vocab}-s{seed}.gguf"


def synthetic(shape: str, qtype: str, seed: int = SEED) -> tuple[Path, bool]:
    """The synthetic file of `shape` and `qtype` (written unless already there) and whether this
    call wrote it. scripts/synth_gguf.py writes under a temporary name and renames the whole
    file, so a file under the final name is complete."""
    from scripts.synth_gguf import write_synthetic

    path = synthetic_path(shape, qtype, seed)
    if path.is_file():
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True)
    arch, vocab = arch_vocab(shape)
    write_synthetic(path, shape, arch, qtype, vocab, seed)
    return path, True


def prompt_ids(n: int, seed: int = SEED) -> list[int]:
    """`n` fixed token ids, the same for both engines (the weights are random, so the ids need
    no meaning; a shorter prompt is a prefix of a longer one)."""
    import numpy as np

    return np.random.default_rng(seed).integers(FIRST_ID, LAST_ID, size=n).tolist()


def resident_fraction(path: Path | str) -> float | None:
    """Share of the file's pages in the page cache now (Linux mincore on a fresh read-only
    mapping, which faults nothing in); None where it cannot be asked."""
    import numpy as np

    size = os.path.getsize(path)
    if size == 0 or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(address), size, vec) != 0:
                return None
            return float((np.frombuffer(vec, dtype=np.uint8) & 1).sum()) / pages
        finally:
            libc.munmap(ctypes.c_void_p(address), size)
    finally:
        os.close(fd)


def cpu_has_amx() -> bool | None:
    """Whether the CPU advertises AMX tiles (`amx_tile` in /proc/cpuinfo's flags): where it
    does, llama.cpp's defaults route matrix products to its AMX backend, which crashes on VMs
    that advertise AMX without granting its tile state. None where /proc/cpuinfo is missing."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return any("amx_tile" in line.split() for line in text.splitlines()
               if line.startswith("flags"))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
