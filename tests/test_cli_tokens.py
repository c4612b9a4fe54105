"""`python -m engine tokens`: the same sentence's cost in each language, against the tokenizer
itself and the KV formula; bad arguments exit 2 with one line."""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest

from engine.__main__ import main
from engine.lens.tokens import article_sentences


@pytest.mark.real_model
def test_the_articles_sentences_cost_what_the_tokenizer_and_the_formula_say(lm, capsys):
    assert main(["tokens", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["label"]: r for r in out["texts"]}
    assert list(rows) == ["zh-Hant", "zh-Hans", "en"]
    spec = lm.spec
    for label, text in article_sentences().items():
        n = len(lm.tokenizer.encode(text, add_special_tokens=False))
        row = rows[label]
        assert row["tokens"] == n and row["characters"] == len(text)
        assert row["kv_bytes"] == 2 * spec.layers * spec.kv_heads * spec.head_dim * spec.dtype_bytes * n
    assert rows["zh-Hant"]["tokens"] > rows["en"]["tokens"]  # the article's point, on this model


@pytest.mark.parametrize("argv", [["tokens", ""], ["tokens", "--bogus"]])
def test_bad_arguments_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) if "--bogus" in argv else nullcontext():
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err

