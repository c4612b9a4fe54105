"""`python -m engine` end to end (real default model), and the latency metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import GenerationSettings, generate_trace, summarize
from engine.__main__ import main, show_json

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


@pytest.mark.real_model
def test_run_and_show_json(tmp_path):
    out = tmp_path / "t.npz"
    result = cli("run", "What is 2 + 2?", "--max-new-tokens", "8", "--out", str(out))
    assert result.returncode == 0, result.stderr
    for label in ("TTFT", "ITL p50/p90", "tokens/s", "KV cache", "text"):
        assert label in result.stdout
    shown = cli("show", str(out), "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["model"] == {"name": doc["model"]["name"], "layers": 30, "heads": 9, "kv_heads": 3,
                            "head_dim": 64, "dtype": "float32", "param_count": 134_515_008,
                            "weights": "fp32", "weight_bytes": doc["decoder"]["weight_bytes"]}
    assert doc["decoder"]["name"] == "native" and "decoder: native C step" in result.stderr
    assert len(doc["steps"]) == len(doc["output_token_ids"]) <= 8
    assert len(doc["itl_ms"]) == len(doc["steps"]) - 1
    assert doc["ttft_ms"] > 0 and doc["prompt_token_ids"]
    assert [s["token_id"] for s in doc["steps"]] == doc["output_token_ids"]
    assert "".join(s["token_text"] for s in doc["steps"]) == doc["output_text"]
    assert doc["steps"][0]["phase"] == "prefill"
    assert doc["steps"][-1]["kv_bytes"] == 46_080 * doc["steps"][-1]["context_len"]


@pytest.mark.parametrize("args, message", [
    (["run", ""], "prompt is empty"),
    (["run", "hi", "--max-new-tokens", "0"], "max new tokens"),
    (["run", "hi", "--max-new-tokens", "999999"], "max new tokens"),
    (["run", "hi", "--max-new-tokens", "ten"], "invalid int"),
    pytest.param(["run", "word " * 50, "--max-prompt-tokens", "10"], "limit is 10",
                 marks=pytest.mark.real_model),
    (["run", "hi", "--model", "nobody/no-such-model-xyz"], "cannot load model"),
    (["run", "hi", "--temperature", "-1"], "temperature"),
    (["show", "/dev/null"], "not a regular file"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_exit_2_with_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(main(args))
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines


def test_bad_argument_in_a_real_process_has_no_traceback(engine_cli):
    result = engine_cli("run", "hi", "--model", "./no/such/folder")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: model folder not found: ./no/such/folder"


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (the definition vLLM's numpy call uses)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def test_summary_matches_independent_computation(tiny_lm):
    trace = generate_trace(tiny_lm, "Count to ten.", GenerationSettings(max_new_tokens=12))
    lat = np.array([s.latency_ms for s in trace.steps])
    itl = lat[1:]
    ttft = trace.tokenize_ms + lat[0]
    e2e = trace.tokenize_ms + lat.sum()
    s = summarize(trace)
    assert s.ttft_ms == pytest.approx(ttft)
    assert s.itl_p50_ms == pytest.approx(_percentile(list(itl), 50))
    assert s.itl_p90_ms == pytest.approx(_percentile(list(itl), 90))
    assert s.itl_p99_ms == pytest.approx(_percentile(list(itl), 99))
    assert s.e2e_ms == pytest.approx(e2e)
    assert s.tpot_ms == pytest.approx((e2e - ttft) / (len(lat) - 1))
    assert s.decode_tokens_per_s == pytest.approx(len(itl) / itl.sum() * 1000)
    assert s.prefill_tokens_per_s == pytest.approx(len(trace.prompt_token_ids) / lat[0] * 1000)
    assert show_json(trace)["itl_ms"] == list(itl)
