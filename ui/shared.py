"""What every session of one app process shares: the model turn, the loaded models and the
session records.

Module globals, created once per process: unlike `st.cache_resource`, nothing a browser sends
(its "clear cache" message clears every cache of the process) can replace the lock or load a
second copy of a model. Each is bounded (queue order, memory cap, entries and age).
"""

from __future__ import annotations

from typing import Any

from engine import Trace
from engine.models import ModelStore
from ui.config import config
from ui.results import RemoteResults, ServingResults
from ui.sessions import SessionStore
from ui.turns import FairLock


def record_size(value: Any) -> int:
    """About the bytes a session record's value holds (the store's cap counts these)."""
    if isinstance(value, Trace):
        arrays = sum(a.nbytes for s in value.steps for a in (s.attention, s.hidden, s.top_ids,
                                                              s.top_probs) if a is not None)
        return arrays + 2048 * len(value.steps) + 100 * len(value.prompt_token_ids)
    if isinstance(value, (ServingResults, RemoteResults)):
        return value.nbytes
    if isinstance(value, dict):  # a published run's download files (ui/run_files.py)
        return 4096 + sum(len(data) for data in value.values() if isinstance(data, bytes))
    return 4096


LOCK = FairLock()
MODELS = ModelStore(config().model_cache_mb << 20,
                    native_tokens=config().limits.sequence_tokens)  # a live run always fits
SESSIONS = SessionStore(max_entries=64, max_bytes=config().session_mb << 20,
                        ttl_s=config().session_ttl_s, size_of=record_size)
