"""Shared means guarded: what a visitor may make this server reach when others can reach it.

A hosted demo is shared, and so is a local copy bound to anything but a loopback address (a
teacher's `ADDRESS=0.0.0.0 make run` for a class): its visitors are strangers on the network.
There a visitor must not make the server send requests to addresses they type (the Serving engine
page would reach into the operator's network) nor learn which folders exist on the operator's
disk (the model box's "not found" vs "unrecognized model" told them). So a shared server talks
only to the vLLM it starts (or the default local address the docs use) and the operator's
allowlist, and loads models only from its caches and the operator's folders, refusing anything
else in one sentence that is the same whether the thing exists or not. A single user on loopback
(`make run`) keeps every choice; an operator who trusts their network says so with
INFERENCE_EXPLORER_TRUST_NETWORK=1 (hosted mode stays guarded whatever it says).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

import streamlit as st

from engine.remote.client import RemoteError, normalize_base_url
from i18n import N_, _
from ui.config import config

TRUST_ENV = "INFERENCE_EXPLORER_TRUST_NETWORK"  # 1: a non-loopback bind is still one user's
URLS_ENV = "INFERENCE_EXPLORER_ALLOWED_URLS"  # comma-separated base URLs a shared server may use
DIRS_ENV = "INFERENCE_EXPLORER_MODEL_DIRS"  # folders (os.pathsep-separated) models may load from
# A Hugging Face id: `name` or `owner/name`, the hub's own characters, never a path's `..`, `~`,
# leading `/` or `.`.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")

# The refusals, shown translated; the operator's variable (URLS_ENV, DIRS_ENV) goes in as {env}.
URL_REFUSED = N_("This server is shared on the network, so it sends requests only to the vLLM "
                 "it started ({own}) and to the addresses its operator allows ({env}); run the "
                 "app on your own machine to reach any other server.")
_MODEL_REFUSED = N_("This server is shared on the network, so it loads only the default model, "
                    "models already in its Hugging Face cache and folders its operator allows "
                    "({env}); run the app on your own machine to load any other.")
MODEL_REFUSED = _MODEL_REFUSED.format(env=DIRS_ENV)  # the sentence as an English page shows it


def is_loopback(address: str | None) -> bool:
    """Whether Streamlit bound to `address` listens on this machine only. Unset or empty binds
    every interface, and a host name may resolve to anything: both are shared."""
    host = (address or "").strip().removeprefix("[").removesuffix("]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def shared() -> bool:
    """Whether visitors may be strangers: hosted mode, or a bind beyond loopback unless the
    operator set INFERENCE_EXPLORER_TRUST_NETWORK=1. Read on each call, like `config()`."""
    if config().hosted:
        return True
    if os.environ.get(TRUST_ENV) == "1":
        return False
    return not is_loopback(st.get_option("server.address"))


def _url_key(url: str) -> tuple[str, str, int, str] | None:
    """What a base URL reaches (scheme, host, port, path), so `http://127.0.0.1:8011` and
    `HTTP://127.0.0.1:8011/v1/` count as one address; None for no http(s) URL."""
    try:
        parts = urlsplit(normalize_base_url(url))
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except (RemoteError, ValueError):
        return None
    return parts.scheme.lower(), (parts.hostname or "").lower(), port, parts.path


def allowed_urls(own: Iterable[str]) -> list[str]:
    """`own` (the vLLM this app starts) and the operator's INFERENCE_EXPLORER_ALLOWED_URLS."""
    extra = [u.strip() for u in os.environ.get(URLS_ENV, "").split(",") if u.strip()]
    return [*own, *extra]


def url_refusal(url: str, own: Iterable[str]) -> str | None:
    """None when this server may send requests to `url`; else the one sentence saying why not,
    before any request. `own`: the base URLs of the vLLM this app starts."""
    if not shared():
        return None
    own = list(own)
    key = _url_key(url)
    if key is not None and key in {_url_key(u) for u in allowed_urls(own)}:
        return None
    return _(URL_REFUSED).format(own=", ".join(own) or _("none"), env=URLS_ENV)


def model_dirs() -> list[Path]:
    """Where a shared server may load a model folder from: the app's converted-model cache,
    the Hugging Face cache, and the operator's INFERENCE_EXPLORER_MODEL_DIRS."""
    from huggingface_hub import constants

    from engine.loader import cache_root

    extra = [d for d in os.environ.get(DIRS_ENV, "").split(os.pathsep) if d.strip()]
    return [cache_root(), Path(constants.HF_HUB_CACHE), *map(Path, extra)]


def _inside(path: str, roots: list[Path]) -> bool:
    """Whether `path`, every symlink and `..` followed (relative: from the working folder), lies
    in one of `roots` — so a link inside an allowed folder cannot lead out of it."""
    try:
        real = Path(os.path.realpath(Path(path).expanduser()))
        return any(real.is_relative_to(os.path.realpath(r.expanduser())) for r in roots)
    except (OSError, ValueError, RuntimeError):  # a NUL byte, ~nobody/…, a loop of links
        return False


def _cached_hub_id(source: str) -> bool:
    """Whether `source` is a Hugging Face id already in the cache, and no folder of that name
    sits in the working folder (the loader would read that folder instead)."""
    from huggingface_hub import try_to_load_from_cache

    if not HUB_ID.fullmatch(source) or ".." in source:
        return False
    try:
        found = try_to_load_from_cache(source, "config.json")
    except ValueError:  # HFValidationError: not an id the hub accepts
        return False
    return isinstance(found, str) and not os.path.lexists(source)


def model_refusal(source: str) -> str | None:
    """None when this server may load `source` (a Hugging Face id or a folder); else one
    sentence, the same whether the folder exists, is no model, or is nowhere."""
    if not shared() or source in ("", "default"):
        return None
    if _inside(source, model_dirs()) or _cached_hub_id(source):
        return None
    return _(_MODEL_REFUSED).format(env=DIRS_ENV)
