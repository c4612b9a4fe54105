"""`python -m engine story FILE` and `compare A B`: the story's lines and the comparison, from the
shell, equal to what the pages compute; bad files exit 2 with one line."""

from __future__ import annotations

import json

import pytest

from engine.__main__ import main
from engine.files import load_trace
from engine.lens import cost_notice, notice
from engine.lens.compare import metric_rows, token_diff
from engine.records.examples import EXAMPLES_DIR

QA, SAMPLED = EXAMPLES_DIR / "qa.npz", EXAMPLES_DIR / "sampled.npz"


def test_story_prints_each_stage_line_of_the_trace(capsys):
    assert main(["story", str(QA)]) == 0
    lines = capsys.readouterr().out.splitlines()
    trace = load_trace(QA)
    assert len(lines) == 8
    assert lines[0].endswith(notice.tokens_notice(trace).text)
    assert lines[5].endswith(cost_notice.phase_notice(trace).text)
    assert lines[6].endswith(cost_notice.kv_notice(trace).text)


def test_compare_prints_the_first_difference_and_the_metrics(capsys):
    assert main(["compare", str(QA), str(SAMPLED)]) == 0
    out = json.loads(capsys.readouterr().out)
    a, b = load_trace(QA), load_trace(SAMPLED)
    diff = token_diff(a, b)
    assert out["first_different_prompt_token"] == diff.prompt is not None
    assert out["first_different_answer_token"] == diff.answer
    assert [m["a"] for m in out["metrics"]] == [r.a for r in metric_rows(a, b)]
    assert "temperature" in out["settings_that_differ"]
    assert main(["compare", str(QA), str(QA)]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["settings_that_differ"] == {} and same["first_different_answer_token"] is None


@pytest.mark.parametrize("args", [["story", "/nonexistent.npz"], ["compare", str(QA), "README.md"]])
def test_a_bad_file_exits_2_with_one_line(args, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1
