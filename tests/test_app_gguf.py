"""A .gguf path in the sidebar's model box (local mode; issue 29.4): the model opens from the
file's own tensors, decodes natively on its blocks, every page works on it, and the Quantization
page shows the file's tensor table; a bad file is the loader's one line; a shared server refuses
a file outside its operator's folders as it refuses any path."""

from __future__ import annotations

import os

import pytest

from ui import guard
from ui.state import state_of

from .test_app import PAGES, fresh, generate


def _decoder_caption(at) -> str:
    return next(c.value for c in at.sidebar.caption if c.value.startswith("Decoder:"))


@pytest.mark.real_model
def test_the_shipped_gguf_opened_in_the_model_box_runs_every_page_and_shows_its_tensors(
        monkeypatch):
    from engine.loader import default_gguf_path

    at = fresh(monkeypatch)
    at.session_state["model_source"] = str(default_gguf_path())
    at.run()
    assert not at.exception
    lm = state_of(at.session_state).model.lm
    assert lm.gguf_tensors is not None and len(lm.gguf_tensors.tensors) == 272
    assert "native C step on the file's GGML blocks" in _decoder_caption(at)
    at = generate(at, "Name a colour.", tokens=4)
    assert not at.exception
    decoder = state_of(at.session_state).run.trace.decoder
    assert (decoder.name, decoder.weights) == ("native", "fp32")
    assert decoder.weight_bytes < lm.spec.weight_bytes / 5  # the Q4_1 blocks, not float32
    for page in [*PAGES, "pages/quantization.py"]:
        at.switch_page(page).run()
        assert not at.exception, page
        assert not [e.value for e in at.error], page
    assert any("This file's tensors" in m.value for m in at.markdown)
    summary = next(m.value for m in at.markdown if "stores 272 tensors" in m.value)
    assert "Q4_1 ×210, F32 ×61, Q8_0 ×1" in summary and "bytes" in summary
    table = next(d.value for d in at.dataframe if "GGML type" in d.value.columns)
    assert list(table.columns) == ["name", "GGML type", "shape (rows × cols)", "bytes",
                                   "bits per weight"]
    row = table.set_index("name").loc["blk.0.attn_q.weight"]
    assert (row["GGML type"], row["shape (rows × cols)"], row["bytes"]) == ("Q4_1", "576 × 576",
                                                                            207_360)
    assert row["bits per weight"] == 5.0


def test_a_bad_gguf_file_in_the_model_box_is_the_loaders_one_line(monkeypatch, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOT A GGUF FILE" * 10)
    at = fresh(monkeypatch)
    at.session_state["model_source"] = str(bad)
    at.run()
    assert not at.exception
    assert state_of(at.session_state).model is None
    (error,) = [e.value.replace("\\", "") for e in at.sidebar.error]  # markdown escapes
    assert error.startswith("bad.gguf is not a usable GGUF file")
    assert "\n" not in error.strip() and "Traceback" not in error


def test_a_shared_server_refuses_a_gguf_outside_its_folders(bind, monkeypatch, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv(guard.DIRS_ENV, os.pathsep.join([str(mine)]))
    bind("0.0.0.0")
    assert guard.model_refusal(str(mine / "m.gguf")) is None
    assert guard.model_refusal(str(tmp_path / "other.gguf")) == guard.MODEL_REFUSED
    assert guard.model_refusal(str(tmp_path / "none.gguf")) == guard.MODEL_REFUSED
