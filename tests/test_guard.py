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
