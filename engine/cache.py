"""Where the engine keeps what it makes once per machine: converted models, compiled kernels."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "INFERENCE_EXPLORER_CACHE"


def cache_root() -> Path:
    """Per-user cache folder; INFERENCE_EXPLORER_CACHE overrides it."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "inference-explorer" / "models"
