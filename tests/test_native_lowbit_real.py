"""The native low-bit step on the real default model, against a transformers forward of the same
dequantized weights: logits at every step (1e-4) and greedy tokens equal to that model's
`generate`. Q4_1 packs the loaded model itself (its weights already lie on the GGUF's Q4_1 grid,
the LM head on Q8_0); Q4_0 and Q8_0 (GGML's blocks, re-laid) pack the variant's copy."""

from __future__ import annotations

import pytest
import torch

from engine.forward import prepare_prompt
from engine.kernels.native import NativeDecoder
from engine.quant.apply import apply_variant

PROMPT = "Name three colours and say why people like them."
N = 24


@pytest.fixture(scope="module", params=["q4_1", "q4_0", "q8_0"])
def decoder_and_reference(lm, request):
    name = request.param
    if name == "q4_1":
        reference = lm.model
    else:
        reference, _ = apply_variant(lm, name)
    from dataclasses import replace

    decoder = NativeDecoder(replace(lm, model=reference), max_tokens=128, weights=name)
    assert decoder.model is reference  # on the grid: packed losslessly, no second copy
    return name, decoder, reference


def test_logits_at_every_step_and_greedy_tokens_equal_the_dequantized_model(lm,
                                                                           decoder_and_reference):
    name, decoder, reference = decoder_and_reference
    ids = prepare_prompt(lm.tokenizer, PROMPT, True)
    expected = reference.generate(torch.tensor([ids]), max_new_tokens=N, min_new_tokens=N,
                                  do_sample=False)[0, len(ids):].tolist()
    tokens, _ = decoder.greedy(ids, N)
    assert tokens == expected, name
    sequence = list(ids)
    decoder.prefill(sequence)
    with torch.inference_mode():
        for i, token in enumerate(tokens[:8]):
            logits = decoder.step_logits(token, len(sequence)).clone()
            sequence.append(token)
            full = reference(input_ids=torch.tensor([sequence])).logits[0, -1]
            torch.testing.assert_close(logits, full, atol=1e-4, rtol=1e-4, msg=f"{name} step {i}")
