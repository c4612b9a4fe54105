"""forward_work counts the embedding explicitly: tied (one table, read whole by the LM head) and
untied (the LM head a separate weight read every step, the input table looked up one row per
token) — checked against the model's own parameter tensors, summed independently of ModelSpec."""

from __future__ import annotations

import pytest
import torch

from engine.spec import spec_from_model
from engine.timing.roofline import forward_work


def _tiny(tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=tied)
    return LlamaForCausalLM(config).eval()


def _independent(model, new_tokens: int, cached: int) -> tuple[int, int]:
    """(FLOPs, bytes) from the named tensors: every weight but the input table in full, the
    input table one row per new token (tied: the LM head reads it whole anyway)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    embed, head = params["model.embed_tokens.weight"], params["lm_head.weight"]
    tied = embed.data_ptr() == head.data_ptr()
    body = [p for name, p in params.items()
            if name not in ("model.embed_tokens.weight", "lm_head.weight")]
    body_bytes = sum(p.nbytes for p in body)
    row = embed.shape[1] * embed.element_size()
    read = body_bytes + head.nbytes + (0 if tied else new_tokens * row)
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4 * (cached + new_tokens)
    seen = sum(cached + i for i in range(1, new_tokens + 1))
    attention = 4 * c.num_hidden_layers * c.num_attention_heads * head_dim * seen
    flops = 2 * sum(p.numel() for p in body) * new_tokens + 2 * head.numel() + attention
    return flops, read + kv


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("new_tokens, cached", [(1, 9), (5, 0)])
def test_forward_work_counts_the_embedding(tied, new_tokens, cached):
    model = _tiny(tied)
    spec = spec_from_model(model, "tiny")
    assert spec.tie_word_embeddings is tied
    work = forward_work(spec, new_tokens, cached)
    flops, moved = _independent(model, new_tokens, cached)
    assert work.flops == flops
    assert work.bytes == moved


def test_an_untied_head_is_a_weight_read_every_step():
    """Same shapes: the untied model reads one more vocab × hidden table per step (its LM head),
    minus the input table it only looks up — 1000 · 32 · 4 bytes less one row per token."""
    tied, untied = (spec_from_model(_tiny(t), "tiny") for t in (True, False))
    a, b = forward_work(tied, 1, 9), forward_work(untied, 1, 9)
    assert b.bytes - a.bytes == 32 * 4  # the looked-up row; the head table costs the same bytes
    assert untied.weight_bytes - tied.weight_bytes == 1000 * 32 * 4
    assert b.flops == a.flops  # the head is one matmul either way, the lookup no arithmetic
