"""Issue 39, "a class behind one address": the students of a school share one public address, and
each of their browsers is still a visitor of its own — its records kept under its own quota, its
turn its own — known by the cookie Streamlit's server issues (ui/clients.py), with the address as
the ceiling (a class's size of browsers, a class's share of the store).

The cookies are made by Streamlit's own server code (`generate_xsrf_token_string`, what the page
request sets), the sessions run app.py's own record and link steps in AppTest (as
tests/test_fair_store.py does); the connection's cookie is the one thing stood in for. That a
real server issues it and a browser's tabs share it: tests/e2e/test_fair_turns_browser.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest
from streamlit.web.server.starlette.starlette_app_utils import generate_xsrf_token_string

from ui import shared
from ui.clients import COOKIE, Browsers, address_part, browser_of, client_of
from ui.config import AppConfig
from ui.sessions import SessionStore
from ui.state import state_of

SCHOOL = "203.0.113.7"  # the school's public address, as the Space's proxy writes it
PROXY = {"X-Forwarded-For": SCHOOL}


def cookie(token: bytes) -> dict[str, str]:
    """What a browser holding the server's cookie for `token` sends (masked anew each time)."""
    return {COOKIE: generate_xsrf_token_string(token)}


def test_a_browser_is_named_by_its_token_not_by_the_masked_text():
    token = bytes(range(16))
    first, second = cookie(token)[COOKIE], cookie(token)[COOKIE]
    assert first != second  # the server masks the token differently in each response
    assert browser_of(first) == browser_of(second) == browser_of(token.hex())  # version 1
    assert browser_of(cookie(bytes(16))[COOKIE]) != browser_of(first)
    assert token.hex() not in browser_of(first)  # the secret is never the name
    for bad in (None, "", "2|zz|00|1", "2|00|" + "00" * 16 + "|1", "abc", "00" * 8, "2|a|b"):
        assert browser_of(bad) is None, bad


def test_browsers_of_one_address_are_clients_of_their_own_up_to_a_class():
    now = [0.0]
    browsers = Browsers(per_address=3, idle_s=100, addresses=2, clock=lambda: now[0])
    names = [f"b{i}" for i in range(5)]
    clients = [browsers.client(SCHOOL, b) for b in names]
    assert clients[:3] == [f"{SCHOOL}#b{i}" for i in range(3)]
    assert clients[3:] == [SCHOOL, SCHOOL]  # past the class: the address's own client
    assert browsers.client(SCHOOL, None) == SCHOOL
    assert {address_part(c) for c in clients} == {SCHOOL}
    now[0] = 50.0
    for seen in ("b1", "b2"):  # seen again: keep their places
        assert browsers.client(SCHOOL, seen) == f"{SCHOOL}#{seen}"
    now[0] = 120.0  # b0 idle for 120 s > 100 s: a newcomer takes its place; b1, b2 (70 s) keep
    assert browsers.client(SCHOOL, "b3") == f"{SCHOOL}#b3"
    assert browsers.client(SCHOOL, "b4") == SCHOOL
    assert browsers.client("198.51.100.1", "b0") == "198.51.100.1#b0"  # other addresses apart
    browsers.client("198.51.100.2", "x")  # two addresses remembered: the school's is forgotten
    assert browsers.client(SCHOOL, "b4") == f"{SCHOOL}#b4"


def test_the_client_is_the_address_and_the_browser_behind_a_proxy():
    browsers = Browsers()
    one, two = cookie(b"1" * 16), cookie(b"2" * 16)
    a, b = (client_of("10.0.0.1", PROXY, 1, c, browsers) for c in (one, two))
    assert a != b and address_part(a) == address_part(b) == SCHOOL
    assert client_of("10.0.0.1", PROXY, 1, cookie(b"1" * 16), browsers) == a  # its tabs: one
    assert client_of("10.0.0.1", PROXY, 1, {}, browsers) == SCHOOL  # no cookie: the address
    forged = {COOKIE: "2|00000000|" + "00" * 16 + "|1"}  # any value a browser likes: still capped
    assert address_part(client_of("10.0.0.1", PROXY, 1, forged, browsers)) == SCHOOL


def small_store(now: list[float]) -> SessionStore:
    return SessionStore(max_entries=8, max_bytes=10_000, ttl_s=7200, keep_s=1800,
                        client_entries=2, client_bytes=1000, group_entries=4, group_bytes=2000,
                        group_of=address_part, clock=lambda: now[0],
                        size_of=lambda v: int(v.nbytes) if isinstance(v, np.ndarray) else 10)


def test_an_address_is_capped_as_a_class_and_recent_classmates_keep_their_work():
    now = [0.0]
    s = small_store(now)
    assert s.put("other", "trace", np.zeros(1), "198.51.100.1")
    for i in range(4):  # four browsers of the school, each within its own quota
        assert s.put(f"t{i}", "trace", np.zeros(1), f"{SCHOOL}#b{i}")
    # a fifth: the school is at its class's cap and every record there is recent
    assert not s.put("t4", "trace", np.zeros(1), f"{SCHOOL}#b4")
    now[0] = 1801.0  # past the guaranteed keep: the school's least recently used record goes
    assert s.put("t4", "trace", np.zeros(1), f"{SCHOOL}#b4")
    assert s.copy("t0") is None and s.copy("other") is not None  # never another address's
    assert s.put("t4b", "trace", np.zeros(1), f"{SCHOOL}#b4")  # its own quota: two records
    assert not s.put("big", "trace", np.zeros(300), f"{SCHOOL}#b5")  # 2400 B > a class's 2000


@pytest.fixture
def hosted_store(monkeypatch):
    """The hosted app's store; each session's client made from its cookie, as a connection's."""
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "1")
    monkeypatch.setattr(shared, "SESSIONS", shared.session_store(AppConfig.from_env()))
    browsers, sent = Browsers(), [{}]

    def current_client() -> str:
        return client_of("10.0.0.1", PROXY, 1, sent[0], browsers)

    monkeypatch.setattr("ui.record.current_client", current_client)
    monkeypatch.setattr("ui.snapshots.current_client", current_client)
    return sent


def visit() -> None:
    """app.py's record and link steps for one session: restore, open what the link asks."""
    from ui.links import open_link
    from ui.record import restore_session

    restore_session()
    open_link()


def session(params: dict[str, str]) -> AppTest:
    at = AppTest.from_function(visit, default_timeout=60)
    at.query_params.update(params)
    at.run()
    assert not at.exception, at.exception
    return at


def class_restored(sent: list[dict], cookies: list[dict[str, str]]) -> int:
    """Each student opens an example, then every student reloads: how many get their run back."""
    tokens = []
    for held in cookies:
        sent[0] = held
        tokens.append(state_of(session({"example": "qa"}).session_state).token)
    back = 0
    for held, token in zip(cookies, tokens):
        sent[0] = held
        back += state_of(session({"s": token}).session_state).run.trace is not None
    return back


def test_twenty_students_behind_one_address_all_get_their_work_back(hosted_store):
    students = [cookie(bytes([i]) * 16) for i in range(20)]
    assert class_restored(hosted_store, students) == 20


def test_without_the_cookie_the_address_is_one_visitor_as_before(hosted_store):
    # one visitor's quota for the whole class, and each reload's copy takes a place of its own
    # (the issue measured 16 of 20 reloads empty)
    quota = AppConfig.from_env().client_sessions
    assert class_restored(hosted_store, [{}] * 20) <= quota < 20
