"""Who a session belongs to: the visitor's address, so that limits are per visitor, not per tab.

The session store's quotas (ui/sessions.py) and the model turn's queue (ui/turns.py) count by
client: four tabs of one visitor are one client, so opening tabs neither evicts another
visitor's work nor buys more turns. The address is the websocket's peer, or, behind a proxy
(a Hugging Face Space), the entry the proxy itself added to X-Forwarded-For: the entries before
it are whatever the visitor's own request claimed, and can be forged; the last
`INFERENCE_EXPLORER_PROXY_HOPS` entries were written by the proxies in front of the app
(hosted: 1, local: 0, so a header is ignored unless an operator says how many proxies they run).

A class behind one address (a school's NAT) is many visitors, though: within an address, each
browser is a client of its own, known by a cookie the server issues — Streamlit's XSRF cookie,
16 random bytes per browser, sent with every request and shared by its tabs (so four tabs are
still one client). The client is the address and a hash of that token (the token itself, a
secret, is never kept). A browser can send any cookie it likes, so the address stays the
ceiling: at most `CLASS` browsers of one address are clients of their own at a time (a class);
past that, newcomers share the address's own client until a browser has been idle `IDLE_S`.
Without the cookie (a browser that refuses it) the client is the address, as before.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

import streamlit as st
from streamlit.web.server.starlette.starlette_app_utils import decode_xsrf_token_string

from ui.config import config

LOCAL = "local"  # every loopback visitor: the machine's own user, one client
MAX_HOPS = 8
COOKIE = "_streamlit_xsrf"  # Streamlit's server issues it with the page (enableXsrfProtection)
CLASS = 40  # browsers of one address that are clients of their own at a time
IDLE_S = 2 * 3600.0  # a browser unseen this long gives its place among its address's CLASS
ADDRESSES = 4096  # addresses whose browsers are remembered
SEPARATOR = "#"  # between the address and the browser in a client's name; in no address


def proxy_hops() -> int:
    """How many proxies in front of the app wrote X-Forwarded-For entries (0–8)."""
    default = 1 if config().hosted else 0
    try:
        hops = int(os.environ.get("INFERENCE_EXPLORER_PROXY_HOPS", default))
    except ValueError:
        return default
    return min(max(hops, 0), MAX_HOPS)


def address_of(peer: str | None, headers: Mapping[str, str], hops: int) -> str:
    """The address behind a connection from `peer` (None: loopback) with these headers."""
    if hops > 0:
        forwarded = [a.strip() for a in headers.get("X-Forwarded-For", "").split(",")]
        forwarded = [a for a in forwarded if a]
        if len(forwarded) >= hops:
            return forwarded[-hops][:64]
    return LOCAL if peer is None else peer[:64]


def browser_of(cookie: str | None) -> str | None:
    """A browser's name from its XSRF cookie: a hash of the cookie's random token, decoded by
    Streamlit's own server code (the token is masked differently in every response, so the
    cookie's text changes; the token does not). None when the cookie is absent or not one the
    server issues."""
    token, _ = decode_xsrf_token_string(cookie or "")
    if token is None or len(token) < 16:
        return None
    return hashlib.sha256(b"inference-explorer browser " + token).hexdigest()[:20]


class Browsers:
    """Which browsers of each address are clients of their own: at most `per_address` at a time
    (the first ones seen, each keeping its place while it is seen within `idle_s`); the rest
    share their address's client. Bounded: the `addresses` most recently seen are remembered."""

    def __init__(self, per_address: int = CLASS, idle_s: float = IDLE_S,
                 addresses: int = ADDRESSES, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_address, self.idle_s, self.addresses, self._clock = (per_address, idle_s,
                                                                      addresses, clock)
        self._seen: OrderedDict[str, OrderedDict[str, float]] = OrderedDict()
        self._lock = threading.Lock()

    def client(self, address: str, browser: str | None) -> str:
        if browser is None:
            return address
        now = self._clock()
        with self._lock:
            known = self._seen.pop(address, None) or OrderedDict()
            self._seen[address] = known
            while len(self._seen) > self.addresses:
                self._seen.popitem(last=False)
            if browser not in known:
                idle = next(iter(known.items()), None)  # the browser seen least recently
                if len(known) >= self.per_address and idle and now - idle[1] > self.idle_s:
                    known.popitem(last=False)
                if len(known) >= self.per_address:
                    return address
            known[browser] = now
            known.move_to_end(browser)
            return address + SEPARATOR + browser


BROWSERS = Browsers()


def address_part(client: str) -> str:
    """The address a client belongs to (a client is an address, or an address and a browser)."""
    return client.split(SEPARATOR, 1)[0]


def client_of(peer: str | None, headers: Mapping[str, str], hops: int,
              cookies: Mapping[str, str] | None = None, browsers: Browsers = BROWSERS) -> str:
    """The client behind a connection from `peer` (None: loopback) with these headers and
    cookies: its address, and its browser when the browser holds the server's cookie."""
    return browsers.client(address_of(peer, headers, hops), browser_of((cookies or {}).get(COOKIE)))


def current_client() -> str:
    """This session's client (in a script run)."""
    try:
        headers = st.context.headers
        peer = st.context.ip_address
        cookies = st.context.cookies
    except Exception:  # no websocket behind this run (a bare script)
        return LOCAL
    if not isinstance(peer, str):  # loopback (None), or AppTest's stand-in connection
        peer = None
    return client_of(peer, dict(headers or {}), proxy_hops(), dict(cookies or {}))
