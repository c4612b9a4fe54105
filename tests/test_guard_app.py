"""Shared means guarded, through the app (AppTest, the real pages) with Streamlit's
`server.address` set as `ADDRESS=… make run` would: bound beyond loopback, a visitor's typed
address gets no request (a real local listener counts what reaches it) and the model box says
the same of a folder that exists and one that does not; on loopback both keep today's behaviour.
No model is loaded but a tiny one from a temporary folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from streamlit.testing.v1 import AppTest

from ui import shared
from ui.state import state_of

from .remote_peers import MODEL, reply, serve

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGE = "pages/serving_engine.py"
REFUSED = "This server is shared on the network"


@contextmanager
def listener() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """A real HTTP server on 127.0.0.1 that lists one model and records every request."""
    seen: list[tuple[str, str]] = []

    def routes(h, method: str, path: str, body: dict) -> None:
        seen.append((method, path))
        reply(h, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    with serve(routes) as peer:
        yield peer.url, seen


def engine_page(url: str, folder: Path, run_load: bool = False) -> AppTest:
    """The Serving engine page with `url` typed in (the model box: an empty folder, so no model
    loads); `run_load`: then press Run the load (two requests, no chat template)."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["model_source"] = str(folder)
    at.run()
    at.session_state["remote_url"] = url
    at.switch_page(PAGE).run()
    if run_load:
        at.session_state["remote_chat"] = False
        at.session_state["remote_count"] = 2
        next(b for b in at.button if b.label == "Run the load").click()
        at.run()
    assert not at.exception
    return at


def test_a_shared_bind_sends_nothing_to_an_address_a_visitor_types(bind, tmp_path, monkeypatch):
    with listener() as (url, seen):
        bind("0.0.0.0")
        at = engine_page(url, tmp_path, run_load=True)
        assert seen == []  # the old page listed its models on opening, then sent the load
        refusals = [e.value for e in at.main.error if e.value.startswith(REFUSED)]
        assert len(refusals) == 2  # the server box, and the form's one line on Run the load
        assert state_of(at.session_state).remote.run is None

        monkeypatch.setenv("INFERENCE_EXPLORER_ALLOWED_URLS", f"http://other:1/v1, {url}")
        at = engine_page(url, tmp_path)  # the operator's allowlist lets this one through
        assert seen == [("GET", "/v1/models")]
        assert any(f"serves: {MODEL}" in s.value for s in at.success)

        monkeypatch.delenv("INFERENCE_EXPLORER_ALLOWED_URLS")
        bind("127.0.0.1")  # one user on loopback: any address, as before
        at = engine_page(url.removesuffix("/v1"), tmp_path)
        assert seen == [("GET", "/v1/models")] * 2
        assert not [e for e in at.main.error if e.value.startswith(REFUSED)]
        assert any(f"serves: {MODEL}" in s.value for s in at.success)


def model_box(source: str) -> list[str]:
    """The sidebar's errors once the model box holds `source`."""
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["model_source"] = source
    at.run()
    assert not at.exception
    assert state_of(at.session_state).model is None
    return [e.value for e in at.sidebar.error]


def test_a_shared_bind_says_the_same_of_a_folder_that_exists_and_one_that_does_not(bind):
    bind("0.0.0.0")
    there, nowhere = model_box("/etc"), model_box("/no/such/dir")
    assert there == nowhere and len(there) == 1 and there[0].startswith(REFUSED)
    assert "etc" not in there[0] and "dir" not in there[0]
    bind("localhost")  # one user: the loader's own words, as before
    assert "Unrecognized model" in model_box("/etc")[0]
    assert "not found" in model_box("/no/such/dir")[0]


def test_a_shared_bind_loads_from_the_operators_folders_only(bind, tmp_path, monkeypatch,
                                                              tiny_lm):
    from transformers import BertConfig

    from engine.models import ModelStore

    allowed = tmp_path / "models"
    tiny_lm.model.save_pretrained(allowed / "tiny")
    tiny_lm.tokenizer.save_pretrained(allowed / "tiny")
    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=64).save_pretrained(allowed / "bert")
    os.symlink("/etc", allowed / "out")  # inside the allowed folder, leading out of it
    monkeypatch.setenv("INFERENCE_EXPLORER_MODEL_DIRS", str(allowed))
    monkeypatch.setattr(shared, "MODELS", ModelStore(1 << 30))  # a fresh store, dropped after
    bind("0.0.0.0")

    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["model_source"] = str(allowed / "tiny")
    at.run()
    assert not at.exception and not at.sidebar.error
    assert state_of(at.session_state).model.lm.spec.layers == 2
    assert "not a causal" in model_box(str(allowed / "bert"))[0]  # inside: the loader's words
    escaped = model_box(str(allowed / "out"))
    assert escaped == model_box(f"{allowed}/../../../../../../etc") == model_box("/etc")
    assert escaped[0].startswith(REFUSED)


def test_a_shared_bind_reaches_no_other_port_through_a_spelling_or_a_redirect(bind, tmp_path,
                                                                                monkeypatch):
    """The issue's attack, through the page: a base URL that urllib reads as the allowed server
    and urllib3 as another (a backslash before `@`), and other spellings the parsers disagree
    on, are refused before any request; the allowed server redirecting to another port is not
    followed. A real listener on the other port sees nothing, through the listing and Run the
    load."""
    other: list[tuple[str, str]] = []

    def elsewhere(h, method: str, path: str, body: dict) -> None:
        other.append((method, path))
        reply(h, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    with serve(elsewhere) as target, listener() as (allowed, seen):
        bind("0.0.0.0")
        monkeypatch.setenv("INFERENCE_EXPLORER_ALLOWED_URLS", allowed)
        good, evil = allowed.split("//")[1].removesuffix("/v1"), target.url.split("//")[1]
        for url in (f"http://{evil.removesuffix('/v1')}\\@{good}/v1", f"http://x@{evil}",
                    f"http://{good}@{evil}", f"http://{evil.removesuffix('/v1')}#@{good}/v1"):
            at = engine_page(url, tmp_path, run_load=True)
            assert len([e for e in at.main.error if e.value.startswith(REFUSED)]) == 2, url
        assert other == [] and seen == []

    def redirect(h, method: str, path: str, body: dict) -> None:
        seen.append((method, path))
        h.send_response(307)
        h.send_header("Location", f"{target_url}{path.removeprefix('/v1')}")
        h.send_header("Content-Length", "0")
        h.end_headers()

    with serve(elsewhere) as target, serve(redirect) as allowed_peer:
        target_url, seen = target.url, []
        monkeypatch.setenv("INFERENCE_EXPLORER_ALLOWED_URLS", allowed_peer.url)
        at = engine_page(allowed_peer.url, tmp_path, run_load=True)
        assert seen and other == []  # asked the allowed server, never followed it elsewhere
        assert any("No usable server" in e.value for e in at.main.error)
