"""Weight variants and the GGUF grid on the real default model (SmolLM2-135M from a Q4_1 GGUF)."""

from __future__ import annotations

import pytest
import torch

from engine.quant import VARIANT_NAMES
from engine.quant.apply import apply_variant
from engine.quant.calculator import format_bits, llama_param_count
from engine.quant.gguf_grid import embedding_grids, linear_grids
from engine.quant.kmix import K_VARIANTS, tensor_types
from engine.quant.kquants import BLOCKS
from engine.quant.variants import decoder_linears

# Decoder Linear weights of SmolLM2-135M: 30 layers × (2·576·576 + 2·576·192 + 3·576·1536).
LINEAR_PARAMS = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)


def test_parameter_count_from_the_config_matches_the_tensors(lm):
    s = lm.spec
    assert llama_param_count(s.hidden_size, s.intermediate_size, s.layers, s.heads, s.kv_heads,
                             s.head_dim, s.vocab_size, s.tie_word_embeddings) == s.param_count


# q4_k_m stands for the K-quant mixes (its types cover q4_k's and q6_k's; test_quant_tiny.py
# measures all three): a copy of the real model costs seconds each
@pytest.mark.parametrize("name", [n for n in VARIANT_NAMES
                                  if not n.startswith("awq_") and n not in ("q4_k", "q6_k")])
def test_variant_bytes_measured_equal_the_formula(lm, name):
    model, report = apply_variant(lm, name)
    del model
    assert report.quantized_params == LINEAR_PARAMS
    assert report.other_params + report.embedding_params == lm.spec.param_count - LINEAR_PARAMS
    assert report.embedding_params == lm.spec.vocab_size * lm.spec.hidden_size  # tied: once
    assert report.nbytes == report.formula_bytes
    quantized = report.code_bytes + report.group_bytes
    in_features = lm.spec.hidden_size
    if name in ("fp32", "fp16", "bf16"):
        assert report.group_bytes == 0 and quantized == LINEAR_PARAMS * format_bits(name) / 8
    elif name == "int8":  # one float16 scale per output row: Σ out over the Linears
        rows = sum(m.weight.shape[0] for _, m in decoder_linears(lm.model))
        assert report.group_bytes == 2 * rows and report.code_bytes == LINEAR_PARAMS
    elif name in K_VARIANTS:  # each Linear as the blocks of its own GGML type
        params = dict(lm.model.named_parameters())
        assert quantized == sum(params[n].numel() // BLOCKS[t][0] * BLOCKS[t][1]
                                for n, t in tensor_types(name, lm.model).items() if ".layers." in n)
        assert report.embedding_bytes == report.embedding_params // 32 * 34  # Q8_0
    else:  # every row splits into groups of 32: the calculator's bits per weight, exactly
        assert quantized == LINEAR_PARAMS * format_bits(name, in_features) / 8
    if name == "fp32":  # and the whole copy is what the spec counts from the loaded tensors
        assert report.nbytes == lm.spec.weight_bytes


def test_the_shared_model_is_untouched(lm):
    q_proj = lm.model.model.layers[0].self_attn.q_proj.weight
    embed = lm.model.get_input_embeddings().weight
    before = (q_proj.detach().clone(), embed[:1000].detach().clone(), q_proj.data_ptr())
    model, _ = apply_variant(lm, "q2")
    assert torch.equal(q_proj, before[0]) and torch.equal(embed[:1000], before[1])
    assert lm.model.model.layers[0].self_attn.q_proj.weight.data_ptr() == before[2]
    assert not torch.equal(model.model.layers[0].self_attn.q_proj.weight, before[0])


def test_the_gguf_weights_lie_on_their_files_q4_1_grid(lm):
    """Re-quantizing to Q4_1 with the file's groups of 32 rebuilds the weights bit for bit;
    Q4_0, groups of 64 and 3 bits move them by a sizeable part of a step."""
    checks = {c.grid: c for c in linear_grids(lm.model, layers=[0, lm.spec.layers - 1])}
    own = checks["q4_1"]
    assert own.tensors == 14 and own.max_abs_error <= 1e-6 and own.exact_fraction > 0.999
    for other in ("q4_0", "4-bit + min (group 64)", "q3"):
        assert checks[other].max_abs_error > 0.1 * own.mean_step, (other, checks[other])
        assert checks[other].exact_fraction < 0.9


def test_the_gguf_embedding_lies_on_its_q8_0_grid(lm):
    checks = {c.grid: c for c in embedding_grids(lm.model)}
    assert checks["q8_0"].max_abs_error <= 1e-6
    assert checks["int8 (group 64)"].max_abs_error > 0.1 * checks["q8_0"].mean_step
