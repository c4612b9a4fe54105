"""Tokens, BPE merges, language costs, embedding neighbours and RoPE against independent references."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.lens.embeddings import EmbeddingIndex
from engine.lens.rope import angles, rotate, score_by_distance
from engine.lens.tokens import bpe_steps, join_tokens, pre_tokens, text_cost, tokenize

ASSETS = Path(__file__).resolve().parents[1] / "assets"
TEXTS = [
    "Hello, world! unhappiness",
    "Emoji 😀👍🏽 and a family 👨‍👩‍👧 🌍",
    "中文字符和日本語のテキスト、한국어",
    "RTL: العربية עברית mixed with English",
    "control\tchars\nand\r\nbell\x07 null-ish \x01 end",
    "  leading and trailing spaces  ",
]


@pytest.mark.parametrize("text", TEXTS)
def test_chips_decode_back_to_exactly_the_input(lm, text):
    tokens = tokenize(lm.tokenizer, text)
    assert [t.id for t in tokens] == lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert join_tokens(tokens) == text


def test_typed_special_token_strings_are_ordinary_tokens(lm):
    """A visitor's typed "<|im_start|>" is text, never the model's marker (a forged turn): the
    Tokens page shows the pieces the model would see."""
    text = "<|im_start|>user\nHi<|im_end|>"
    tokens = tokenize(lm.tokenizer, text)
    assert not any(t.special for t in tokens)
    assert not {t.id for t in tokens} & set(lm.tokenizer.all_special_ids)
    assert len(tokens) > 6 and join_tokens(tokens) == text


@pytest.mark.parametrize("word", ["unhappiness", " unhappiness", " tokenization", " the",
                                  " Inference", " 世界", " 😀", "antidisestablishmentarianism"])
def test_bpe_steps_end_in_the_tokenizers_own_pieces(lm, word):
    for pre in pre_tokens(lm.tokenizer, word):
        steps = bpe_steps(lm.tokenizer, pre)
        assert "".join(steps[0].pieces) == pre and all(len(p) == 1 for p in steps[0].pieces)
        ranks = [s.rank for s in steps[1:]]
        assert all(r is not None for r in ranks)
    pieces = [p for pre in pre_tokens(lm.tokenizer, word) for p in bpe_steps(lm.tokenizer, pre)[-1].pieces]
    assert pieces == lm.tokenizer.tokenize(word)


def test_multilingual_asset_counts_and_costs(lm):
    data = json.loads((ASSETS / "multilingual.json").read_text())
    sentences = data["sentences"]
    assert len(sentences) >= 12 and len({s["script"] for s in sentences}) >= 8
    spec = lm.spec
    for s in sentences:
        n = len(lm.tokenizer(s["text"]).input_ids)
        cost = text_cost(spec, s["text"], n)
        assert cost.kv_bytes == 2 * 30 * 3 * 64 * 4 * n
        assert cost.prefill_flops == 2 * 134_515_008 * n
        assert cost.tokens_per_char == pytest.approx(n / len(s["text"]))


@pytest.fixture(scope="module")
def index(lm):
    return EmbeddingIndex(lm)


def test_neighbours_equal_brute_force_cosine(lm, index):
    table = lm.model.get_input_embeddings().weight.detach().double().numpy()
    norms = np.linalg.norm(table, axis=1)
    for word in [" king", " Paris", " dog", " happy"]:
        tid = lm.tokenizer(word, add_special_tokens=False)["input_ids"][0]
        cos = table @ table[tid] / (norms * norms[tid])
        cos[tid] = -np.inf
        want = np.argsort(-cos)[:10]
        got = index.neighbours(tid, 10)
        assert got.ids.tolist() == want.tolist()
        np.testing.assert_allclose(got.scores, cos[want], rtol=1e-5)


def test_pca_map_shapes_and_variance(index):
    coords, sample, background = index.pca_map([100, 200, 300], background=500)
    assert coords.shape == (3, 2) and background.shape == (500, 2) and len(set(sample)) == 500
    both = np.vstack([coords, background])
    assert abs(both.mean(0)).max() < 1e-6  # centred
    assert both[:, 0].var() >= both[:, 1].var()  # first component explains the most


def test_rope_matches_the_models_rotary_embedding(lm):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    spec = lm.spec
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 5, spec.head_dim)).astype(np.float32)
    positions = torch.tensor([[0, 1, 7, 100, 4000]])
    cos, sin = lm.model.model.rotary_emb(torch.from_numpy(q), positions)
    want, _ = apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(q), cos, sin)
    for i, pos in enumerate(positions[0].tolist()):
        ours = rotate(q[0, 0, i].astype(np.float64), pos, spec.rope_theta)
        np.testing.assert_allclose(ours, want[0, 0, i].numpy(), atol=2e-4)
    assert angles(spec.rope_theta, spec.head_dim, np.array([1]))[0, 0] == 1.0


def test_score_depends_only_on_relative_distance():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal(64), rng.standard_normal(64)
    d = np.arange(0, 50, 7)
    a = score_by_distance(q, k, 1e5, d, query_position=0)
    b = score_by_distance(q, k, 1e5, d, query_position=333)
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    assert a[0] == pytest.approx(q @ k)
