"""What if (engine/whatif/) on the real default model, each against an implementation that does
not share its code path: a branch against transformers' generate(), head ablation against
zeroed o_proj columns (weight surgery) and plain hooks, patching against single-position hooks
on an unbatched forward. The CLI's JSON documents have the issue's keys."""

from __future__ import annotations

import json

import pytest
import torch

from engine.__main__ import main
from engine.forward import prepare_prompt
from engine.whatif.ablate import Ablation, ablate, ablated, head_sweep, next_token_probs
from engine.whatif.branch import greedy_settings
from engine.whatif.patch import layer_inputs, patch_grid, patched_logits

CLEAN, CORRUPT = "The Eiffel Tower is in the city of", "The Colosseum is in the city of"
PROB_TOL = 1e-4


def raw(lm, text: str) -> list[int]:
    return prepare_prompt(lm.tokenizer, text, False)


def _zeroed_columns(lm, layer: int, heads: tuple[int, ...], ids) -> torch.Tensor:
    """Head ablation by weight surgery: o_proj's columns of those heads set to 0, then restored."""
    d = lm.spec.head_dim
    w = lm.model.model.layers[layer].self_attn.o_proj.weight  # (hidden, H · d)
    kept = w.detach().clone()
    try:
        with torch.no_grad():
            for h in heads:
                w[:, h * d:(h + 1) * d] = 0
        return next_token_probs(lm, ids)
    finally:
        with torch.no_grad():
            w.copy_(kept)


def test_head_and_mlp_ablation_match_independent_references(lm):
    ids = raw(lm, CLEAN)
    found = ablate(lm, CLEAN, Ablation(5, (1, 3)), greedy_settings(4, False), new_tokens=4)
    reference = _zeroed_columns(lm, 5, (1, 3), ids)
    assert (found.ablated - reference).abs().max() < PROB_TOL
    first = found.ablated_run.steps[0]  # the recorded ablated run: the same distribution
    assert first.token_id == int(reference.argmax()) and len(found.ablated_tokens) == 4
    assert abs(first.top_probs[0] - float(reference.max())) < PROB_TOL
    assert (found.baseline - next_token_probs(lm, ids)).abs().max() < PROB_TOL
    assert found.kl > 0
    down = lm.model.model.layers[7].mlp.down_proj.weight
    kept = down.detach().clone()
    try:
        with torch.no_grad():
            down.zero_()  # the MLP's output is 0 exactly
        reference = next_token_probs(lm, ids)
    finally:
        with torch.no_grad():
            down.copy_(kept)
    with ablated(lm, Ablation(7, mlp=True)):
        assert (next_token_probs(lm, ids) - reference).abs().max() < PROB_TOL


def test_mean_ablation_matches_a_plain_hook(lm):
    ids = raw(lm, CLEAN)
    d, layer, head = lm.spec.head_dim, 3, 4
    o_proj = lm.model.model.layers[layer].self_attn.o_proj
    seen = []
    hook = o_proj.register_forward_hook(lambda m, args, out: seen.append(args[0][0]))
    next_token_probs(lm, ids)
    hook.remove()
    mean = seen[0][:, head * d:(head + 1) * d].mean(0)  # (d,)

    def put(module, args):
        z = args[0].clone()
        z[..., head * d:(head + 1) * d] = mean
        return (z,)

    hook = o_proj.register_forward_pre_hook(put)
    try:
        reference = next_token_probs(lm, ids)
    finally:
        hook.remove()
    with ablated(lm, Ablation(layer, (head,), mean=True), ids):
        assert (next_token_probs(lm, ids) - reference).abs().max() < PROB_TOL


def test_ablating_nothing_is_the_baseline_and_the_sweep_is_each_head_alone(lm):
    ids = raw(lm, CLEAN)
    with ablated(lm, Ablation(4)):
        assert torch.equal(next_token_probs(lm, ids), next_token_probs(lm, ids))
    base = next_token_probs(lm, ids).double()
    sweep = head_sweep(lm, ids, [2])
    assert torch.isnan(torch.from_numpy(sweep[3])).all()
    for head in (0, 6):
        q = _zeroed_columns(lm, 2, (head,), ids).double()
        kl = float((base * (base.log() - q.log())).sum())
        assert sweep[2, head] == pytest.approx(kl, abs=PROB_TOL)


def test_patching_matches_single_position_hooks_and_layer_0_everywhere_is_clean(lm):
    clean, corrupt = raw(lm, CLEAN), raw(lm, CORRUPT)
    found = patch_grid(lm, clean, corrupt)
    assert found.logit_diff.shape == (lm.spec.layers, len(corrupt))
    assert found.clean_diff > 0 > found.corrupt_diff  # " Paris" vs " Rome"
    inputs = []
    hooks = [layer.register_forward_pre_hook(lambda m, args: inputs.append(args[0][0].clone()))
             for layer in lm.model.model.layers]  # transformers passes hidden_states first
    next_token_probs(lm, clean)
    for hook in hooks:
        hook.remove()
    for layer, pos in ((0, 2), (12, 3), (25, 8)):
        def put(module, args, layer=layer, pos=pos):
            h = args[0].clone()
            h[0, pos] = inputs[layer][pos]
            return (h, *args[1:])

        hook = lm.model.model.layers[layer].register_forward_pre_hook(put)
        try:
            with torch.inference_mode():
                logits = lm.model(input_ids=torch.tensor([corrupt])).logits[0, -1]
        finally:
            hook.remove()
        expected = float(logits[found.clean_token] - logits[found.corrupt_token])
        assert found.logit_diff[layer, pos] == pytest.approx(expected, abs=PROB_TOL * 10)
    clean_in, clean_logits = layer_inputs(lm, clean)
    one_each = torch.eye(len(corrupt), dtype=torch.bool)
    for layer in (0, 1, 14, lm.spec.layers - 1):  # the grid starts at `layer`; a full forward here
        last = patched_logits(lm, corrupt, layer, clean_in[layer], one_each)
        full = (last[:, found.clean_token] - last[:, found.corrupt_token]).numpy()
        assert abs(found.logit_diff[layer] - full).max() < PROB_TOL
    everywhere = patched_logits(lm, corrupt, 0, clean_in[0], torch.ones(1, len(corrupt), dtype=bool))
    assert (everywhere[0] - clean_logits).abs().max() < PROB_TOL * 10
    assert found.normalized[0, 0] == pytest.approx(0.0, abs=1e-6)  # "The": the same in both


def test_the_cli_documents(cli_uses_lm, capsys):
    assert main(["branch", "Name three fruits.", "--at", "1", "--token", "42",
                 "--max-new-tokens", "6", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["branch"][:1] == doc["original"][:1] and doc["branch"][1] == 42
    assert {"original", "branch", "reused_tokens", "computed_tokens"} <= set(doc)
    assert main(["ablate", CLEAN, "--layer", "5", "--heads", "1,3", "--raw", "--max-new-tokens",
                 "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["baseline"]["top"]) == 10 and {"id", "prob"} == set(doc["ablated"]["top"][0])
    assert doc["kl"] > 0 and isinstance(doc["baseline"]["text"], str)
    assert main(["patch", "Paris is in", "Rome is in", "--raw", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["logit_diff"]) == 30 and len(doc["logit_diff"][0]) == len(doc["tokens"]) == 3
    assert main(["patch", CLEAN, "Rome is", "--raw"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "same number of tokens" in err[0]
    assert main(["ablate", CLEAN, "--layer", "3"]) == 2
