"""Finding the GGUF files on this machine (engine/gguf/discover.py) in a fake home: Ollama's store
listed by manifest name, LM Studio's folders, the Hugging Face cache through its links, the
user's folders; a damaged file listed with its reason; loops, deep trees, FIFOs and hidden
folders survived; the search capped; headers read once per (file, size, mtime); the fit at the
default context; `python -m engine models`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.__main__ import main
from engine.gguf import discover
from engine.gguf.discover import find_models, search_places
from engine.gguf.fit import Memory, fit_problem, need
from engine.gguf.reader import DEFAULT_CONTEXT

from .found_home import FakeHome, machine_env, make_home

PLENTY = Memory(1 << 40, "free memory")


@pytest.fixture
def fake(tmp_path) -> FakeHome:
    discover._HEADERS.clear()
    return make_home(tmp_path)


def by_name(found) -> dict:
    return {m.name: m for m in found}


def test_each_tool_s_models_are_listed_by_the_name_the_tool_gives(fake):
    found = find_models(home=fake.home, environ={}, memory=PLENTY)
    assert [(m.source, m.name) for m in found] == [
        ("ollama", "tiny:1b"),  # the manifest's name, never the blob's hash
        ("lmstudio", "publisher/tiny-GGUF/tiny-Q8_0.gguf"),
        ("huggingface", "org/tiny-GGUF/tiny-F32.gguf")]  # two revisions, one blob: once
    ollama, lmstudio, hf = found
    assert ollama.path == str(fake.ollama_blob)
    assert hf.path == str(fake.hf_link)  # the link the model box opens, its size the blob's
    assert hf.file_bytes == os.path.getsize(os.path.realpath(fake.hf_link))
    assert lmstudio.types == (("Q8_0", 2), ("F32", 1)) and lmstudio.type_mix == "Q8_0 ×2, F32 ×1"
    assert lmstudio.main_type == "Q8_0" and lmstudio.parameters == 2 * 4 * 64 + 64
    assert lmstudio.architecture == "llama" and ollama.main_type == "F32"
    assert all(m.fits and m.error is None and m.fit_line is None for m in found)


def test_the_users_folder_survives_loops_deep_trees_fifos_and_damage(fake):
    found = by_name(find_models([fake.folder], home=fake.home, environ={}, memory=PLENTY))
    assert found["sub/good.gguf"].fits  # once, though sub/loop leads back to the folder
    assert not [n for n in found if "loop" in n or n.startswith(("a/", "b/"))]
    assert not [n for n in found if "deep" in n or "fifo" in n or "hidden" in n]
    bad = found["bad.gguf"]
    assert bad.error.startswith("bad.gguf is not a usable GGUF file:") and "\n" not in bad.error
    assert not bad.fits and bad.architecture is None
    deep = fake.folder.joinpath(*[f"d{i}" for i in range(10)])
    assert "deep.gguf" in by_name(find_models([deep], home=fake.home, environ={}, memory=PLENTY))


def test_the_environment_names_more_places(fake, tmp_path):
    store = fake.home / ".ollama" / "models"
    moved = tmp_path / "elsewhere"
    store.rename(moved)
    env = {"OLLAMA_MODELS": str(moved), "HF_HUB_CACHE": str(tmp_path / "none"),
           "INFERENCE_EXPLORER_MODELS": os.pathsep.join([str(fake.folder / "sub"), ""])}
    found = by_name(find_models(home=fake.home, environ=env, memory=PLENTY))
    assert found["tiny:1b"].path.startswith(str(moved))
    assert "org/tiny-GGUF/tiny-F32.gguf" not in found  # HF_HUB_CACHE replaces ~/.cache's hub
    assert found["good.gguf"].source == "folder"
    hub = dict((str(p), s) for s, p in search_places(home=fake.home, environ={"HF_HOME": "/h"}))
    assert hub["/h/hub"] == "huggingface"
    assert str(discover.OLLAMA_SERVICE) not in hub  # the service's store: the real home only


def test_the_search_is_capped(fake, monkeypatch):
    monkeypatch.setattr(discover, "MAX_FILES", 2)
    assert len(find_models([fake.folder], home=fake.home, environ={}, memory=PLENTY)) == 2
    monkeypatch.setattr(discover, "MAX_FILES", 256)
    monkeypatch.setattr(discover, "MAX_ENTRIES", 3)
    assert len(find_models([fake.folder], home=fake.home, environ={}, memory=PLENTY)) < 2


def test_a_header_is_read_once_per_file_size_and_mtime(fake, monkeypatch):
    reads = []
    real = discover.read_header
    monkeypatch.setattr(discover, "read_header", lambda p: reads.append(p) or real(p))
    find_models([fake.folder], home=fake.home, environ={}, memory=PLENTY)
    first = len(reads)
    assert first == 5  # Ollama's, LM Studio's, the cache's, good.gguf and bad.gguf
    find_models([fake.folder], home=fake.home, environ={}, memory=PLENTY)
    assert len(reads) == first  # the damaged file's reason is kept too
    os.utime(fake.lmstudio, ns=(1, 1))
    find_models([fake.folder], home=fake.home, environ={}, memory=PLENTY)
    assert reads[first:] == [str(fake.lmstudio)]


def test_a_model_that_does_not_fit_says_how_much_more_it_needs(fake):
    little = Memory(1000, "container limit")
    ollama = find_models(home=fake.home, environ={}, memory=little)[0]
    cost = need(ollama.need_bytes - 256 * 2**20 - 2 * 2 * 2 * 16 * 4 * DEFAULT_CONTEXT, 2, 2, 16,
                DEFAULT_CONTEXT)  # the tiny llama: 2 layers, 2 KV heads of 16, the work buffers
    assert cost.total == ollama.need_bytes
    assert not ollama.fits and ollama.shortfall == ollama.need_bytes - 1000
    assert ollama.fit_line == fit_problem("tiny:1b", cost, little)
    assert ollama.fit_line.endswith("GB more is needed")


def test_the_command_lists_them(fake, monkeypatch, capsys):
    machine_env(monkeypatch, fake.home)
    assert main(["models", "--folder", str(fake.folder)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tiny:1b (Ollama): llama, ") and out[0].endswith("; fits")
    assert out[1].strip() == str(fake.ollama_blob)
    assert any(line.startswith("bad.gguf (folder): not readable: ") for line in out)
    assert main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in listed][:3] == ["tiny:1b", "publisher/tiny-GGUF/tiny-Q8_0.gguf",
                                              "org/tiny-GGUF/tiny-F32.gguf"]
    assert listed[1]["types"] == {"Q8_0": 2, "F32": 1} and listed[1]["fits"] is True


@pytest.mark.parametrize("folder", ["/no/such/folder", "bad\0name"])
def test_the_command_refuses_a_folder_that_is_not_there(folder, monkeypatch, tmp_path, capsys):
    machine_env(monkeypatch, tmp_path)
    assert main(["models", "--folder", folder]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --folder ") and err.count("\n") == 1


def test_nothing_found_says_where_it_looked(tmp_path, monkeypatch, capsys):
    machine_env(monkeypatch, tmp_path)
    assert main(["models"]) == 0
    assert capsys.readouterr().out.startswith(f"no GGUF files found in {tmp_path}/.ollama/models")


def test_a_real_gguf_reads_as_its_model(tmp_path):
    from engine.loader import default_gguf_path

    found = find_models([default_gguf_path().parent], home=tmp_path, environ={}, memory=PLENTY)
    smol = by_name(found)["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert smol.architecture == "llama" and round(smol.parameters / 1e6) == 135
    assert smol.main_type == "Q4_1" and smol.type_mix.startswith("Q4_1 ×")
    assert Path(smol.path).samefile(default_gguf_path())
