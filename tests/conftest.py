"""Shared fixtures: the real default model (parity tests) and a tiny random model (speed)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from engine.loader import LoadedModel, load_model  # noqa: E402
from engine.spec import spec_from_model  # noqa: E402


@pytest.fixture(scope="session")
def lm() -> LoadedModel:
    """SmolLM2-135M-Instruct, the app's real default model (converted once, then cached)."""
    return load_model()


@pytest.fixture(scope="session")
def tiny_lm(lm: LoadedModel) -> LoadedModel:
    """A 2-layer random-weight Llama (4 query heads, 2 KV heads) with the real tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(lm.tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    model.requires_grad_(False)
    model.generation_config.eos_token_id = 2
    return LoadedModel(model, lm.tokenizer, spec_from_model(model, "tiny-random-llama"), "tiny",
                       torch.device("cpu"), 0.0, False)


def eager_attentions(lm: LoadedModel, ids: list[int]) -> np.ndarray:
    """(L, H, S, S): transformers' eager attention with output_attentions over the whole sequence,
    the independent reference for every recorded weight. The model is set back to sdpa."""
    model = lm.model
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    finally:
        model.set_attn_implementation("sdpa")
    return torch.stack([a[0] for a in out.attentions]).float().numpy()
