"""A speculative run as a Trace (engine/serving/speculative_trace.py), the file's speculation
record (format 5) and `python -m engine run --speculate` / `show`: the tokens are plain greedy's,
the recorded distributions are the model's own, the times say what they are, the record adds up
(and a file whose record does not is refused), older files still load."""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import threading
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine import GenerationSettings, Run, generate_trace, load_trace
from engine.__main__ import main
from engine.errors import TraceFormatError
from engine.files import read_trace_file
from engine.records.trace import traces_equal
from engine.records.tracefile import FORMAT_VERSION, META_KEY, trace_to_bytes
from engine.serving.speculative import REWRITE_PROMPT, speculative_generate
from engine.serving.speculative_trace import SpeculativeRun
from engine.timing.metrics import summarize

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 32
SETTINGS = GenerationSettings(max_new_tokens=NEW_TOKENS)


@pytest.fixture(scope="module")
def spec_trace(lm):
    return SpeculativeRun(lm, REWRITE_PROMPT, SETTINGS).run_all()


def test_the_trace_holds_plain_greedy_tokens_and_the_models_own_distribution(lm, spec_trace):
    """Against the runner's plain torch run: same tokens, same top-k and probabilities (read
    from the verify forward's row, not from a one-token forward: equal up to float noise)."""
    plain = Run(lm, REWRITE_PROMPT, replace(SETTINGS, decoder="torch", record_attention=False,
                                            record_hidden=False)).run_all()
    assert spec_trace.output_token_ids == plain.output_token_ids
    assert spec_trace.output_text == plain.output_text
    ids = list(spec_trace.prompt_token_ids)
    assert spec_trace.output_token_ids == speculative_generate(lm, ids, NEW_TOKENS).token_ids
    for mine, theirs in zip(spec_trace.steps, plain.steps):
        np.testing.assert_array_equal(mine.top_ids[:3], theirs.top_ids[:3])
        np.testing.assert_allclose(mine.top_probs, theirs.top_probs, atol=1e-4)
        assert mine.chosen_rank == 0 and mine.kv_bytes == theirs.kv_bytes  # measured, same bytes
    assert spec_trace.speculation.accepted > NEW_TOKENS / 2  # the rewrite sample pays


def test_times_say_what_they_are(spec_trace):
    """A forward's first token carries it; the tokens that came with it carry only their own
    bookkeeping and no forward time; together they add up to the run."""
    spec, steps = spec_trace.speculation, spec_trace.steps
    first = spec.first_of_step(len(steps))
    assert sum(first) == 1 + spec.verify_steps
    starts = [s for s, f in zip(steps, first) if f]
    assert spec_trace.decode_forwards == tuple(starts[1:])
    assert all(s.forward_ms > 0 for s in spec_trace.decode_forwards)
    for step, verify_ms in zip(starts[1:], spec.step_ms):
        assert step.latency_ms >= verify_ms >= step.forward_ms > 0
    extras = [s for s, f in zip(steps, first) if not f]
    assert extras and all(s.forward_ms == 0 and 0 < s.latency_ms for s in extras)
    assert max(s.latency_ms for s in extras) < min(s.latency_ms for s in starts)
    summary = summarize(spec_trace)
    decode_ms = sum(s.latency_ms for s in steps[1:])
    assert summary.decode_tokens_per_s == pytest.approx((len(steps) - 1) / decode_ms * 1000)
    assert spec_trace.token_times_ms[-1] == pytest.approx(spec_trace.tokenize_ms + sum(
        s.latency_ms for s in steps))
    assert spec_trace.attention_layers == () and all(s.attention is None for s in steps)
    assert not spec_trace.settings.record_attention and not spec_trace.settings.record_hidden


def test_round_trip_keeps_the_speculation(spec_trace, tmp_path):
    back = load_trace(trace_to_bytes(spec_trace))
    assert traces_equal(back, spec_trace) and back.speculation == spec_trace.speculation
    assert back.decoder.name == "torch" and "speculative" in back.decoder.reason


def _meta_rewritten(data: bytes, change) -> bytes:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        parts = {i.filename: archive.read(i) for i in archive.infolist()}
    meta = json.loads(np.load(io.BytesIO(parts[META_KEY + ".npy"])).tobytes())
    change(meta)
    out = io.BytesIO()
    np.savez_compressed(out, **{name.removesuffix(".npy"): np.load(io.BytesIO(raw))
                                for name, raw in parts.items() if name != META_KEY + ".npy"},
                        **{META_KEY: np.frombuffer(json.dumps(meta).encode(), np.uint8)})
    return out.getvalue()


def test_a_version_4_file_still_loads(tiny_lm):
    trace = generate_trace(tiny_lm, "hello there", GenerationSettings(max_new_tokens=4))
    assert FORMAT_VERSION == 8 and trace.speculation is None

    def as_version_4(meta):
        meta["version"] = 4
        del meta["speculation"], meta["branch"]

    back = read_trace_file(_meta_rewritten(trace_to_bytes(trace), as_version_4)).trace
    unnormed = replace(trace, steps=tuple(replace(s, hidden=None) for s in trace.steps))
    assert traces_equal(back, unnormed) and back.speculation is None  # hidden: see version 6


def _set_speculation(key, value):
    return lambda meta: meta["speculation"].__setitem__(key, value)


def _one_more_verify_step(meta):
    """A well-formed verify step that no token in the steps belongs to."""
    for key, value in (("step_proposed", 0), ("step_accepted", 0), ("step_tokens", 1),
                       ("step_ms", 1.0)):
        meta["speculation"][key].append(value)


