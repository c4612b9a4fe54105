"""`python -m engine quality`: bad input is one line and exit status 2, before any model loads."""

from __future__ import annotations

import pytest

import engine.loader
from engine.__main__ import main


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    monkeypatch.setattr(engine.loader, "load_model", lambda *a, **k: pytest.fail("model loaded"))


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_an_unknown_variant_exits_2(capsys):
    with pytest.raises(SystemExit) as done:
        main(["quality", "--weights", "int3"])
    assert done.value.code == 2
    assert "invalid choice: 'int3'" in one_line_error(capsys)


@pytest.mark.parametrize("content, message", [(None, "cannot read"), (b"", "empty"),
                                              (b"\xff\xfe\x00abc", "not UTF-8"),
                                              (b"a" * 70_000, "larger than")])
def test_an_unusable_text_file_exits_2(tmp_path, capsys, content, message):
    path = tmp_path / "text.txt"
    if content is not None:
        path.write_bytes(content)
    assert main(["quality", "--weights", "q4_1", "--text", str(path)]) == 2
    assert message in one_line_error(capsys)


def test_a_folder_as_text_exits_2(tmp_path, capsys):
    assert main(["quality", "--weights", "q4_1", "--text", str(tmp_path)]) == 2
    assert "cannot read" in one_line_error(capsys)
