"""Inference Explorer engine: load a model, run an instrumented generation, record a Trace.

A pure library (no Streamlit). The Trace is the one contract between engine and UI.
"""

import os

__version__ = "0.1.0"

# Offline by default: hub ids load only from the local Hugging Face cache unless the user sets
# HF_HUB_OFFLINE=0 themselves. Must be set before transformers is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from .errors import EngineError, InputError, ModelLoadError, TraceFormatError  # noqa: E402
from .loader import LoadedModel, load_model  # noqa: E402
from .metrics import LatencySummary, summarize  # noqa: E402
from .runner import Run, generate_trace  # noqa: E402
from .settings import GenerationSettings  # noqa: E402
from .spec import ModelSpec  # noqa: E402
from .trace import Step, Trace, traces_equal  # noqa: E402
from .tracefile import load_trace, save_trace  # noqa: E402

__all__ = [
    "EngineError", "GenerationSettings", "InputError", "LatencySummary", "LoadedModel",
    "ModelLoadError", "ModelSpec", "Run", "Step", "Trace", "TraceFormatError", "generate_trace",
    "load_model", "load_trace", "save_trace", "summarize", "traces_equal",
]
