"""Inference Explorer engine: load a model, run an instrumented generation, record a Trace.

A pure library (no Streamlit). The Trace is the one contract between engine and UI.

Importing the package does nothing else: no environment variable is set (entry points such as
`python -m engine` and app.py choose offline mode before transformers is imported) and the names
below are imported on first access, so `import engine` does not pull in torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name → the module that defines it
_EXPORTS = {
    "EngineError": "errors", "InputError": "errors", "ModelLoadError": "errors",
    "TraceFormatError": "errors", "LoadedModel": "loader", "load_model": "loader",
    "LatencySummary": "timing.metrics", "summarize": "timing.metrics", "Run": "runner",
    "generate_trace": "runner", "GenerationSettings": "settings", "ModelSpec": "spec",
    "Step": "records.trace", "Trace": "records.trace", "traces_equal": "records.trace",
    "load_trace": "files", "save_trace": "records.tracefile",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])

