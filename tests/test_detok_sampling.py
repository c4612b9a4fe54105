"""Incremental detokenization on the real tokenizer, and sampling filters against transformers'."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from engine.detok import IncrementalDetokenizer
from engine.sampling import choose_token, filter_logits

TEXTS = [
    "Hello 🌍 world 😀👍🏽 and 👨‍👩‍👧",
    "中文字符和日本語のテキスト、한국어",
    "Mixed: naïve café – “quotes” … العربية עברית",
    "tabs\tand\nnewlines  double  spaces",
]


@pytest.mark.parametrize("text", TEXTS)
def test_stream_never_shows_broken_characters(lm, text):
    tok = lm.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(i) for i in ids]
    deltas.append(detok.flush())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)
    assert "".join(deltas) == text
    if any(ord(c) > 0x2FFF for c in text):
        assert "" in deltas[:-1], "some multi-token characters must be held back"


def test_special_tokens_are_not_printed(lm):
    tok = lm.tokenizer
    detok = IncrementalDetokenizer(tok)
    out = detok.push(tok("Hi")["input_ids"][0]) + detok.push(tok.eos_token_id) + detok.flush()
    assert out == "Hi"


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.5), (20, 0.9), (0, 1.0)])
def test_filters_match_transformers(top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(1000) * 3
    ours = filter_logits(logits, 0.7, top_k, top_p)
    ref = logits[None] / 0.7
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1:
        ref = TopPLogitsWarper(top_p)(None, ref)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref[0]))
    kept = ~torch.isinf(ours)
    torch.testing.assert_close(ours[kept], ref[0][kept])


def test_greedy_is_argmax_and_sampling_is_seeded():
    logits = torch.tensor([0.1, 3.0, 0.2, 2.9])
    assert choose_token(logits, 0.0, 0, 1.0, None) == 1
    draws = [choose_token(logits, 1.0, 0, 1.0, torch.Generator().manual_seed(s)) for s in range(40)]
    again = [choose_token(logits, 1.0, 0, 1.0, torch.Generator().manual_seed(s)) for s in range(40)]
    assert draws == again and {1, 3} <= set(draws)
    assert all(choose_token(logits, 1.0, 1, 1.0, torch.Generator().manual_seed(s)) == 1
               for s in range(10))


def test_a_batchs_greedy_choices_equal_each_rows_own():
    """engine.sampling.greedy_choices (a server's batch, all rows at once) gives each row what
    choose_token at temperature 0 and top_choices give it alone — ties included (argmax takes
    the first of equal maxima)."""
    from engine.sampling import greedy_choices, top_choices

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 500, generator=generator)
    logits[2, 7] = logits[2, 300] = logits[2].max() + 1.0  # a tie for the top
    logits[4, :] = 0.5  # every token equal
    for row, batched in zip(logits, greedy_choices(logits, 10)):
        token = choose_token(row, 0.0, 0, 1.0, None)
        alone = top_choices(torch.softmax(row.float(), dim=-1), token, 10)
        assert (batched.token, batched.prob, batched.rank) == (alone.token, alone.prob, alone.rank)
        assert batched.top_probs.tolist() == alone.top_probs.tolist()
        assert sorted(batched.top_ids.tolist()) == sorted(alone.top_ids.tolist()) \
            if batched.top_probs[0] == batched.top_probs[-1] else \
            batched.top_ids.tolist() == alone.top_ids.tolist()
    assert greedy_choices(logits, 10)[2].token == 7
