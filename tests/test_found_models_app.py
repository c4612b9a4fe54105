"""The sidebar's "Models on this machine" through the app (AppTest): on one user's own server it
lists a fake home's GGUF files and picking one puts its path in the model box; on a shared server
(hosted, or bound beyond loopback) there is neither list nor folder field. No model loads: the
store's loader says which source it was asked for."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.errors import ModelLoadError
from engine.gguf import discover
from engine.gguf.fit import Memory
from engine.models import ModelStore
from ui import shared
from ui.text import plain

from .found_home import FakeHome, machine_env, make_home

APP = str(Path(__file__).resolve().parents[1] / "app.py")
ASKED = "test store: asked for "


@pytest.fixture
def home(tmp_path, monkeypatch) -> FakeHome:
    fake = make_home(tmp_path)
    machine_env(monkeypatch, fake.home)

    def loader(source: str, **_kwargs):
        raise ModelLoadError(ASKED + source)

    monkeypatch.setattr(shared, "MODELS", ModelStore(1 << 30, loader=loader))
    return fake


def sidebar(source: Path | str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["model_source"] = str(source)
    at.run()
    assert not at.exception
    return at


def found_list(at: AppTest):
    return [s for s in at.sidebar.selectbox if s.key == "found_model"]


def folder_field(at: AppTest):
    return [t for t in at.sidebar.text_input if t.key == "model_folders"]


def test_the_list_shows_this_machines_models_and_picking_one_fills_the_model_box(home, bind,
                                                                                 tmp_path):
    bind("127.0.0.1")
    at = sidebar(tmp_path / "empty")
    [listed] = found_list(at)
    assert listed.label == "Models on this machine" and listed.value is None
    assert listed.options == ["tiny:1b · llama · 90,688 · F32 · 360 KiB · fits",
                              "publisher/tiny-GGUF/tiny-Q8_0.gguf · llama · 576 · Q8_0 · "
                              "1.22 KiB · fits",
                              "org/tiny-GGUF/tiny-F32.gguf · llama · 90,688 · F32 · 360 KiB · fits"]
    assert folder_field(at)
    listed.select(str(home.lmstudio)).run()
    assert at.session_state["model_source"] == str(home.lmstudio)

    at = sidebar(home.lmstudio)  # the box holding a listed file: the list shows it, the store
    [listed] = found_list(at)  # was asked for it
    assert listed.value == str(home.lmstudio)
    # under the choice, its whole line (the box cuts it after the name) and where it came from
    assert any(c.value.startswith("publisher/tiny\\-GGUF/tiny\\-Q8\\_0\\.gguf · llama · 576 · "
                                  "Q8\\_0 · 1\\.22 KiB · fits  \nLM Studio: Q8\\_0 ×2")
               for c in at.sidebar.caption), [c.value for c in at.sidebar.caption]
    assert [e.value for e in at.sidebar.error] == [plain(f"{ASKED}{home.lmstudio}")]


def test_a_folder_added_is_searched_and_its_damaged_file_named(home, bind, tmp_path,
                                                               monkeypatch):
    bind("127.0.0.1")
    little = Memory(1000, "free memory")  # nothing fits: each one marked with what it needs
    monkeypatch.setattr(discover, "available_memory", lambda: little)
    at = AppTest.from_file(APP, default_timeout=120)
    at.session_state["model_source"] = str(tmp_path / "empty")
    at.session_state["model_folders"] = str(home.folder)
    at.run()
    assert not at.exception
    [listed] = found_list(at)
    assert any(o.startswith("⚠ sub/good.gguf · llama") for o in listed.options)
    assert all(o.startswith("⚠ ") and o.endswith(" · needs 0.3 GB more") for o in listed.options)
    assert any(c.value.startswith("1 GGUF file could not be read") for c in at.sidebar.caption)
    assert any(c.value.startswith("bad\\.gguf\\: bad\\.gguf is not a usable GGUF file")
               for c in at.sidebar.caption)


@pytest.mark.parametrize("where", ["hosted", "0.0.0.0"])
def test_a_shared_server_lists_nothing_and_offers_no_folder_field(where, home, bind, monkeypatch,
                                                                  tmp_path):
    if where == "hosted":
        bind("127.0.0.1")
        monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "1")
    else:
        bind(where)
    monkeypatch.setenv("INFERENCE_EXPLORER_MODELS", str(home.folder))
    at = sidebar(tmp_path / "empty")
    assert found_list(at) == [] and folder_field(at) == []
    assert not [e for e in at.sidebar.expander if e.label == "Folders to search"]
    assert "tiny" not in " ".join(str(e.value) for e in at.sidebar.caption)


def test_generate_without_the_refused_model_points_to_the_sidebars_reason(home, bind):
    """A file the loader refused (too big for this machine, say): the sidebar has the reason,
    and Generate says to look there for why, not only that the model may still be loading."""
    bind("127.0.0.1")
    at = sidebar(home.lmstudio)
    assert [e.value for e in at.sidebar.error] == [plain(f"{ASKED}{home.lmstudio}")]
    at.text_area(key="prompt").set_value("Hi")
    at.button[0].click()  # the form's Generate button
    at.run()
    assert not at.exception
    said = [e.value for e in at.main.error]
    assert any(e.startswith("No model is loaded — the sidebar says why") and
               "could not be loaded" in e for e in said), said
