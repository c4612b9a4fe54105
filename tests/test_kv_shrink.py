"""Shrinking the KV cache on the real default model (engine/kv/shrink): each method with its
budget at or past what the run holds equals the unmodified model (next-token probabilities
within 1e-4 at every position); below it, the bytes held are what the cache tensors hold and
match the formula for what each method keeps; the quality numbers move; the command line
prints the same numbers and refuses bad arguments in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.errors import InputError
from engine.forward import prepare_prompt
from engine.kv.shrink.budget import Budget, Shrink, parse_budget
from engine.kv.shrink.evict import snapkv_scores, window_scores
from engine.kv.shrink.latent import basis, full_rank, latent_bases
from engine.kv.shrink.run import shrink_runs, teacher_forced

PROMPT = "The capital of France is Paris. The capital of Japan is"


@pytest.fixture(scope="module")
def sequence(lm) -> tuple[list[int], int]:
    """A prompt and 12 tokens after it (any tokens: teacher forcing reads them as given)."""
    prompt = prepare_prompt(lm.tokenizer, PROMPT, True)
    follow = lm.tokenizer(" Tokyo. The capital of Italy is Rome, and")["input_ids"][:12]
    return prompt + follow, len(prompt)


@pytest.fixture(scope="module")
def dense(lm, sequence):
    ids, n = sequence
    return teacher_forced(lm, ids, n, None)


def max_probability_gap(a, b) -> float:
    return max(float((x.exp() - y.exp()).abs().max()) for x, y in zip(a.logps, b.logps))


@pytest.mark.parametrize("method, budget", [("latent", "100%"), ("topk", "100000"),
                                            ("indexer", "100000"), ("h2o", "100000"),
                                            ("snapkv", "100000"), ("window", "100000"),
                                            ("knorm", "100000")])
def test_a_budget_past_the_run_is_the_unmodified_model(lm, sequence, dense, method, budget):
    ids, n = sequence
    run = teacher_forced(lm, ids, n, Shrink(method, parse_budget(budget)), record_layer=3)
    assert len(run.logps) == len(dense.logps) == len(ids) - n + 1
    assert max_probability_gap(run, dense) <= 1e-4
    if method == "latent":  # at full rank the latent holds as many numbers as K and V
        assert run.kv_bytes[-1] == dense.kv_bytes[-1]


def test_the_full_rank_basis_is_orthogonal(lm):
    directions = latent_bases(lm)[0]
    assert directions.shape[1] == full_rank(lm) == 2 * 3 * 64
    for rank in (16, full_rank(lm)):
        u = basis(directions, rank)
        assert u.shape == (full_rank(lm), rank)
        assert torch.allclose(u.T @ u, torch.eye(rank), atol=1e-5)


def test_a_basis_past_what_the_calibration_spans_is_completed():
    directions = torch.linalg.qr(torch.randn(12, 5))[0].T  # 5 directions in 12 dimensions
    u = basis(directions, 9)
    assert u.shape == (12, 9) and torch.allclose(u.T @ u, torch.eye(9), atol=1e-5)
    assert torch.allclose(u[:, :5].abs(), directions.T.abs(), atol=1e-5)  # the found ones first


def test_bytes_held_are_the_tensors_and_the_formula(lm, sequence, dense):
    ids, n = sequence
    layers, kvh, d, f32 = lm.spec.layers, lm.spec.kv_heads, lm.spec.head_dim, 4
    positions = len(ids)  # the prompt and every token read after it
    assert dense.kv_bytes[-1] == 2 * layers * kvh * d * f32 * positions
    latent = teacher_forced(lm, ids, n, Shrink("latent", Budget(32.0)))
    assert latent.kv_bytes[-1] == layers * 32 * f32 * positions
    for method in ("h2o", "window"):  # hold the budget after every step
        run = teacher_forced(lm, ids, n, Shrink(method, Budget(8.0)))
        assert run.kv_bytes[-1] == 2 * layers * kvh * 8 * d * f32
        assert (run.read_bytes <= 2 * layers * kvh * 9 * d * f32).all()  # 8 held + the new one
    for method in ("snapkv", "knorm"):  # keep 8 of the prompt, add what follows
        run = teacher_forced(lm, ids, n, Shrink(method, Budget(8.0)))
        assert run.kv_bytes[-1] == 2 * layers * kvh * (8 + positions - n) * d * f32
    topk = teacher_forced(lm, ids, n, Shrink("topk", Budget(4.0)))
    assert topk.kv_bytes[-1] == dense.kv_bytes[-1]  # sparse attention reads less, holds all
    assert (topk.read_bytes < dense.read_bytes).all()


def test_small_budgets_change_the_distribution(lm, sequence):
    ids, n = sequence
    runs = list(shrink_runs(lm, ids, n, [Shrink("latent", Budget(8.0)),
                                         Shrink("h2o", Budget(6.0)),
                                         Shrink("topk", Budget(2.0))]))
    for run in runs:
        assert run.mean_kl > 1e-3
        assert run.kv_bytes[-1] <= run.dense_kv_bytes[-1]
        assert run.dense_ppl == pytest.approx(runs[0].dense_ppl)
    assert runs[0].kv_bytes[-1] < runs[0].dense_kv_bytes[-1] / 10


def test_sparse_rows_attend_to_k_keys(lm, sequence):
    ids, n = sequence
    run = teacher_forced(lm, ids, n, Shrink("topk", Budget(3.0)), record_layer=5)
    assert run.rows is not None and run.rows.shape[:2] == (len(ids) - n, lm.spec.heads)
    assert np.allclose(run.rows.sum(-1), 1.0, atol=1e-4)
    assert ((run.rows > 0).sum(-1) <= 3).all()


def test_evicted_rows_show_each_kept_position(lm, sequence):
    ids, n = sequence
    run = teacher_forced(lm, ids, n, Shrink("window", Budget(6.0)), record_layer=2)
    last = run.rows[-1]  # (H, positions): 4 sinks, the 2 newest held and the token read
    held = np.flatnonzero(last.sum(0) > 0)
    assert set(held) == set(range(4)) | set(range(len(ids) - 3, len(ids)))


def test_snapkv_keeps_its_window_and_window_keeps_sinks():
    weights = torch.softmax(torch.randn(1, 4, 3, 10), -1)  # 4 heads, 3 window queries, 10 keys
    scores = snapkv_scores(weights, kv_heads=2)
    assert scores.shape == (1, 2, 10)
    assert (scores[..., -3:] == scores[..., :-3].max() + 1).all()
    kept = window_scores(torch.zeros(1, 2, 10, 4), kept=6)
    assert kept[0, 0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 1, 1]


@pytest.mark.parametrize("text", ["abc", "0", "-3", "150%", "0%", "nan%", ""])
def test_bad_budgets_are_refused(text):
    with pytest.raises(InputError):
        parse_budget(text)


def test_budgets_read_as_counts():
    assert parse_budget("full").full and parse_budget("25%").of(10) == 3
    assert parse_budget("64").of(10) == 10 and parse_budget("64").of(100) == 64


def test_the_command_prints_each_pair(engine_cli, lm):
    done = engine_cli("kv-shrink", "Name three colours.", "--method", "latent", "h2o",
                      "--budget", "25%", "full", "--max-new-tokens", "6", "--json")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["method"], r["budget"]) for r in rows] == [
        ("latent", "25%"), ("latent", "full"), ("h2o", "25%"), ("h2o", "full")]
    for r in rows:
        for key in ("kv_bytes", "dense_kv_bytes", "kl", "top1_agreement", "ppl", "dense_ppl",
                    "decode_ms"):
            assert key in r
    assert rows[1]["kl"] == 0 and rows[1]["kv_bytes"] == rows[1]["dense_kv_bytes"]
    assert rows[0]["kv_bytes"] == pytest.approx(rows[0]["dense_kv_bytes"] / 4, rel=0.01)


def test_the_held_out_text_and_a_run_give_the_same_numbers_as_the_library(engine_cli, lm):
    """A point of the page's chart from the command line: the same tokens, the same numbers."""
    from engine.kv.shrink.run import held_out_sequence

    done = engine_cli("kv-shrink", "--held-out", "--method", "h2o", "--budget", "16", "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    ids, n = held_out_sequence(lm)
    (run,) = shrink_runs(lm, ids, n, [Shrink("h2o", Budget(16.0))], source="held-out")
    mine = run.summary()
    for key in ("source", "kv_bytes", "dense_kv_bytes", "read_bytes_per_step", "kl",
                "top1_agreement", "ppl", "dense_ppl", "positions", "prompt_tokens"):
        assert printed[key] == mine[key], key
    assert printed["source"] == "held-out" and printed["positions"] == 97


@pytest.mark.parametrize("args", [["--method", "latent", "--budget", "abc"],
                                  ["--method", "nope", "--budget", "8"],
                                  ["--method", "topk", "--budget", "0"],
                                  ["--method", "h2o", "--budget", "8", "--max-new-tokens", "0"],
                                  ["--method", "h2o"], ["--held-out", "--method", "h2o", "--budget", "8"],
                                  ["--needle", "64", "--lengths", "64"],
                                  ["--needle", "8", "--method", "h2o", "--budget", "8"],
                                  ["--lengths", "64", "--method", "h2o", "--budget", "8"]])
def test_bad_arguments_exit_2_with_one_line(engine_cli, args):
    done = engine_cli("kv-shrink", "Hi", *args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_the_needle_sits_at_its_depth_and_a_small_window_loses_it(lm, engine_cli):
    from engine.kv.shrink.needle import NEEDLE, haystack, needle_probe

    prompt, answer = haystack(lm, 300, 0.5)
    text = lm.tokenizer.decode(prompt)
    at = text.index(NEEDLE)
    assert 0.35 < at / len(text) < 0.65 and lm.tokenizer.decode(answer).strip() == "4817"
    found = needle_probe(lm, [Shrink("window", Budget(16.0))], 300, 0.5)
    assert [(r.method, r.found) for r in found] == [(None, True), ("window", False)]
    assert found[1].kv_bytes < found[0].kv_bytes and found[1].answer_logprob < found[0].answer_logprob
    done = engine_cli("kv-shrink", "--needle", "300", "--depth", "0.5", "--method", "window",
                      "--budget", "16", "--json")
    assert done.returncode == 0, done.stderr
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(p["method"], p["found"], p["kv_bytes"]) for p in printed] == [
        ("unmodified", True, found[0].kv_bytes), ("window", False, found[1].kv_bytes)]
    assert printed[1]["answer_logprob"] == pytest.approx(found[1].answer_logprob, abs=1e-3)


def test_long_context_points_grow_by_the_formula(lm, engine_cli):
    from engine.kv.shrink.needle import long_context, per_token_growth

    points = long_context(lm, [64, 128])
    assert [p.tokens for p in points] == [64, 128]
    per_token = 2 * lm.spec.layers * lm.spec.kv_heads * lm.spec.head_dim * 4
    assert all(p.kv_bytes == per_token * p.tokens for p in points)
    assert per_token_growth(points) == pytest.approx(per_token)
    done = engine_cli("kv-shrink", "--lengths", "64", "128", "--json")
    assert done.returncode == 0, done.stderr
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(p["tokens"], p["kv_bytes"]) for p in printed] == [(64, per_token * 64),
                                                               (128, per_token * 128)]
    assert all(p["ttft_ms"] > 0 and p["itl_ms"] > 0 for p in printed)
    assert all(p.ttft_ms > 0 and p.itl_ms > 0 for p in points)


def test_the_delay_rule_marks_a_stretch_other_work_took():
    from engine.clock import MachineSample
    from engine.kv.shrink.run import delayed_between

    before = MachineSample(0.0, 0.0, (1000, 2000), 100)
    busy = MachineSample(1000.0, 400.0, (1180, 2200), 140)  # others: 140 of 200 ticks; us 20 %
    quiet = MachineSample(1000.0, 1900.0, (1195, 2200), 290)  # us: 95 % of 2 threads
    assert delayed_between(before, busy, 2) is True
    assert delayed_between(before, quiet, 2) is False
    assert delayed_between(before, MachineSample(1000.0, 0.0, None, None), 2) is None
