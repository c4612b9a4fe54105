"""The shared-server decision and its two guards (ui/guard.py), on their own: which binds count as
one user's, what the operator's flags change, which base URLs and model sources a shared server
accepts, and that a refusal says nothing of what exists. tests/test_guard_app.py drives the same
guards through the pages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ui import guard
from ui.sections.serving_engine import DEFAULT_URL


@pytest.mark.parametrize("address", ["localhost", "LOCALHOST", "127.0.0.1", "127.1.2.3", "::1",
                                     "[::1]", " 127.0.0.1 "])
def test_loopback_binds_are_one_users(address):
    assert guard.is_loopback(address)


@pytest.mark.parametrize("address", [None, "", "0.0.0.0", "::", "[::]", "192.168.1.20",
                                     "10.0.0.5", "fe80::1", "::ffff:10.0.0.1", "myhost.lan",
                                     "localhost.example.com", "127.0.0.1.example.com"])
def test_every_other_bind_is_shared(address):
    assert not guard.is_loopback(address)


def test_shared_is_hosted_or_a_wide_bind_unless_the_operator_trusts_the_network(bind,
                                                                                 monkeypatch):
    bind("127.0.0.1")
    assert not guard.shared()
    bind("0.0.0.0")
    assert guard.shared()
    monkeypatch.setenv(guard.TRUST_ENV, "yes")  # only the documented value counts
    assert guard.shared()
    monkeypatch.setenv(guard.TRUST_ENV, "1")
    assert not guard.shared()
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "1")  # hosted stays guarded regardless
    bind("127.0.0.1")
    assert guard.shared()


def test_a_shared_server_reaches_only_its_own_vllm_and_the_allowlist(bind, monkeypatch):
    own = (DEFAULT_URL,)
    bind("192.168.1.20")
    for url in (DEFAULT_URL, DEFAULT_URL.removesuffix("/v1"), DEFAULT_URL + "/",
                DEFAULT_URL.upper().replace("/V1", "/v1")):
        assert guard.url_refusal(url, own) is None, url
    for url in ("http://127.0.0.1:9/v1", "http://localhost:8011/v1", "http://10.0.0.1:8011/v1",
                DEFAULT_URL + "/../admin", "https://127.0.0.1:8011/v1", "file:///etc/passwd",
                "http://127.0.0.1:99999/v1", "not a url", ""):
        refusal = guard.url_refusal(url, own)
        assert refusal is not None and refusal.startswith("This server is shared"), url
        assert DEFAULT_URL in refusal and "INFERENCE_EXPLORER_ALLOWED_URLS" in refusal
    monkeypatch.setenv(guard.URLS_ENV, " http://10.0.0.1:8000 ,, https://llm.example/v1 ")
    assert guard.url_refusal("http://10.0.0.1:8000/v1", own) is None
    assert guard.url_refusal("https://llm.example:443/v1/", own) is None
    assert guard.url_refusal("http://10.0.0.1:8001/v1", own) is not None
    bind("127.0.0.1")
    assert guard.url_refusal("http://10.0.0.2:1/v1", own) is None  # one user: anything


def hub_cache(root: Path, repo: str) -> None:
    """A Hugging Face cache entry as the hub client writes one: refs/main → a snapshot."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("abc123")
    (folder / "snapshots" / "abc123").mkdir(parents=True)
    (folder / "snapshots" / "abc123" / "config.json").write_text("{}")


