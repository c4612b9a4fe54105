"""Compile one of the engine's C files for this machine, once, and load it with ctypes.

The library is cached by the source, its headers, the compiler, the flags and the CPU's feature
flags (`-march=native` code built on one CPU may not run on another), written under a temporary
name and renamed into place, so two processes compiling at once never load a half-written file.
No Python headers, no torch headers: plain C with OpenMP.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from .cache import cache_root
from .errors import EngineError


def compiler() -> str | None:
    return next((c for c in ("gcc", "cc", "clang") if shutil.which(c)), None)


def cpu_flags() -> str:
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return next((line for line in cpu.splitlines() if line.startswith("flags")), "")


def build(source: Path, headers: tuple[str, ...], flags: list[str], what: str) -> ctypes.CDLL:
    """`source` (with `headers` beside it) compiled with `flags` and loaded; EngineError naming
    `what` with the compiler's first error line when it fails."""
    cc = compiler()
    if cc is None:
        raise EngineError(f"the {what} needs a C compiler with OpenMP (gcc); none was found")
    paths = [source.parent / h for h in headers]  # a missing one fails the compile, clearly
    texts = [source.read_text()] + [p.read_text() for p in paths if p.exists()]
    key = hashlib.sha256("\n".join([*texts, cc, *flags, cpu_flags()]).encode()).hexdigest()[:16]
    target = cache_root() / "native" / f"{source.stem}-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.stem}.{os.getpid()}.tmp")
        done = subprocess.run([cc, *flags, str(source), "-o", str(partial), "-lm"],
                              capture_output=True, text=True)
        if done.returncode:
            lines = done.stderr.strip().splitlines() or ["no output"]
            first = next((line for line in lines if "error" in line), lines[0])[:200]
            raise EngineError(f"compiling the {what} failed: {first}")
        partial.replace(target)
    return ctypes.CDLL(str(target))
