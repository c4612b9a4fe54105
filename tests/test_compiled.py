"""Compiled decode: same greedy tokens and logits as the eager step, clear errors, honest figures."""

from __future__ import annotations

import pytest
import torch

from engine.errors import EngineError, InputError
from engine.kernels.compiled import CompiledDecoder, DecodeComparison, compare_decode, compile_problem
from engine.timing.roofline import Work, forward_work


@pytest.fixture
def tiny_decoder(tiny_lm):
    return CompiledDecoder(tiny_lm, max_tokens=64)


@pytest.mark.compile
def test_compiled_decode_matches_eager_and_generate(tiny_lm, tiny_decoder):
    prompt = [1, 415, 2936, 9060, 285]
    result = compare_decode(tiny_decoder, prompt, new_tokens=12, rounds=2)
    reference = tiny_lm.model.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12,
                                       do_sample=False)
    assert result.same_tokens
    assert list(result.tokens) == reference[0, len(prompt):].tolist()
    assert result.compile_s > 0 and tiny_decoder.compiled
    assert result.eager_itl_ms > 0 and result.compiled_itl_ms > 0
    assert result.work == forward_work(tiny_lm.spec, 1, len(prompt) + 6 - 1)
    again = compare_decode(tiny_decoder, prompt, new_tokens=4, rounds=1)
    assert again.compile_s == 0.0 and again.tokens == result.tokens[:4]


@pytest.mark.compile
def test_compiled_logits_match_eager_logits(tiny_decoder):
    prompt = [1, 100, 200, 300]
    with torch.inference_mode():
        logits = {}
        for compiled in (False, True):
            tiny_decoder.greedy(prompt, 2, compiled)  # fills the cache: prompt + 1 token
            token = torch.tensor([[7]])
            logits[compiled] = tiny_decoder._call(token, compiled).clone()
    torch.testing.assert_close(logits[True], logits[False], atol=1e-4, rtol=1e-4)


def test_comparison_rejects_what_does_not_fit(tiny_decoder):
    with pytest.raises(InputError, match="static cache of 64"):
        tiny_decoder.greedy(list(range(60)), 8, compiled=False)
    with pytest.raises(InputError):
        compare_decode(tiny_decoder, [1, 2], new_tokens=1)


def test_missing_compiler_is_a_clear_error(tiny_lm, monkeypatch):
    monkeypatch.setattr("engine.kernels.compiled.shutil.which", lambda _name: None)
    assert "C++ compiler" in compile_problem(torch.device("cpu"))
    assert compile_problem(torch.device("cuda")) is None
    with pytest.raises(EngineError, match="C\\+\\+ compiler"):
        CompiledDecoder(tiny_lm, max_tokens=16).compile([1, 2])


def test_comparison_speedup_and_validation():
    c = DecodeComparison(4, 8, 1, 90.0, 30.0, 1.0, True, (1, 2), Work(1e9, 5e8), 15.0)
    assert c.speedup("compiled") == pytest.approx(3.0)
    assert c.speedup("native C") == pytest.approx(6.0)
    assert list(c.steps) == ["eager", "compiled", "native C"]
    assert list(DecodeComparison(4, 8, 1, 90.0, None, 0.0, True, (1, 2), Work(1e9, 5e8)).steps) \
        == ["eager"]
    with pytest.raises(ValueError):
        DecodeComparison(4, 8, 1, 0.0, 30.0, 1.0, True, (1, 2), Work(1e9, 5e8))
    with pytest.raises(ValueError):
        DecodeComparison(4, 8, 1, 90.0, 30.0, 1.0, True, (1, 2), Work(1e9, 5e8), -1.0)


@pytest.mark.compile
def test_two_models_of_one_shape_keep_their_own_compiled_weights(tiny_lm):
    """Frozen weights are constants of the compiled graph: a second model with the same shapes
    must not run on the first one's weights."""
    from dataclasses import replace

    from transformers import LlamaForCausalLM

    torch.manual_seed(1)
    other = LlamaForCausalLM(tiny_lm.model.config).eval()
    other.requires_grad_(False)
    prompt = [1, 100, 200, 300]
    for lm in (tiny_lm, replace(tiny_lm, model=other), tiny_lm):
        decoder = CompiledDecoder(lm, max_tokens=64)
        with torch.inference_mode():
            logits = {}
            for compiled in (False, True):
                decoder.greedy(prompt, 2, compiled)
                logits[compiled] = decoder._call(torch.tensor([[7]]), compiled).clone()
        torch.testing.assert_close(logits[True], logits[False], atol=1e-4, rtol=1e-4)


@pytest.mark.compile
def test_a_replaced_decoder_refuses_to_run_compiled(tiny_decoder, tiny_lm):
    prompt = [1, 2, 3]
    tiny_decoder.compile(prompt)
    assert tiny_decoder.compiled
    newer = CompiledDecoder(tiny_lm, max_tokens=64)
    assert not tiny_decoder.compiled and not newer.compiled
    with pytest.raises(EngineError, match="newer compiled decoder"):
        tiny_decoder.greedy(prompt, 3, compiled=True)
    assert tiny_decoder.greedy(prompt, 3, compiled=False)[0] == newer.greedy(prompt, 3, True)[0]


@pytest.mark.compile
@pytest.mark.real_model
def test_timing_page_compiles_and_compares_decode(tiny_lm, monkeypatch):
    """The timing page's real button path, with the shared decoders swapped for ones over the
    tiny model (a real torch.compile in seconds, not minutes). Here, after the tests above, not in
    tests/test_app.py: a process pays once for its first torch.compile's start."""
    from engine.kernels.native import NativeDecoder
    from tests.test_app import fresh, generate, kernel_table_checks, with_decoders

    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "0")
    at = generate(fresh().run(), "Name a colour.", tokens=4)
    with_decoders(at, lambda: CompiledDecoder(tiny_lm, max_tokens=256),
                  lambda: NativeDecoder(tiny_lm, max_tokens=256))
    at.switch_page("pages/timing.py").run()
    next(b for b in at.button if b.label.startswith("Measure")).click().run()
    next(b for b in at.button if b.label == "Compile and compare").click().run()
    kernel_table_checks(at, ["eager", "compiled", "native C"])
