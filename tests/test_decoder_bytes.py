"""A run decoded by the native step on packed low-bit weights reads those bytes, not the float32
tensors' — the roofline, the story's notice and the HTML report say so (traces since format 4);
so does a run on a GGUF file's own blocks, named GGUF rather than the fp32 its record says."""

from __future__ import annotations

from dataclasses import replace

import pytest

from charts.report import _model
from engine.files import load_trace
from engine.lens.cost_notice import phase_notice
from engine.records.examples import examples
from engine.records.trace import DecoderUsed
from engine.timing.roofline import step_work

Q4 = DecoderUsed("native", None, "q4_0", 89_941_248)


def test_native_decode_steps_read_the_packed_weights():
    old = replace(load_trace(examples()[0].path), decoder=None)  # as before traces named it
    q4 = replace(old, decoder=Q4)
    torch_run = replace(old, decoder=DecoderUsed("torch", "asked for", "q4_0", 538_060_032))
    step = old.decode_steps[2]
    kv = old.model.kv_bytes_per_token * step.context_len
    assert step_work(q4, step).bytes == Q4.weight_bytes + kv
    assert step_work(old, step).bytes == step_work(torch_run, step).bytes > 5 * Q4.weight_bytes
    assert step_work(q4, old.steps[0]).bytes == step_work(old, old.steps[0]).bytes  # prefill: torch
    assert step_work(q4, step).flops == step_work(old, step).flops


def test_the_story_and_the_report_name_the_packed_weights():
    old = replace(load_trace(examples()[0].path), decoder=None)  # as before traces named it
    q4 = replace(old, decoder=Q4)
    assert "85.8 MiB of weights (the native step's packed q4_0 weights" in phase_notice(q4).text
    assert "× 4 B" in phase_notice(old).text
    assert "native C step; q4_0 weights, 85.8 MiB read (89,941,248 B)" in _model(q4)
    assert "Decode steps" not in _model(old)


def test_a_gguf_files_own_blocks_are_counted_as_stored_and_named_gguf_not_fp32():
    """A model opened from a GGUF runs on the file's blocks, and its trace records the weights as
    loaded (fp32) with the file's bytes in its spec (SmolLM2's Q4_1 file: 96,576,768 B for
    134,515,008 weights, 5.74 bits each): the story, the roofline and the report count those."""
    from engine.lens.weights_notice import bits_label, run_weights, weights_notice
    from engine.timing.roofline import forward_work

    old = load_trace(examples()[0].path)
    assert old.model.stored_bits is None  # float32 weights: 4 bytes each
    spec = replace(old.model, name="SmolLM2-135M-Instruct.Q4_1.gguf", weight_bytes=96_576_768)
    bits = 8 * 96_576_768 / spec.param_count
    assert spec.stored_bits == bits and round(bits, 2) == 5.74
    native = replace(old, model=spec, decoder=DecoderUsed("native", None, "fp32", 96_436_224))
    torch_run = replace(native, decoder=DecoderUsed("torch", "asked for", "fp32", 96_576_768))
    assert run_weights(native) == run_weights(torch_run) == "GGUF" and run_weights(old) == "fp32"
    fact = weights_notice(native)
    assert fact.formats == ("fp32", "fp16", "int8", "q4_0", "GGUF") and fact.other == "fp32"
    assert fact.bytes_of("GGUF") == 96_576_768  # tied: a step reads every stored weight
    assert bits_label(spec, "GGUF") == "GGUF · 5.74 bits"
    assert "decode on GGUF weights: each step read 92 MiB" in fact.text
    assert "stored as fp32 the same step would read 513 MiB, 5.6× more" in fact.text
    assert "(the GGUF file's own blocks, measured)" in phase_notice(native).text
    assert "92.1 MiB of weights (the GGUF file's own blocks, 5.74 bits per weight)" in phase_notice(
        torch_run).text
    assert "native C step; GGUF weights" in _model(native)
    assert "file&#x27;s own blocks, 92.1 MiB (96,576,768 B): 5.74 bits per weight" in _model(native)
    untied = replace(spec, tie_word_embeddings=False)  # the input table: one row looked up
    table = spec.vocab_size * spec.hidden_size
    assert forward_work(untied, 1, 0, kv_cache=False).bytes == pytest.approx(
        96_576_768 - (table - spec.hidden_size) * bits / 8)
