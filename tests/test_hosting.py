"""The hosted demo's deploy files and its server-side budget (no Docker engine here: the image is
not built; its entrypoint runs in tests/e2e/test_space.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from engine.kv.cachelab import cache_on_off
from engine.models import ModelStore
from tests.test_app import fresh, generate
from ui import shared
from ui.config import AppConfig
from ui.state import state_of
from ui.turns import FairLock

ROOT = Path(__file__).resolve().parents[1]


def card() -> dict:
    text = (ROOT / "deploy" / "README.md").read_text()
    front = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert front, "the Space card starts with YAML front matter"
    return yaml.safe_load(front[1])


def dockerfile_env() -> dict[str, str]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    env = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(dict(re.findall(r"(\w+)=(\S+)", line)))
    return env


def test_the_space_card_is_a_docker_space_on_the_entrypoint_port():
    meta = card()
    assert meta["sdk"] == "docker" and meta["title"] and meta["emoji"]
    assert len(meta["short_description"]) <= 60  # the Hub's limit
    env = dockerfile_env()
    assert int(env["PORT"]) == meta["app_port"] == 7860
    assert env["INFERENCE_EXPLORER_HOSTED"] == "1" and env["HF_HUB_OFFLINE"] == "1"


def test_the_image_sends_its_cookie_inside_the_spaces_iframe():
    """The browser's cookie (uploads, a class's browsers told apart) must reach the app inside
    the Space page's cross-site iframe: SameSite=None, as Streamlit's CLI reads it from the
    image's environment."""
    env = {k: v for k, v in dockerfile_env().items() if k.startswith("STREAMLIT_")}
    shown = subprocess.run([sys.executable, "-m", "streamlit", "config", "show"],
                           env={**os.environ, **env}, capture_output=True,
                           text=True, timeout=120)
    assert re.search(r'^xsrfCookieSameSite = "none"$', shown.stdout, re.M), shown.stdout[-500:]
    assert re.search(r"^#? ?enableXsrfProtection = true$", shown.stdout, re.M)  # the default


def test_the_image_runs_the_same_entrypoint_as_make_run_as_a_non_root_user():
    docker = (ROOT / "Dockerfile").read_text()
    assert re.search(r'^CMD \["scripts/serve\.sh"\]$', docker, re.M)
    assert re.search(r"^USER user$", docker, re.M) and "--uid 1000" in docker
    assert "FROM python:3.11-slim" in docker and "HEALTHCHECK" in docker
    assert "/_stcore/health" in docker and "scripts/prepare_model.sh" in docker
    make = (ROOT / "Makefile").read_text()
    assert "scripts/serve.sh" in make.split("\nrun:")[1].split("\n\n")[0]
    pins = (ROOT / "requirements.txt").read_text()
    assert "torch==2.13.0" in docker and "torch==2.13.0" in pins


def test_make_space_assembles_the_card_as_the_readme(tmp_path):
    out = tmp_path / "space"
    subprocess.run(["make", "-s", "space", f"SPACE_DIR={out}"], cwd=ROOT, check=True,
                   capture_output=True, timeout=60)
    assert (out / "README.md").read_text() == (ROOT / "deploy" / "README.md").read_text()
    for name in ("Dockerfile", "scripts/serve.sh", "app.py", "requirements.txt"):
        assert (out / name).exists(), name


def test_the_turn_estimates_a_wait_from_recent_runs():
    lock = FairLock()
    assert lock.typical_hold_s is None
    for hold in (0.05, 0.05, 0.2):
        with lock.turn():
            time.sleep(hold)
    assert 0.04 < lock.typical_hold_s < 0.15  # the median, not the mean


@pytest.fixture
def budget_of(monkeypatch):
    """Hosted mode with a per-click budget of `seconds` (the real one is 15 s)."""
    def set_budget(seconds: float) -> None:
        monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "1")
        real = AppConfig.from_env()
        monkeypatch.setattr(AppConfig, "from_env", classmethod(
            lambda cls: replace(real, limits=replace(real.limits, click_s=seconds))))
    return set_budget


