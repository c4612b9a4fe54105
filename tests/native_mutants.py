"""Broken copies of the native step's C sources, for the mutation checks (tests/test_native_*.py).

Why a helper: the step is a .c file and the headers it includes (native.HEADERS); a mutant must
change exactly one place in one of them and compile from a copy of all of them, so the copy's
#include finds the mutated header, not the real one.
"""

from __future__ import annotations

from pathlib import Path

import engine.kernels.native as native


def broken_sources(directory: Path, old: str, new: str) -> Path:
    """Copy the step's sources into `directory` with the one occurrence of `old` replaced by
    `new`; returns the copied .c file (for native.SOURCE). AssertionError unless `old` occurs
    exactly once in all of them together."""
    files = [native.SOURCE] + [native.SOURCE.parent / h for h in native.HEADERS]
    texts = {f.name: f.read_text() for f in files}
    assert sum(t.count(old) for t in texts.values()) == 1, old
    for name, text in texts.items():
        (directory / name).write_text(text.replace(old, new))
    return directory / native.SOURCE.name
