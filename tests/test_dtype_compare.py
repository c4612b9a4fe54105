"""fp32 / fp16 / bf16 decode side by side: structure, interleaving, and token agreement."""

from __future__ import annotations

import pytest
import torch

from engine.errors import InputError
from engine.timing.dtype_compare import DTYPES, cast_copy, compare_dtypes


def test_cast_copy_casts_without_touching_the_original(tiny_lm):
    model = tiny_lm.model
    half = cast_copy(model, torch.float16)
    assert {p.dtype for p in half.parameters()} == {torch.float16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # shared model untouched
    assert half.lm_head.weight is half.model.embed_tokens.weight  # still tied: one tensor
    same = cast_copy(model, torch.float32)  # its own dtype: shared storage, no copy
    assert same.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()


def test_compare_dtypes_structure_and_agreement(tiny_lm):
    ids = tiny_lm.tokenizer("The quick brown fox")["input_ids"]
    said: list[str] = []
    result = compare_dtypes(tiny_lm, ids, new_tokens=4, rounds=2,
                            say=lambda text, _f: said.append(text))
    assert [r.dtype for r in result.runs] == list(DTYPES)
    assert result.rounds == 2 and result.new_tokens == 4 and result.prompt_tokens == len(ids)
    assert result.source_dtype == "float32"
    fp32 = result.run("float32")
    assert fp32.ratio == 1.0 and fp32.same_tokens  # float32 against itself, every round
    for run in result.runs:
        assert len(run.round_ms) == 2 and all(ms > 0 for ms in run.round_ms)
        assert run.itl_ms == pytest.approx(sum(run.round_ms) / 2)  # median of two
        assert run.ratio == pytest.approx(run.itl_ms / fp32.itl_ms)
        assert len(run.tokens) == 4
        assert run.same_tokens == (run.tokens == fp32.tokens)
    # interleaved: round 1 starts with float32, round 2 with the next dtype (rotation)
    starts = [t for t in said if t.endswith("…")]
    assert starts[:3] == [f"Round 1 of 2: {d}…" for d in DTYPES]
    assert starts[3:6] == [f"Round 2 of 2: {d}…" for d in DTYPES[1:] + DTYPES[:1]]


def test_compare_dtypes_stops_after_a_round(tiny_lm):
    ids = tiny_lm.tokenizer("Hi")["input_ids"]
    result = compare_dtypes(tiny_lm, ids, new_tokens=3, rounds=5, dtypes=("float32",),
                            stop=lambda: True)
    assert result.rounds == 1 and [r.dtype for r in result.runs] == ["float32"]
    assert result.run("float32").same_tokens
    with pytest.raises(InputError):
        compare_dtypes(tiny_lm, ids, dtypes=("int3",))