@pytest.mark.real_model
def test_a_generation_stops_at_the_per_click_budget(budget_of, monkeypatch):
    budget_of(1.0)
    at = fresh(monkeypatch, hosted=True).run()
    at = generate(at, "Write a long story about a dragon who learns to bake bread.", tokens=64)
    assert not at.exception
    trace = state_of(at.session_state).run.trace
    assert trace.stop_reason == "limit" and 1 <= len(trace.steps) < 64
    assert any("limit of 1 s of model time per click" in c.value for c in at.caption)
    # and what the visitor can do about it, not only what happened
    assert any("a shorter prompt or fewer new tokens" in c.value and "make run" in c.value
               for c in at.caption)


@pytest.mark.real_model
def test_the_budget_counts_model_time_not_waiting(budget_of, monkeypatch):
    """A visitor who waited 2 s for another's run still gets the whole budget once it is theirs."""
    budget_of(1.0)
    at = fresh(monkeypatch, hosted=True).run()
    shared.LOCK.acquire()
    threading.Timer(2.0, shared.LOCK.release).start()
    at = generate(at, "Say hi.", tokens=2)
    assert state_of(at.session_state).run.trace.stop_reason in ("eos", "length")


def test_cache_on_off_ends_at_a_stop_without_a_cut_result(lm):
    stop = threading.Event()
    stop.set()
    assert list(cache_on_off(lm, "Hi", [16], stop=stop)) == []


def test_a_hosted_page_draws_before_the_model_has_loaded(lm, monkeypatch):
    """The first visitor's page never waits for the model: it loads in a thread."""
    release = threading.Event()

    def slow_loader(source: str, dtype: str):
        release.wait(30)
        return lm

    store = ModelStore(1 << 30, loader=slow_loader)
    monkeypatch.setattr(shared, "MODELS", store)
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "1")
    start = time.monotonic()
    at = fresh().run()
    assert time.monotonic() - start < 20 and not at.exception
    assert state_of(at.session_state).model is None
    assert any("in the background" in i.value for i in at.sidebar.info)
    release.set()
    for _ in range(100):
        if store.peek("default", "float32") is not None:
            break
        time.sleep(0.05)
    again = fresh().run()
    assert state_of(again.session_state).model.lm is lm


def test_a_failed_background_load_is_one_message(monkeypatch):
    def broken(source: str, dtype: str):
        from engine import ModelLoadError
        raise ModelLoadError("the default model file is missing")

    store = ModelStore(1 << 30, loader=broken)
    monkeypatch.setattr(shared, "MODELS", store)
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "1")
    fresh().run()
    for _ in range(100):
        if store.failure("default", "float32"):
            break
        time.sleep(0.05)
    at = fresh().run()
    assert not at.exception
    assert any("file is missing" in e.value for e in at.sidebar.error)


@pytest.mark.real_model
def test_hosted_mode_ignores_a_forged_model_choice(monkeypatch):
    at = fresh(monkeypatch, hosted=True)
    at.session_state["model_source"] = "/etc"
    at.session_state["weights_variant"] = "fp16"  # not offered hosted
    at.run()
    assert not at.exception
    lm = state_of(at.session_state).model.lm
    assert lm.source == "default" and lm.spec.dtype == "float32"
    assert state_of(at.session_state).model.weights == "fp32"


@pytest.mark.parametrize("value, expected", [(None, 15.0), ("120", 120.0), ("0", 1.0),
                                             ("1e9", 600.0), ("nan", 15.0), ("lots", 15.0)])
def test_the_click_budget_can_be_set_within_bounds(monkeypatch, value, expected):
    from ui.config import config

    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "1")
    if value is None:
        monkeypatch.delenv("INFERENCE_EXPLORER_CLICK_S", raising=False)
    else:
        monkeypatch.setenv("INFERENCE_EXPLORER_CLICK_S", value)
    assert config().limits.click_s == expected