def test_a_shared_server_loads_only_from_its_folders_and_says_nothing_of_the_rest(
        bind, monkeypatch, tmp_path):
    from huggingface_hub import constants

    cache, hub, mine = tmp_path / "app-cache", tmp_path / "hub", tmp_path / "mine"
    for folder in (cache, hub, mine / "m"):
        folder.mkdir(parents=True)
    hub_cache(hub, "org/cached")
    monkeypatch.setenv("INFERENCE_EXPLORER_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setenv(guard.DIRS_ENV, os.pathsep.join([str(tmp_path / "nowhere"), str(mine)]))
    os.symlink("/etc", mine / "link")
    monkeypatch.chdir(tmp_path)
    bind("0.0.0.0")
    for source in ("default", "", str(cache / "x"), str(hub), str(mine / "m"),
                   str(mine / "not-yet"), "mine/m", "org/cached"):
        assert guard.model_refusal(source) is None, source
    refusals = {guard.model_refusal(s) for s in (
        "/etc", "/no/such/dir", str(mine / "link"), str(mine / "link" / "passwd"),
        f"{mine}/../../../../../../../etc", "~", "~nobody-here/x", "a\0b", ".", "..",
        str(tmp_path), "org/not-cached", "gpt2", "../mine/m/../../..", str(tmp_path / "mine2"))}
    assert refusals == {guard.MODEL_REFUSED}  # one sentence, whatever exists
    (tmp_path / "org" / "cached").mkdir(parents=True)  # a folder the loader would read instead
    assert guard.model_refusal("org/cached") == guard.MODEL_REFUSED
    bind("::1")
    assert guard.model_refusal("/etc") is None  # one user: the loader decides, as before


# Spellings of a base URL that two parsers have read as different addresses: {good} is the
# allowed server's port, {evil} another listener's (the first one reached it: 14 requests)
SPELLINGS = [
    "http://127.0.0.1:{evil}\\@127.0.0.1:{good}/v1", "http://127.0.0.1:{good}\\@127.0.0.1:{evil}/v1",
    "http://127.0.0.1:{good}@127.0.0.1:{evil}/v1", "http://user@127.0.0.1:{evil}/v1",
    "http://user:pw@127.0.0.1:{good}/v1", "http://127.0.0.1:{evil}#@127.0.0.1:{good}/v1",
    "http://127.0.0.1:{evil}?@127.0.0.1:{good}/v1", "http://127.0.0.1:{good}/v1?@127.0.0.1:{evil}",
    "http://127.0.0.1%3A{evil}/v1", "http://127.0.0.1%2e:{good}/v1", "http://[::ffff:7f00:1%25lo]:{evil}/v1",
    "http://[::1%lo]:{good}/v1", "http://127.1:{evil}/v1", "http://0x7f.0.0.1:{evil}/v1",
    "http://2130706433:{evil}/v1", "http://0177.0.0.1:{evil}/v1", "http://127.0.0.1:+{evil}/v1",
    "http://127.0.0.1: {evil}/v1", "http://127.0.0.1:{good} /v1", "http://127.0.0.1:{good}\t@x/v1",
    "http://127.0.0.1\n:{evil}/v1", "http://１２７.０.０.１:{evil}/v1", "http://127.0.0.1:0{evil}0/v1",
    "http://127.0.0.1:{good}/v1/..", "HTTP://127.0.0.1:{evil}\\/v1", "http:\\\\127.0.0.1:{evil}/v1",
]


def test_a_url_its_parsers_read_differently_is_refused_before_any_request(bind, monkeypatch):
    """Parse once, connect to what was checked: every spelling above is refused by a shared
    server's guard (and by the client's own parser), and a real listener on the other port sees
    no request even where the client is handed the URL as normalized."""
    from engine.remote.client import RemoteError, list_models, normalize_base_url
    from tests.remote_peers import reply, serve

    seen: list[str] = []

    def evil(h, method: str, path: str, body: dict) -> None:
        seen.append(f"{method} {path}")
        reply(h, 200, {"object": "list", "data": [{"id": "evil", "object": "model"}]})

    with serve(evil) as peer:
        port = int(peer.url.split(":")[2].split("/")[0])
        good = f"http://127.0.0.1:{port + 1 if port < 65535 else port - 1}/v1"
        bind("0.0.0.0")
        monkeypatch.setenv(guard.URLS_ENV, good)
        assert guard.url_refusal(good, ()) is None
        for spelling in SPELLINGS:
            url = spelling.format(good=good.split(":")[2].split("/")[0], evil=port)
            assert guard.url_refusal(url, ()) is not None, url
            try:
                base = normalize_base_url(url)
            except RemoteError as refused:
                assert "\n" not in str(refused)
                continue
            with pytest.raises(RemoteError):  # only the allowed server's address is left
                assert base == good, url
                list_models(base, timeout=1.0)
        assert seen == []
