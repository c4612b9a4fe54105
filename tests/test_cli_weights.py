"""`python -m engine run --weights … --decoder …` and `show --json`'s model.weights /
model.weight_bytes: bad input is one line before any model loads; on the real model, the
decoder that ran is said on stderr and recorded."""

from __future__ import annotations

import json

import pytest

import engine.loader
from engine.__main__ import _parser, main
from engine.cli_run import chosen_weights
from engine.errors import EngineError


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_help_lists_every_variant_and_the_alias(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("fp32", "fp16", "bf16", "int8", "q4_0", "q4_1", "int4 is an alias of q4_0",
                 "--decoder {native,torch}"):
        assert name in text, name


@pytest.mark.parametrize("args, message", [
    (["--weights", "int3"], "invalid choice: 'int3'"),
    (["--decoder", "cuda"], "invalid choice: 'cuda'"),
])
def test_bad_choices_exit_2(args, message, capsys, monkeypatch):
    monkeypatch.setattr(engine.loader, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(SystemExit) as done:
        main(["run", "hi", *args])
    assert done.value.code == 2 and message in _one_line_error(capsys)


def test_weights_and_dtype_must_agree(capsys, monkeypatch):
    monkeypatch.setattr(engine.loader, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["run", "hi", "--weights", "q4_0", "--dtype", "float16"]) == 2
    assert "give --weights alone" in _one_line_error(capsys)


def test_chosen_weights():
    assert chosen_weights(None, None) == ("fp32", None)
    assert chosen_weights(None, "float16") == ("fp16", "float16")
    assert chosen_weights("int4", None) == ("q4_0", "float32")
    assert chosen_weights("bf16", "bfloat16") == ("bf16", "bfloat16")
    with pytest.raises(EngineError):
        chosen_weights("fp16", "float32")


def _run_and_show(tmp_path, capsys, *args: str) -> tuple[dict, str]:
    out = tmp_path / "t.npz"
    assert main(["run", "What is 2 + 2?", "--max-new-tokens", "4", "--no-attention",
                 "--out", str(out), *args]) == 0
    err = capsys.readouterr().err
    assert main(["show", str(out), "--json"]) == 0
    return json.loads(capsys.readouterr().out), err


@pytest.mark.real_model
def test_int4_runs_native_on_q4_0_codes(tmp_path, capsys):
    doc, err = _run_and_show(tmp_path, capsys, "--weights", "int4")
    assert "decoder: native C step (q4_0 weights" in err
    assert doc["model"]["weights"] == "q4_0" and doc["decoder"]["name"] == "native"
    # the packed codes + scales + norms one step reads: far below float32's 4 bytes a weight
    assert 0 < doc["model"]["weight_bytes"] == doc["decoder"]["weight_bytes"] < 134_515_008


@pytest.mark.real_model
@pytest.mark.parametrize("args, weights, reason, weight_bytes", [
    (["--weights", "fp16"], "fp16", "runs in float16", 134_515_008 * 2),
    (["--decoder", "torch"], "fp32", "the torch decoder was asked for", 134_515_008 * 4),
    (["--weights", "fp32", "--no-kv-cache"], "fp32", "the KV cache is off", 134_515_008 * 4),
    # torch reads a quantized copy's dequantized float32 tensors, not the stored codes
    (["--weights", "q4_0", "--decoder", "torch"], "q4_0", "the torch decoder was asked for",
     134_515_008 * 4),
])
def test_the_torch_path_says_why_and_counts_the_loaded_bytes(tmp_path, capsys, args, weights,
                                                             reason, weight_bytes):
    doc, err = _run_and_show(tmp_path, capsys, *args)
    assert "decoder: torch eager — " in err and reason in err
    assert doc["decoder"]["name"] == "torch" and reason in doc["decoder"]["reason"]
    assert doc["model"]["weights"] == weights and doc["model"]["weight_bytes"] == weight_bytes


def test_show_json_of_a_trace_from_before_the_decoder_record(capsys):
    from engine.files import load_trace
    from engine.records.examples import examples

    path = examples()[0].path
    trace = load_trace(path)
    assert main(["show", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    if trace.decoder is None:
        assert doc["decoder"] is None
        assert doc["model"]["weights"] == "fp32"
        assert doc["model"]["weight_bytes"] == trace.model.weight_bytes
    else:
        assert doc["model"]["weights"] == trace.decoder.weights
