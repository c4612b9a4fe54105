"""What every session of one app process shares: the model turn, the loaded models and the
session records.

Module globals, created once per process: unlike `st.cache_resource`, nothing a browser sends
(its "clear cache" message clears every cache of the process) can replace the lock or load a
second copy of a model. Each is bounded (queue order, memory cap, entries and age).
"""

from __future__ import annotations

from engine.models import ModelStore
from ui.clients import address_part
from ui.config import AppConfig, config
from ui.footprint import footprint
from ui.sessions import SessionStore
from ui.turns import FairLock

LOCK = FairLock()
MODELS = ModelStore(config().model_cache_mb << 20,
                    native_tokens=config().limits.sequence_tokens)  # a live run always fits


def session_store(cfg: AppConfig) -> SessionStore:
    """The session records' store with this configuration's bounds and per-visitor quotas."""
    return SessionStore(max_entries=cfg.session_entries, max_bytes=cfg.session_mb << 20,
                        ttl_s=cfg.session_ttl_s, size_of=footprint, keep_s=cfg.session_keep_s,
                        client_entries=cfg.client_sessions, client_bytes=cfg.client_mb << 20,
                        group_entries=cfg.address_sessions,
                        group_bytes=cfg.address_mb << 20 if cfg.address_mb else None,
                        group_of=address_part)


def published_store(cfg: AppConfig) -> SessionStore:
    """Published runs' own store: each kept for the age limit the page states (`kept_for`),
    whatever its publisher does next — never evicted before it, a publish past the visitor's
    (or its address's, or the server's) quota refused instead."""
    return SessionStore(max_entries=cfg.published_runs, max_bytes=cfg.published_mb << 20,
                        ttl_s=cfg.session_ttl_s, size_of=footprint, keep_s=cfg.session_ttl_s,
                        client_entries=cfg.client_published, client_bytes=cfg.client_mb << 20,
                        group_entries=cfg.address_published, group_of=address_part,
                        evict_own=False)


SESSIONS = session_store(config())
PUBLISHED = published_store(config())
