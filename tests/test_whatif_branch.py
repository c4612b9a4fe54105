"""A branch is a recorded run: its tokens equal transformers' own greedy generate() from the
prompt, the kept prefix and the chosen token; it reuses its parent's cached positions; it can be
branched again; its trace file keeps where it came from, and a file that lies about it is
refused."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
import torch

from engine.errors import InputError, TraceFormatError
from engine.files import read_trace_file
from engine.records.tracefile import trace_to_bytes
from engine.runner import Run
from engine.whatif.branch import branch, greedy_settings, run_snapshot

PROMPT = "Name three fruits."
N = 12


@pytest.fixture(scope="module")
def parent(lm):
    settings = replace(greedy_settings(N, True), record_attention=True, attention_layers=(0, 5),
                       decoder="native")  # a branch may then run on the native step
    return Run(lm, PROMPT, settings).run_all()


def _generate(lm, ids: list[int], new: int) -> tuple[int, ...]:
    with torch.inference_mode():
        out = lm.model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False)
    return tuple(out[0, len(ids):].tolist())


def test_a_branch_reuses_the_prefix_and_equals_a_fresh_generate(lm, parent):
    snapshot, _ = run_snapshot(lm, parent)
    p, out = len(parent.prompt_token_ids), parent.output_token_ids
    assert snapshot.positions == p + len(out) - 1
    at = 2
    token = int(parent.steps[at].top_ids[1])  # the runner-up candidate
    found = branch(lm, parent, at, token, snapshot)
    trace, b = found.trace, found.trace.branch
    tokens = trace.output_token_ids
    assert tokens[:at] == out[:at] and tokens[at] == token and b.parent_tokens == out
    assert b.reused_tokens == p + at and b.computed_tokens == len(tokens) - at - 1
    assert b.same_as_rerun and b.branch_ms > 0 and b.rerun_ms > 0
    fresh = _generate(lm, [*parent.prompt_token_ids, *out[:at], token], N - at - 1)
    assert tokens[at + 1:] == fresh[:len(tokens) - at - 1]
    point = trace.steps[at]  # the parent's distribution, the runner-up chosen
    assert point.chosen_rank == 1 and point.chosen_prob == pytest.approx(
        float(parent.steps[at].top_probs[1]))
    assert trace.steps[at + 1].attention.shape == (2, lm.spec.heads, 1, p + at + 1)
    assert snapshot.positions == p + len(out) - 1  # the parent's cache is not changed
    assert found.snapshot.positions == p + len(tokens) - 1
    with pytest.raises(InputError):
        branch(lm, parent, at, out[at], snapshot)  # the token the run chose


def test_a_branch_of_a_branch_and_a_token_outside_the_top_k(lm, parent):
    snapshot, _ = run_snapshot(lm, parent)
    first = branch(lm, parent, 1, int(parent.steps[1].top_ids[2]), snapshot)
    at, token = 4, 1000  # a typed token: its probability from the whole distribution
    assert token not in first.trace.steps[at].top_ids.tolist()
    second = branch(lm, first.trace, at, token, first.snapshot)
    ids = [*parent.prompt_token_ids, *first.trace.output_token_ids[:at]]
    with torch.inference_mode():
        probs = torch.softmax(lm.model(torch.tensor([ids])).logits[0, -1].float(), -1)
    step = second.trace.steps[at]
    assert step.chosen_prob == pytest.approx(float(probs[token]), abs=1e-5)
    assert step.chosen_rank == int((probs > probs[token]).sum())
    assert second.trace.branch.computed_tokens == len(second.trace.steps) - at  # + that forward
    tokens = second.trace.output_token_ids
    assert tokens[:at] == first.trace.output_token_ids[:at]
    fresh = _generate(lm, [*ids, token], N - at - 1)
    assert tokens[at + 1:] == fresh[:len(tokens) - at - 1]


def test_a_branch_file_keeps_its_origin_and_a_forged_one_is_refused(lm, parent):
    snapshot, _ = run_snapshot(lm, parent)
    found = branch(lm, parent, 1, int(parent.steps[1].top_ids[1]), snapshot).trace
    back = read_trace_file(io.BytesIO(trace_to_bytes(found))).trace
    assert back.branch == found.branch and back.output_token_ids == found.output_token_ids
    for forged in (replace(found.branch, token=found.branch.parent_tokens[0]),
                   replace(found.branch, at=len(found.steps)),
                   replace(found.branch, parent_tokens=(5,) + found.branch.parent_tokens[1:]),
                   replace(found.branch, reused_tokens=10**6)):
        with pytest.raises(TraceFormatError):
            read_trace_file(io.BytesIO(trace_to_bytes(replace(found, branch=forged))))


def test_on_the_native_step_a_branch_loads_the_reused_positions_and_matches_torch(lm, parent):
    from engine.models import native_decoder

    native = native_decoder(lm, max_tokens=128)
    snapshot, _ = run_snapshot(lm, parent)
    at, token = 3, int(parent.steps[3].top_ids[1])
    in_torch = branch(lm, parent, at, token, snapshot)
    native_run = branch(lm, parent, at, token, snapshot, native=native)
    trace, b = native_run.trace, native_run.trace.branch
    assert trace.decoder.name == "native" and in_torch.trace.decoder.name == "torch"
    assert trace.output_token_ids == in_torch.trace.output_token_ids and b.same_as_rerun
    assert b.reused_tokens == len(parent.prompt_token_ids) + at
    own, ref = native_run.snapshot, in_torch.snapshot  # copied out of the shared native cache
    assert own.positions == ref.positions
    assert max(float((x - y).abs().max()) for x, y in zip(own.keys, ref.keys)) < 1e-3
    step = trace.steps[at + 1]  # recorded by the native step as any run's step
    assert step.attention.shape == (2, lm.spec.heads, 1, len(parent.prompt_token_ids) + at + 1)
