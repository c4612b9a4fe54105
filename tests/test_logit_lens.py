"""The logit lens: its last layer is the model's own distribution, and it reads layers in order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine import GenerationSettings, generate_trace
from engine.errors import EngineError
from engine.lens.logit_lens import logit_lens
from ui.keys import LENS_ON
from ui.state import state_of


@pytest.fixture(scope="module")
def trace(lm):
    return generate_trace(lm, "The capital of France is", GenerationSettings(
        max_new_tokens=4, chat_template=False, record_attention=False))


def test_the_last_layer_is_the_models_own_top_k(lm, trace):
    for step in trace.steps:
        rows = logit_lens(lm, step.hidden, step.token_id, k=5)
        assert len(rows) == lm.spec.layers + 1 and [r.layer for r in rows] == list(range(31))
        last = rows[-1]
        assert last.top_ids == tuple(int(t) for t in step.top_ids[:5])
        np.testing.assert_allclose(last.top_probs, step.top_probs[:5], atol=1e-4)
        assert last.chosen_rank == step.chosen_rank
        assert last.chosen_prob == pytest.approx(step.chosen_prob, abs=1e-4)


def test_early_layers_do_not_know_the_answer_yet(lm, trace):
    """' Paris' is the greedy answer; the embedding output does not rank it first, the last
    layer does (a lens that returned the final logits for every row would fail)."""
    step = trace.steps[0]
    assert step.piece == "ĠParis"
    rows = logit_lens(lm, step.hidden, step.token_id)
    assert rows[0].chosen_rank > 0 and rows[-1].chosen_rank == 0
    assert rows[0].top_ids != rows[-1].top_ids


def test_wrong_shapes_and_ids_are_one_line(lm, trace):
    step = trace.steps[0]
    with pytest.raises(EngineError, match="do not fit"):
        logit_lens(lm, step.hidden[:, :10], step.token_id)
    with pytest.raises(EngineError, match="outside"):
        logit_lens(lm, step.hidden, 10**9)


@pytest.mark.real_model
def test_generate_page_shows_the_lens_for_the_picked_step():
    from tests.test_app import fresh, generate

    at = generate(fresh().run(), "The capital of France is", tokens=3)
    assert not at.exception
    assert not [d for d in at.dataframe if "would predict" in d.value]  # only when asked for
    at.toggle(key=LENS_ON).set_value(True).run()
    assert not at.exception
    lens = next(d.value for d in at.dataframe if "would predict" in d.value)
    assert len(lens) == 31 and list(lens["layer"])[0] == "embeddings"
    trace = state_of(at.session_state).run.trace
    assert lens["its rank"].iloc[-1] == trace.steps[0].chosen_rank + 1
    # one notation: · is a space inside a token, so the top 5 are separated by |, never by ·
    tops = [row.split(" | ") for row in lens["top 5"]]
    assert all(len(top) == 5 for top in tops)
    assert any(t.startswith("·") for top in tops for t in top)  # a word after a space, somewhere
    assert not any("Ġ" in str(v) for v in lens.to_numpy().ravel())


def test_cli_lens_prints_every_layer_and_refuses_bad_steps(lm, trace, tmp_path, capsys, cli_uses_lm):
    from engine.__main__ import main
    from engine.records.tracefile import save_trace

    path = tmp_path / "t.npz"
    save_trace(trace, path)
    assert main(["lens", str(path), "--step", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 + lm.spec.layers + 1 and "'ĠParis'" in out[-1] and out[-1].endswith("rank 1")
    assert main(["lens", str(path), "--step", "9"]) == 2
    assert capsys.readouterr().err.strip() == "error: --step must be between 0 and 3"
    example = Path(__file__).parents[1] / "assets" / "examples" / "qa.npz"
    assert main(["lens", str(example)]) == 2
    assert "without hidden states" in capsys.readouterr().err


def test_cli_dtypes_refuses_bad_arguments_in_one_line(capsys):
    from engine.__main__ import main

    assert main(["dtypes", "  "]) == 2
    assert capsys.readouterr().err.strip() == "error: the prompt is empty"
