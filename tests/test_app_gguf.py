"""A .gguf path in the sidebar's model box (local mode; issue 29.4): the model opens from the
file's own tensors, memory-mapped, and runs on its stored blocks; every page works on it and the
Quantization page shows the file's tensor table; a bad file is the loader's one line; a shared
server refuses a file outside its operator's folders as it refuses any path.

Every page and experiment here runs with `StoredEmbedding.weight` (the whole table dequantized to
float32) made to raise: nothing reaches for a float copy of the weights. The experiments that
work on the blocks run (the logit lens, the embedding neighbours and map, eager vs native C,
a serving stream); those that would need a float32 copy (the dtype comparison, compiling, the
quantization study and drift, a float16 re-run, other weights variants) say why in one line
instead of offering their button."""

from __future__ import annotations

import os

import pytest

from engine.gguf.stored import StoredEmbedding
from ui import guard
from ui.keys import LENS_ON, WEIGHTS
from ui.state import state_of

from .test_app import PAGES, fresh, generate


def _decoder_caption(at) -> str:
    return next(c.value for c in at.sidebar.caption if c.value.startswith("Decoder:"))


@pytest.fixture
def no_float_table(monkeypatch):
    def whole_table(_self):
        raise AssertionError("a page dequantized the whole embedding table")

    monkeypatch.setattr(StoredEmbedding, "weight", property(whole_table))


def _open_the_shipped_gguf(monkeypatch):
    from engine.loader import default_gguf_path

    at = fresh(monkeypatch)
    at.session_state["model_source"] = str(default_gguf_path())
    at.run()
    assert not at.exception
    return at


@pytest.mark.real_model
def test_the_shipped_gguf_opened_in_the_model_box_runs_every_page_and_shows_its_tensors(
        monkeypatch, no_float_table):
    from engine.loader import is_mapped_model

    at = _open_the_shipped_gguf(monkeypatch)
    lm = state_of(at.session_state).model.lm
    assert is_mapped_model(lm.model)
    assert lm.gguf_tensors is not None and len(lm.gguf_tensors.tensors) == 272
    assert "native C step on the file's GGML blocks" in _decoder_caption(at)
    at = generate(at, "Name a colour.", tokens=4)
    assert not at.exception
    decoder = state_of(at.session_state).run.trace.decoder
    assert (decoder.name, decoder.weights) == ("native", "fp32")
    assert decoder.weight_bytes < lm.spec.param_count * 4 / 5  # the Q4_1 blocks, not float32
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


@pytest.mark.real_model
def test_the_experiments_run_on_the_files_blocks_or_say_in_one_line_why_not(monkeypatch,
                                                                             no_float_table):
    from engine.kernels.compiled import COMPILE_MAPPED
    from engine.quant.drift import DRIFT_MAPPED
    from engine.quant.study import STUDY_MAPPED
    from engine.timing.dtype_compare import DTYPES_MAPPED

    at = _open_the_shipped_gguf(monkeypatch)
    weights = at.sidebar.selectbox(key=WEIGHTS)  # only its own: the variants are float copies
    assert weights.options == ["the file's own, as stored"] and weights.disabled
    assert any("the file's own weights: 97 MB stored" in c.value for c in at.sidebar.caption)
    at = generate(at, "Name a colour.", tokens=3)
    at.toggle(key=LENS_ON).set_value(True).run()  # the logit lens: the head on its blocks
    assert not at.exception and not at.error
    lens = next(d.value for d in at.dataframe if "would predict" in d.value)
    assert len(lens) == 31
    assert lens["its rank"].iloc[-1] == state_of(at.session_state).run.trace.steps[0].chosen_rank + 1

    at.switch_page("pages/embeddings.py").run()  # neighbours and map on the stored table
    assert not at.exception and not at.error
    near = next(d.value for d in at.dataframe if "cosine similarity" in d.value.columns)
    assert len(near) == 10 and near["cosine similarity"].between(-1, 1).all()
    at.button(key="emb_draw_map").click().run()
    assert not at.exception and not at.error
    assert any("1,500 random vocabulary tokens" in c.value for c in at.caption)

    at.switch_page("pages/timing.py").run()
    infos = [i.value for i in at.info]
    assert DTYPES_MAPPED in infos and COMPILE_MAPPED in infos
    keys = {b.key for b in at.button}
    assert "compare_dtypes" not in keys and "compare_compiled" not in keys
    at.button(key="compare_native").click().run()
    assert not at.exception and not at.error
    result = state_of(at.session_state).experiments.decode_comparison
    # (their greedy tokens may part: both round activations to 8 bits, in other orders)
    assert set(result.steps) == {"eager", "native C"} and len(result.tokens) == 32

    at.switch_page("pages/quantization.py").run()
    infos = [i.value for i in at.info]
    assert STUDY_MAPPED in infos and DRIFT_MAPPED in infos
    assert "quant_run" not in {b.key for b in at.button}

    at.switch_page("pages/compare.py").run()
    at.radio(key="compare_b_source").set_value("Run A again with one change").run()
    at.radio(key="compare_change").set_value("dtype").run()
    assert any("has no float16 version here" in i.value for i in at.info)
    assert "compare_rerun_go" not in {b.key for b in at.button}

    at.switch_page("pages/serving.py").run()  # batched on the blocks: no packed float copy
    at.text_area(key="serving_prompts").set_value("Hi.\nWhat is a cat?")
    at.text_area(key="serving_prefix").set_value("")
    at.text_input(key="serving_lengths").set_value("4")
    at.number_input(key="serving_count").set_value(2)
    next(b for b in at.button if b.label == "Run the stream").click()
    at.run(timeout=600)
    assert not at.exception and not at.error, [e.value for e in at.error]
    served = state_of(at.session_state).serving.run.requests
    assert len(served) == 2 and all(1 <= len(r.token_ids) <= 4 for r in served)


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
