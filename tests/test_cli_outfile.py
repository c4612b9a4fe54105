"""No silent overwrite (engine/outfile.py): a command never writes over its own input, replaces an
existing file only with --force, refuses in one line with exit status 2 leaving the file as it
was, and writes atomically (an interrupted write leaves the old file, and no half file)."""

from __future__ import annotations

import os
import shutil

import pytest

from charts import report
from engine.__main__ import main
from engine.errors import EngineError
from engine.outfile import OutFile
from engine.records.examples import EXAMPLES_DIR


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.fixture()
def trace(tmp_path):
    path = tmp_path / "qa.npz"
    shutil.copyfile(EXAMPLES_DIR / "sampled.npz", path)
    return path


@pytest.mark.parametrize("how", ["same path", "other spelling", "symlink", "hard link"])
def test_report_never_writes_over_its_own_trace(how, trace, capsys, monkeypatch):
    before = trace.read_bytes()
    out = {"same path": trace, "other spelling": trace.parent / "." / "qa.npz",
           "symlink": trace.parent / "link.html", "hard link": trace.parent / "hard.html"}[how]
    if how == "symlink":
        out.symlink_to(trace)
    if how == "hard link":
        os.link(trace, out)
    # --force does not lift it: a command's input is never its output
    assert report.main([str(trace), "-o", str(out), "--force"]) == 2
    assert "this command's input" in _one_line(capsys)
    assert trace.read_bytes() == before
    if how == "same path":  # the example, without --force, from a relative path
        monkeypatch.chdir(trace.parent)
        assert report.main(["qa.npz", "-o", "qa.npz"]) == 2
        assert "this command's input" in _one_line(capsys)
        assert trace.read_bytes() == before


def test_report_replaces_an_existing_file_only_with_force(trace, capsys):
    out = trace.with_suffix(".html")  # the default output name
    out.write_text("keep me")
    assert report.main([str(trace)]) == 2
    assert "already exists: give --force" in _one_line(capsys)
    assert out.read_text() == "keep me"
    assert report.main([str(trace), "--force"]) == 0
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in trace.parent.iterdir()) == ["qa.html", "qa.npz"]  # no .part


@pytest.mark.parametrize("command", [["run", "hi"], ["batch", "hi"], ["quantize"],
                                     ["loadtest", "--base-url", "http://127.0.0.1:9/v1"]])
def test_every_writing_command_refuses_an_existing_file_before_any_work(command, tmp_path,
                                                                        capsys):
    out = tmp_path / "old.json"
    out.write_text("keep me")
    assert main([*command, "--out", str(out)]) == 2  # before a model loads or a request leaves
    assert "already exists: give --force" in _one_line(capsys)
    assert out.read_text() == "keep me"


def test_a_real_process_refuses_in_one_line_with_status_2(engine_cli, tmp_path):
    out = tmp_path / "sky.npz"
    out.write_bytes(b"a trace")
    done = engine_cli("run", "Why is the sky blue?", "-o", str(out))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {out} already exists: give --force to replace it"]
    assert out.read_bytes() == b"a trace"


def test_an_interrupted_write_leaves_the_old_file_and_no_part(tmp_path, monkeypatch):
    out = tmp_path / "study.json"
    out.write_text("old")

    def fail(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(EngineError, match="No space left on device"):
        OutFile(out, force=True).write(b"new" * 1000)
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["study.json"]


def test_a_file_that_appears_during_the_run_is_not_replaced(tmp_path):
    out = tmp_path / "trace.npz"
    target = OutFile(out, force=False)
    target.check()  # before the work: the name is free
    out.write_text("someone else's")  # ... made while the run was going
    with pytest.raises(EngineError, match="already exists"):
        target.write(b"mine")
    assert out.read_text() == "someone else's" and len(list(tmp_path.iterdir())) == 1
    OutFile(tmp_path / "new.npz", force=False).write(b"mine")
    assert (tmp_path / "new.npz").read_bytes() == b"mine"
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "new.npz").stat().st_mode & 0o777 == 0o666 & ~umask  # as open() makes it
