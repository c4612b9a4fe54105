"""Speculative decoding (engine/serving/speculative.py): prompt-lookup drafts, verified in one
forward, give exactly plain greedy's tokens — checked against the runner's one-token loop and
against `model.generate` on the real model, where drafts pay and where they rarely do; the counts
add up; and two broken variants (one token too many accepted, the cache not cropped) are caught."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import DynamicCache

import engine.serving.speculative as speculative
from engine.errors import InputError
from engine.forward import prepare_prompt
from engine.serving.speculative import (
    FREE_PROMPT,
    REWRITE_PROMPT,
    accepted_drafts,
    compare_speculation,
    first_difference,
    lookup_draft,
    plain_greedy,
    speculative_generate,
)

NEW_TOKENS = 40


def _generate(lm, ids: list[int], n: int) -> tuple[int, ...]:
    """transformers' own greedy loop, the independent reference."""
    with torch.inference_mode():
        out = lm.model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return tuple(out[0, len(ids):].tolist())


def _consistent(result) -> None:
    """Every count in the record adds up to the tokens."""
    spec, n = result.speculation, len(result.token_ids)
    assert spec.verify_steps == len(spec.step_proposed) == len(spec.step_accepted)
    assert all(0 <= a <= p <= spec.draft_tokens for p, a in zip(spec.step_proposed,
                                                               spec.step_accepted))
    assert n == 1 + sum(spec.step_tokens)  # the prefill's token, then each verify step's
    ended_on_draft = spec.verify_steps and spec.step_tokens[-1] == spec.step_accepted[-1]
    assert n == 1 + spec.verify_steps + spec.accepted - bool(ended_on_draft)
    assert sum(result.drafted) == spec.accepted and len(result.drafted) == n
    assert not result.drafted[0]  # the prefill's token is the model's own
    assert len(spec.step_ms) == spec.verify_steps and all(ms > 0 for ms in spec.step_ms)


def test_lookup_takes_the_most_recent_longest_match():
    #          0  1  2  3  4  5  6  7  8  9 10
    context = [5, 6, 7, 1, 2, 9, 6, 7, 3, 4, 6, 7]
    # the last 3 tokens (4, 6, 7) never occurred before; the last 2 (6, 7) did, most recently at 6
    assert lookup_draft(context, 3, 2) == (3, 4)
    assert lookup_draft(context, 3, 10) == (3, 4, 6, 7)  # up to the end of the context
    assert lookup_draft([1, 2, 3, 9, 3], 3, 4) == (9, 3)  # only a 1-gram matches
    assert lookup_draft([1, 2, 3, 4], 3, 4) == ()  # nothing earlier: a plain step
    assert lookup_draft([7], 3, 4) == ()
    assert lookup_draft([8, 8], 3, 4) == (8,)  # the suffix itself is never its own match


def test_acceptance_rule_keeps_the_longest_agreeing_prefix():
    assert accepted_drafts((4, 5, 6), (4, 5, 6, 7)) == 3
    assert accepted_drafts((4, 5, 6), (4, 9, 6, 7)) == 1  # stops at the first disagreement
    assert accepted_drafts((4,), (3, 4)) == 0
    assert accepted_drafts((), (3,)) == 0


@pytest.fixture(scope="module")
def samples(lm):
    return {name: prepare_prompt(lm.tokenizer, prompt, True)
            for name, prompt in (("rewrite", REWRITE_PROMPT), ("free", FREE_PROMPT))}


@pytest.mark.parametrize("name", ["rewrite", "free"])
def test_speculative_equals_plain_greedy_and_generate(lm, samples, name):
    ids = samples[name]
    spec = speculative_generate(lm, ids, NEW_TOKENS)
    plain = plain_greedy(lm, ids, NEW_TOKENS)
    assert spec.token_ids == plain.token_ids, first_difference(spec.token_ids, plain.token_ids)
    assert spec.token_ids == _generate(lm, ids, NEW_TOKENS)
    assert len(spec.token_ids) == NEW_TOKENS and spec.stop_reason == "length"
    _consistent(spec)
    rate = spec.speculation.acceptance_rate
    if name == "rewrite":  # the answer copies the text: most drafts are the model's own tokens
        assert rate > 0.6 and spec.speculation.tokens_per_verify_step > 2.5
        assert spec.speculation.verify_steps < NEW_TOKENS / 2
    else:  # nothing in the prompt predicts the answer: drafts are rare and mostly rejected
        assert rate is None or rate < 0.3
        assert spec.speculation.tokens_per_verify_step < 1.5


