"""Our GGUF export against llama.cpp itself (the benchmark's peer venv, `make llamacpp`; without
it these tests say so and skip): llama.cpp's own quantizer, given our float32 export, writes the
Q4_K_M file our `export --weights q4_k_m` writes, byte for byte, and llama.cpp decodes our
float32 export greedily to our tokens."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engine.forward import prepare_prompt

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / ".venv-llamacpp" / "bin" / "python"
QUANTIZE = """
import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
p.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))
"""
PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.")

pytestmark = pytest.mark.skipif(not PEER.exists(), reason="llama.cpp's venv is not built "
                                                           "(make llamacpp)")


@pytest.fixture(scope="module")
def exports(tmp_path_factory, engine_cli) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("llamacpp")
    files = {}
    for variant in ("fp32", "q4_k_m"):
        files[variant] = folder / f"{variant}.gguf"
        done = engine_cli("export", "--format", "gguf", "--weights", variant, "-o",
                          str(files[variant]))
        assert done.returncode == 0, done.stderr
    files["llama.cpp q4_k_m"] = folder / "llamacpp-q4_k_m.gguf"
    subprocess.run([str(PEER), "-c", QUANTIZE, str(files["fp32"]), str(files["llama.cpp q4_k_m"])],
                   check=True, capture_output=True)
    return files


def test_llamacpps_quantizer_writes_our_q4_k_m_byte_for_byte(exports):
    from gguf import GGUFReader

    ours = {t.name: t for t in GGUFReader(exports["q4_k_m"]).tensors}
    theirs = {t.name: t for t in GGUFReader(exports["llama.cpp q4_k_m"]).tensors}
    assert set(ours) == set(theirs) and len(ours) == 272
    for name, t in theirs.items():
        assert ours[name].tensor_type == t.tensor_type, name
        assert np.array_equal(np.asarray(ours[name].data).view(np.uint8),
                              np.asarray(t.data).view(np.uint8)), name
    assert exports["q4_k_m"].stat().st_size == exports["llama.cpp q4_k_m"].stat().st_size


def test_llamacpp_decodes_our_float32_export_to_our_tokens(exports, lm):
    from engine.runner import Run
    from engine.whatif.branch import greedy_settings

    peer = subprocess.Popen([str(PEER), str(ROOT / "bench" / "llamacpp_peer.py"),
                             str(exports["fp32"]), "2"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert json.loads(peer.stdout.readline())["ready"]
        for prompt in PROMPTS:
            ids = prepare_prompt(lm.tokenizer, prompt, True)
            run = Run(lm, prompt, greedy_settings(16, True)).run_all()  # stops at the turn's end
            assert list(run.prompt_token_ids) == ids
            ours = run.output_token_ids
            peer.stdin.write(json.dumps({"ids": ids, "tokens": len(ours)}) + "\n")
            peer.stdin.flush()
            assert tuple(json.loads(peer.stdout.readline())["tokens"]) == ours, prompt
    finally:
        peer.stdin.write("quit\n")
        peer.stdin.flush()
        peer.wait(timeout=30)
