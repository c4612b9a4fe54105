"""The weight-bytes calculator: the explainer's 7B table exactly, scale overhead per group size,
parameter counts from a config (no model needed)."""

from __future__ import annotations

import pytest

from engine.quant.calculator import (
    cited_models,
    explainer_table,
    format_bits,
    group_overhead,
    ideal_bytes,
    llama_param_count,
    model_weights,
    stored_bytes,
)

LLAMA2_7B = dict(hidden=4096, intermediate=11008, layers=32, heads=32, kv_heads=32, head_dim=128,
                 vocab=32000, tied_embeddings=False)  # its config.json (assets/kv_models.json link)


def test_the_explainers_7b_table_exactly():
    assert explainer_table(7e9) == [("fp32", 28.0), ("fp16", 14.0), ("int8", 7.0), ("int4", 3.5)]


def test_ideal_bytes_is_params_times_bits_over_8():
    assert ideal_bytes(1000, 4) == 500
    assert ideal_bytes(135e6, 16) == 270e6
    with pytest.raises(ValueError):
        ideal_bytes(-1, 4)


def test_scale_overhead_per_group_size_in_bits_per_weight():
    rows = {r.group: (r.scale_only_bits, r.with_zero_bits) for r in group_overhead()}
    assert rows == {16: (1.0, 2.0), 32: (0.5, 1.0), 64: (0.25, 0.5), 128: (0.125, 0.25)}
    g32 = group_overhead((32,))[0]
    assert g32.bits_per_weight(4, zero_point=False) == 4.5  # Q4_0
    assert g32.bits_per_weight(4, zero_point=True) == 5.0  # Q4_1


def test_format_bits_include_the_scales():
    assert format_bits("fp32") == 32 and format_bits("bf16") == 16
    assert format_bits("q4_0") == 4.5 and format_bits("q4_1") == 5.0
    assert format_bits("q3") == 4.0 and format_bits("q2") == 3.0
    assert format_bits("int8", in_features=4096) == 8 + 16 / 4096
    assert stored_bytes(7e9, "q4_0") == 7e9 * 4.5 / 8
    with pytest.raises(ValueError, match="in_features"):
        format_bits("int8")
    with pytest.raises(ValueError, match="unknown"):
        format_bits("q5_k")


def test_llama_2_7b_parameters_from_its_config():
    assert llama_param_count(**LLAMA2_7B) == 6_738_415_616  # the published count


def test_a_cited_config_with_a_given_parameter_count():
    rows = cited_models({"Llama-2-7B": 6_738_415_616})
    assert [r.name for r in rows] == ["Llama-2-7B"]
    gb = rows[0].gigabytes
    assert gb["fp32"] == 6_738_415_616 * 4 / 1e9 and gb["fp16"] == 6_738_415_616 * 2 / 1e9
    assert gb["q4_0"] == 6_738_415_616 * 4.5 / 8 / 1e9
    assert "huggingface.co/meta-llama/Llama-2-7b-hf" in rows[0].source


def test_int8_per_channel_needs_the_row_length_for_its_scales():
    plain = model_weights("x", 7_000_000_000)
    per_row = model_weights("x", 7_000_000_000, in_features=4096)
    assert plain.gigabytes["int8"] == 7.0
    assert per_row.gigabytes["int8"] == pytest.approx(7.0 * (1 + 2 / 4096))
