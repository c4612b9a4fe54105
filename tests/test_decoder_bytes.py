"""A run decoded by the native step on packed low-bit weights reads those bytes, not the float32
tensors' — the roofline, the story's notice and the HTML report say so (traces since format 4)."""

from __future__ import annotations

from dataclasses import replace

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