MUTANT_TOKENS = 24


@pytest.fixture(scope="module")
def free_reference(lm, samples) -> tuple[int, ...]:
    """transformers' greedy tokens for the free-writing prompt: what both mutants must miss."""
    return _generate(lm, samples["free"], MUTANT_TOKENS)


def test_accepting_one_draft_too_many_breaks_equality(lm, samples, free_reference, monkeypatch):
    """The mutant the equality checks exist for: it keeps one rejected draft. On the prompt
    whose drafts are mostly rejected it must change the answer."""
    reference = free_reference
    real = speculative.accepted_drafts
    monkeypatch.setattr(speculative, "accepted_drafts",
                        lambda drafts, choice: min(len(drafts), real(drafts, choice) + 1))
    bad = speculative_generate(lm, samples["free"], MUTANT_TOKENS)
    assert first_difference(bad.token_ids, reference) is not None


def test_not_cropping_rejected_drafts_breaks_equality(lm, samples, free_reference, monkeypatch):
    """The other mutant: rejected drafts' K/V left in the cache shift every later position."""
    reference = free_reference
    monkeypatch.setattr(DynamicCache, "crop", lambda self, n: None)
    bad = speculative_generate(lm, samples["free"], MUTANT_TOKENS)
    assert first_difference(bad.token_ids, reference) is not None


def test_tiny_model_many_lengths_and_draft_sizes(tiny_lm):
    """Every draft width and length limit (a step may not overshoot max_new_tokens)."""
    ids = prepare_prompt(tiny_lm.tokenizer, "one two three one two three one two", True)
    for k in (1, 3, 8):
        for n in (1, 2, 7, 40):
            spec = speculative_generate(tiny_lm, ids, n, draft_tokens=k, ngram=2)
            assert spec.token_ids == plain_greedy(tiny_lm, ids, n).token_ids, (k, n)
            assert len(spec.token_ids) <= n
            _consistent(spec)


def test_stop_keeps_the_partial_result(tiny_lm):
    ids = prepare_prompt(tiny_lm.tokenizer, FREE_PROMPT, True)
    stop = threading.Event()
    stop.set()
    assert speculative_generate(tiny_lm, ids, 16, stop_event=stop).token_ids == ()
    calls = []
    real = speculative.lookup_draft

    def lookup_then_stop(*args):
        calls.append(1)
        if len(calls) == 3:
            stop.set()
        return real(*args)

    stop.clear()
    speculative.lookup_draft, saved = lookup_then_stop, real
    try:
        partial = speculative_generate(tiny_lm, ids, 40, stop_event=stop)
    finally:
        speculative.lookup_draft = saved
    assert partial.stop_reason == "stopped" and partial.speculation.verify_steps == 3
    full = speculative_generate(tiny_lm, ids, 40)
    assert full.token_ids[:len(partial.token_ids)] == partial.token_ids
    _consistent(partial)


def test_compare_measures_both_in_paired_rounds(tiny_lm):
    ids = prepare_prompt(tiny_lm.tokenizer, "one two three one two three one two", True)
    seen = []
    result = compare_speculation(tiny_lm, ids, 12, rounds=2, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert result.rounds == 2 and len(result.plain_ms) == len(result.speculative_ms) == 2
    assert result.equal and result.first_difference is None
    assert result.plain_token_ids == result.result.token_ids
    n = len(result.plain_token_ids)
    # rates from the median round's time (the median of two is their mean)
    assert result.plain_tokens_per_s == pytest.approx(n / (sum(result.plain_ms) / 2) * 1000)
    ratios = [(n / s) / (n / p) for p, s in zip(result.plain_ms, result.speculative_ms)]
    assert result.speedup == pytest.approx(sum(ratios) / 2)  # the median of two is their mean
    stop = threading.Event()
    stop.set()
    assert compare_speculation(tiny_lm, ids, 8, rounds=2, stop_event=stop).speedup is None


@pytest.mark.parametrize("kwargs, message", [
    ({"draft_tokens": 0}, "draft tokens"), ({"draft_tokens": 99}, "draft tokens"),
    ({"ngram": 0}, "n-gram"), ({"rounds": 0}, "rounds"),
])
def test_bad_options_are_one_sentence(tiny_lm, kwargs, message):
    with pytest.raises(InputError, match=message):
        compare_speculation(tiny_lm, [1, 2, 3], 4, **kwargs)
