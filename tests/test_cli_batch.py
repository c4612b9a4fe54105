"""`python -m engine batch`: one line and exit 2 for bad arguments; a real run's JSON and record."""

import json
import os
import subprocess
import sys

import pytest

from engine.serving.servingfile import load_serving

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True,
                          env=ENV, timeout=600)


@pytest.mark.parametrize("args, says", [
    (["batch"], "PROMPT"),
    (["batch", "hi", "--max-batch", "0"], "at least 1"),
    (["batch", "hi", "--scheduler", "fifo"], "invalid choice"),
    (["batch", "hi", "--block-size", "5000"], "block size"),
    (["batch", "  "], "empty"),
    (["batch", "hi", "--arrival", "poisson", "--rate", "-1"], "rate"),
    (["batch", "hi", "--out", "/no/such/folder/x.json"], "no such folder"),
])
def test_bad_arguments_exit_2_with_one_line(args, says, engine_cli):
    done = engine_cli(*args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in done.stderr


def test_a_real_batch_prints_the_json_shape_and_writes_a_record(lm, tmp_path):
    out = tmp_path / "stream.json"
    done = cli("batch", "Hi there", "What is the capital of France?", "--max-new-tokens", "5",
               "--block-size", "8", "--json", "--out", str(out))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert set(data) == {"requests", "steps", "throughput_tok_s"}
    first = data["requests"][0]
    assert {"prompt", "prompt_token_ids", "output_token_ids", "ttft_ms", "itl_ms",
            "queue_ms"} <= set(first)
    assert len(first["output_token_ids"]) <= 5 and len(first["itl_ms"]) == len(first["output_token_ids"]) - 1
    assert data["steps"][0]["batch_size"] == 2 and data["throughput_tok_s"] > 0
    assert data["requests"][1]["cached_tokens"] > 0  # the chat template's system turn, shared
    run = load_serving(out.read_bytes())
    assert [list(r.token_ids) for r in run.requests] == [r["output_token_ids"] for r in data["requests"]]


@pytest.mark.parametrize("args, says", [
    (["together", "hi", "  "], "empty"),
    (["together", "hi", "--out-dir", "/no/such/folder"], "no such folder"),
    (["together", "hi", "--max-batch", "0"], "at least 1"),
])
def test_together_refuses_bad_arguments_in_one_line(args, says, engine_cli):
    done = engine_cli(*args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in done.stderr


def test_together_records_each_run_decoded_in_one_batch_equal_to_its_solo_run(lm, tmp_path,
                                                                             engine_cli):
    """`python -m engine together`: the hosted demo's batching from the shell — each prompt's
    own trace, its steps shared with the others', its tokens those of its run alone."""
    from engine.files import load_trace
    from engine.runner import Run
    from engine.settings import GenerationSettings

    prompts = ["Describe three fruits.", "Describe three rivers.", "What is the capital of France?"]
    (tmp_path / "together-2.npz").write_bytes(b"keep")
    done = engine_cli("together", *prompts, "--max-new-tokens", "6", "--out-dir", str(tmp_path))
    assert done.returncode == 2 and "exists" in done.stderr  # never over a file without --force
    assert (tmp_path / "together-2.npz").read_bytes() == b"keep"
    done = engine_cli("together", *prompts, "--max-new-tokens", "6", "--json",
                      "--out-dir", str(tmp_path), "--force")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert max(b for r in rows for b in r["batches"]) == 3  # the three shared a forward
    for prompt, row, i in zip(prompts, rows, range(1, 4)):
        alone = Run(lm, prompt, GenerationSettings(max_new_tokens=6)).run_all()
        trace = load_trace(tmp_path / f"together-{i}.npz")
        assert row["decoder"] == trace.decoder.name == "batched" and row["prompt"] == prompt
        assert row["output_token_ids"] == list(trace.output_token_ids) \
            == list(alone.output_token_ids)
        assert [s.batch for s in trace.steps] == row["batches"]
        assert len(row["itl_ms"]) == len(row["batches"]) - 1 and row["ttft_ms"] > 0
