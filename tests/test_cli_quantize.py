"""`python -m engine quantize`: bad arguments exit 2 with one line before any model loads; on the
real model the study's table reaches stdout and its record (JSON) reads back."""

from __future__ import annotations

import pytest

from engine.__main__ import main


@pytest.mark.parametrize("args, says", [
    (["--weights", "q5"], "unknown weights variant 'q5'"),
    (["--weights", ","], "unknown weights variant"),
    (["--new-tokens", "1"], "new tokens must be between 2"),
    (["--out", "/no/such/folder/study.json"], "no such folder"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, args, says):
    with pytest.raises(SystemExit) as done:
        code = main(["quantize", *args])
        raise SystemExit(code)
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


@pytest.mark.real_model
def test_a_study_prints_its_table_and_writes_its_record(tmp_path, capsys, cli_uses_lm):
    from engine.quant.study_record import study_from_json

    out = tmp_path / "study.json"
    assert main(["quantize", "--weights", "fp32,q4_1", "--new-tokens", "2", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].startswith("variant") and "q4_1" in table
    study = study_from_json(out.read_text())
    assert [v.name for v in study.variants] == ["fp32", "q4_1"]
    assert study.variants[1].kl_mean == pytest.approx(0, abs=1e-6)  # the file's own Q4_1 grid
