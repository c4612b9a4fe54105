"""The What if page in AppTest on the real default model: a branch from the Generate run (tree,
numbers, side by side, opened on every page), head ablation and its sweep, activation patching,
and the one-line messages for what cannot be run."""

from __future__ import annotations

import io

import numpy as np
import pytest

from engine.files import read_trace_file
from engine.records.tracefile import trace_to_bytes
from ui.keys import STEP
from ui.state import state_of

from .test_app import PAGES, fresh, generate

PAGE = "pages/whatif.py"


def _button(at, label: str):
    return next(b for b in at.button if b.label == label)


@pytest.fixture(scope="module")
def branched():
    at = fresh()
    at.run()
    generate(at, "Name three fruits.", tokens=8)
    at.switch_page(PAGE).run()
    assert not at.exception
    _button(at, "Branch here").click().run()
    assert not at.exception, at.exception
    return at


def test_a_branch_from_the_run_is_recorded_and_shown_side_by_side(branched):
    at = branched
    state = state_of(at.session_state)
    tree, parents = state.whatif.tree, state.whatif.parents
    assert len(tree) == 2 and parents == (-1, 0) and tree[0] is state.run.trace
    b = tree[1].branch
    assert b.at == 2 and tree[1].output_token_ids[:2] == tree[0].output_token_ids[:2]
    assert b.reused_tokens == len(tree[0].prompt_token_ids) + 2
    labels = [m.label for m in at.metric]
    assert "Reused from the KV cache" in labels and "Full re-run took" in labels
    assert any("first differ at answer token 2" in w.value for w in at.warning)
    assert at.selectbox(key="whatif_a").value == 0
    assert at.selectbox(key="whatif_b").value == 1
    _button(at, "Branch here").click().run()  # the same branch again: shown, not computed again
    assert len(state_of(at.session_state).whatif.tree) == 2
    assert any("exists already" in i.value for i in at.info)


def test_a_branch_of_the_branch_and_opening_it_on_every_page(branched):
    at = branched
    at.selectbox(key="whatif_from").set_value(1).run()
    at.selectbox(key="whatif_at").set_value(4).run()
    _button(at, "Branch here").click().run()
    assert not at.exception
    state = state_of(at.session_state)
    assert state.whatif.parents == (-1, 0, 1)
    second = state.whatif.tree[2]
    assert second.branch.parent_tokens == state.whatif.tree[1].output_token_ids
    at.selectbox(key="whatif_b").set_value(2).run()
    _button(at, "Open on every page").click().run()
    assert state.run.trace is second and len(state.whatif.tree) == 3  # the tree stays
    back = read_trace_file(io.BytesIO(trace_to_bytes(second))).trace
    assert back.branch == second.branch
    for other in PAGES:  # every page works on a branch
        at.switch_page(other).run()
        assert not at.exception, other
        assert not [i.value for i in at.info if "No trace yet" in i.value], other


def test_generates_what_if_button_opens_the_page_on_that_token(branched):
    at = branched
    at.switch_page("pages/generate.py").run()
    at.select_slider(key=STEP).set_value(3).run()
    _button(at, "What if it had chosen another token here?").click().run()
    assert not at.exception
    current = state_of(at.session_state).run.trace
    tree = state_of(at.session_state).whatif.tree
    assert tree[at.selectbox(key="whatif_from").value] is current
    assert at.selectbox(key="whatif_at").value == 3


def test_a_typed_token_of_two_tokens_is_one_line(branched):
    at = branched
    at.switch_page(PAGE).run()
    at.text_input(key="whatif_typed").set_value("strawberries and cream")
    _button(at, "Branch here").click().run()
    assert not at.exception
    assert any("not one" in e.value for e in at.error)


def test_ablation_and_the_head_sweep(branched):
    at = branched
    at.switch_page(PAGE).run()
    _button(at, "Switch off and re-run").click().run()
    assert not at.exception
    found = state_of(at.session_state).whatif.ablation
    assert found is not None and found.ablation.layer == 1 and found.ablation.heads == (5,)
    assert any(m.label.startswith("KL") for m in at.metric)
    _button(at, "Which heads matter?").click().run()
    assert not at.exception
    sweep = state_of(at.session_state).whatif.sweep
    assert np.isfinite(sweep.kl[5]).all() and np.isnan(sweep.kl[4]).all() and sweep.complete


def test_patching_and_prompts_of_different_lengths(branched):
    at = branched
    at.switch_page(PAGE).run()
    _button(at, "Patch every layer and position").click().run()
    assert not at.exception
    found = state_of(at.session_state).whatif.patching
    assert found.complete and found.result.logit_diff.shape == (30, len(found.clean_pieces))
    assert found.clean_answer != found.corrupt_answer
    at.text_input(key="patch_corrupt").set_value("Rome is in the city of")
    _button(at, "Patch every layer and position").click().run()
    assert any("same number of tokens" in e.value for e in at.error)
    assert state_of(at.session_state).whatif.patching is found  # the last result stays


def test_hosted_patching_prompts_are_capped(monkeypatch):
    at = fresh(monkeypatch, hosted=True)
    at.run()
    at.switch_page(PAGE).run()
    long = "The Eiffel Tower is in the city of Paris, and the river that runs through it is"
    at.text_input(key="patch_clean").set_value(long)
    at.text_input(key="patch_corrupt").set_value(long.replace("Eiffel Tower", "Colosseum"))
    _button(at, "Patch every layer and position").click().run()
    assert not at.exception
    assert any("up to 16" in e.value for e in at.error), [e.value for e in at.error]
