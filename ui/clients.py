"""Who a session belongs to: the visitor's address, so that limits are per visitor, not per tab.

The session store's quotas (ui/sessions.py) and the model turn's queue (ui/turns.py) count by
client: four tabs of one visitor are one client, so opening tabs neither evicts another
visitor's work nor buys more turns. The address is the websocket's peer, or, behind a proxy
(a Hugging Face Space), the entry the proxy itself added to X-Forwarded-For: the entries before
it are whatever the visitor's own request claimed, and can be forged; the last
`INFERENCE_EXPLORER_PROXY_HOPS` entries were written by the proxies in front of the app
(hosted: 1, local: 0, so a header is ignored unless an operator says how many proxies they run).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import streamlit as st

from ui.config import config

LOCAL = "local"  # every loopback visitor: the machine's own user, one client
MAX_HOPS = 8


def proxy_hops() -> int:
    """How many proxies in front of the app wrote X-Forwarded-For entries (0–8)."""
    default = 1 if config().hosted else 0
    try:
        hops = int(os.environ.get("INFERENCE_EXPLORER_PROXY_HOPS", default))
    except ValueError:
        return default
    return min(max(hops, 0), MAX_HOPS)


def client_of(peer: str | None, headers: Mapping[str, str], hops: int) -> str:
    """The client behind a connection from `peer` (None: loopback) with these headers."""
    if hops > 0:
        forwarded = [a.strip() for a in headers.get("X-Forwarded-For", "").split(",")]
        forwarded = [a for a in forwarded if a]
        if len(forwarded) >= hops:
            return forwarded[-hops][:64]
    return LOCAL if peer is None else peer[:64]


def current_client() -> str:
    """This session's client (in a script run)."""
    try:
        headers = st.context.headers
        peer = st.context.ip_address
    except Exception:  # no websocket behind this run (a bare script)
        return LOCAL
    if not isinstance(peer, str):  # loopback (None), or AppTest's stand-in connection
        peer = None
    return client_of(peer, dict(headers or {}), proxy_hops())