def _extra_forward(meta):
    flags = [s["forward_ms"] for s in meta["steps"]]
    meta["steps"][flags.index(0.0)]["forward_ms"] = 1e-9  # any forward time on a token that came along


@pytest.mark.parametrize("change, message", [
    (lambda meta: meta["speculation"]["step_tokens"].__setitem__(
        0, meta["speculation"]["step_accepted"][0] + 2), "emit"),
    (lambda meta: meta["speculation"]["step_accepted"].__setitem__(0, 9), "accepted"),
    (lambda meta: meta["speculation"]["step_ms"].pop(), "differ in length"),
    (_set_speculation("method", "medusa"), "unknown speculation method"),
    (_set_speculation("draft_tokens", 0), "draft_tokens"),
    (_set_speculation("extra", 1), "other fields"),
    (_one_more_verify_step, "add up"),
    (_extra_forward, "forward time must be 0"),
    (lambda meta: meta["settings"].update(temperature=0.7), "greedy"),
])
def test_a_record_that_does_not_add_up_is_refused(spec_trace, change, message):
    data = _meta_rewritten(trace_to_bytes(spec_trace), change)
    with pytest.raises(TraceFormatError, match=message):
        load_trace(data)


def test_stop_keeps_whole_verify_steps(lm):
    stop = threading.Event()
    run = SpeculativeRun(lm, REWRITE_PROMPT, SETTINGS, stop_event=stop)
    partial_counts = []
    for step in run:
        partial = load_trace(trace_to_bytes(run.trace()))  # valid at every point
        partial_counts.append(len(partial.steps))
        if step.index >= 6:
            stop.set()
    trace = run.trace()
    assert trace.stop_reason == "stopped" and 7 <= len(trace.steps) < NEW_TOKENS
    assert len(trace.steps) == 1 + sum(trace.speculation.step_tokens)
    assert partial_counts == sorted(partial_counts) and partial_counts[-1] == len(trace.steps)
    assert load_trace(trace_to_bytes(trace)).stop_reason == "stopped"


@pytest.mark.parametrize("args, message", [
    (["run", "hi", "--speculate", "unknown"], "invalid choice"),
    (["run", "hi", "--speculate", "prompt-lookup", "--draft-tokens", "0"], "draft tokens"),
    (["run", "hi", "--speculate", "prompt-lookup", "--ngram", "0"], "n-gram"),
    (["run", "hi", "--speculate", "prompt-lookup", "--temperature", "0.7"], "greedily"),
    (["run", "hi", "--speculate", "prompt-lookup", "--no-kv-cache"], "KV cache"),
    (["run", "hi", "--draft-tokens", "3"], "need --speculate"),
])
def test_bad_speculation_arguments_exit_2_with_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(main(args))
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines


@pytest.mark.real_model
def test_cli_run_speculate_and_show(tmp_path, capsys):
    out = tmp_path / "spec.npz"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "engine", "run", REWRITE_PROMPT,
                             "--speculate", "prompt-lookup", "--draft-tokens", "5",
                             "--max-new-tokens", "24", "--out", str(out)],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "attention and hidden states are not recorded" in result.stderr
    assert "decoder: torch eager — speculative decoding" in result.stderr
    assert "speculation  prompt-lookup, up to 5 drafts" in result.stdout
    assert "ITL percentiles are arrival gaps" in result.stdout
    assert main(["show", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    block = doc["speculation"]
    assert list(block)[:5] == ["method", "draft_tokens", "accepted", "proposed", "verify_steps"]
    assert block["method"] == "prompt-lookup" and block["draft_tokens"] == 5
    assert len(doc["output_token_ids"]) == 1 + block["verify_steps"] + block["accepted"] \
        - (block["step_tokens"][-1] == block["step_accepted"][-1])
    assert sum(block["drafted"]) == block["accepted"] > 0
    assert 0 < block["accepted"] <= block["proposed"]


def test_show_json_of_an_ordinary_run_says_null(tiny_lm):
    from engine.__main__ import show_json

    trace = generate_trace(tiny_lm, "hello there", GenerationSettings(max_new_tokens=3))
    assert show_json(trace)["speculation"] is None


def test_per_forward_views_read_the_verify_forwards(spec_trace):
    """The roofline, the Prefill-vs-decode line and the weights line of a speculative trace use
    its verify forwards (scoring 1 + drafts positions), never the 0-ms tokens that came along."""
    from engine.lens.cost_notice import phase_notice
    from engine.lens.weights_notice import weights_notice
    from engine.timing.metrics import forward_median_ms
    from engine.timing.roofline import forward_work, step_work, trace_points, verify_positions

    spec = spec_trace.speculation
    forwards = spec_trace.decode_forwards
    assert len(forwards) == len(spec.step_ms)
    points = trace_points(spec_trace)
    assert points["decode (median step)"][1] > 1.0  # a whole forward, not a bookkeeping fraction
    first = forwards[0]
    assert verify_positions(spec_trace, first) == 1 + spec.step_proposed[0]
    one = forward_work(spec_trace.model, 1, first.context_len - 1)
    assert spec.step_proposed[0] > 0 and step_work(spec_trace, first).flops > one.flops
    median = forward_median_ms(spec_trace)
    assert median == pytest.approx(statistics.median(s.latency_ms for s in forwards))
    notice = phase_notice(spec_trace)
    assert notice.itl_median_ms == median and "per verify forward" in notice.text
    assert weights_notice(spec_trace).itl_median_ms == median
