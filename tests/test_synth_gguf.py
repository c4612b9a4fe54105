"""scripts/synth_gguf.py: synthetic GGUF files of real shape and vocabulary.

Always: the per-tensor types follow llama.cpp's rule (the engine's own transcription of it,
engine/quant/kmix.py, agrees; the published Q4_K_M mixes of Llama 3.1 8B and Llama 3.2 1B);
the blocks gguf-py dequantizes have the intended spread; the metadata is what llama.cpp's
converter writes; rope_freqs scales the frequencies as transformers' llama3 RoPE does. Where
llama.cpp's venv exists (`make llamacpp`): every architecture's tiny file opens in llama.cpp with
finite logits, and llama.cpp's own quantizer gives a float file of the same shape our type mix.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engine.gguf.header import read_header
from scripts.synth_gguf import SHAPES, plan, rope_freqs, tensor_type, type_mix, write_synthetic
from scripts.synth_vocab import VocabMissing, chat_template, vocab_path

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / ".venv-llamacpp" / "bin" / "python"
ARCH_VOCAB = {"llama3": "llama3_1", "qwen2": "qwen3", "qwen3": "qwen3", "llama": "llama2",
              "mistral": "llama2"}
needs_peer = pytest.mark.skipif(not PEER.exists(), reason="llama.cpp's venv is not built "
                                                          "(make llamacpp)")


def _vocabs_installed() -> None:
    try:
        for name in ("llama3_1", "qwen3", "llama2"):
            vocab_path(name)
    except VocabMissing as err:  # CI runs `make vocab` first: a missing vocabulary is a failure
        pytest.fail(str(err))


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, Path]:
    """Each architecture's tiny Q4_K_M file with its own model's vocabulary."""
    _vocabs_installed()
    folder = tmp_path_factory.mktemp("synth")
    files = {}
    for arch, vocab in ARCH_VOCAB.items():
        files[arch] = folder / f"{arch}.gguf"
        write_synthetic(files[arch], "tiny", arch, "q4_k_m", vocab, seed=1)
    return files


def _values(path: Path, t, max_rows: int = 4096) -> np.ndarray:
    """A tensor of the file (its first `max_rows` rows) dequantized by gguf-py, found by the
    engine's checked header."""
    import gguf

    qtype = gguf.GGMLQuantizationType[t.ggml_type]
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.nbytes,))
    rows = raw.reshape(t.shape[0] if len(t.shape) == 2 else 1, -1)[:max_rows]
    return gguf.quants.dequantize(rows, qtype)


def test_published_type_mixes():
    """llama.cpp's loader reports these for the real files (f32 counts include rope_freqs)."""
    assert type_mix(plan(SHAPES["8b"], "llama3", "q4_k_m", 128256)) == {
        "F32": 66, "Q4_K": 193, "Q6_K": 33}
    assert type_mix(plan(SHAPES["8b"], "llama3", "q4_0", 128256)) == {
        "F32": 66, "Q4_0": 225, "Q6_K": 1}
    assert type_mix(plan(SHAPES["8b"], "llama3", "q8_0", 128256)) == {"F32": 66, "Q8_0": 226}
    assert type_mix(plan(SHAPES["1b"], "llama3", "q4_k_m", 128256)) == {
        "F32": 34, "Q4_K": 96, "Q6_K": 17}


@pytest.mark.parametrize("shape", ["135m", "1b", "8b"])
def test_type_rule_agrees_with_the_engines_kmix(shape):
    from engine.quant.kmix import output_type, requested_type, stored_type

    s = SHAPES[shape]
    for t in plan(s, "llama", "q4_k_m", 32000):
        if len(t.shape) == 1:
            assert t.ggml_type == "F32"
            continue
        cols = t.shape[1]
        if t.name == "output.weight" or (s.tied and t.name == "token_embd.weight"):
            want = output_type("q4_k_m", cols)
        elif t.name == "token_embd.weight":
            want = stored_type("Q4_K", cols)
        else:
            role = t.name.split(".")[2]
            want = stored_type(requested_type("q4_k_m", role, int(t.name.split(".")[1]),
                                              s.layers), cols)
        assert t.ggml_type == want, t.name


def test_fallbacks_on_rows_that_are_not_whole_blocks():
    """SmolLM2-135M's width 576 is not whole 256-blocks: Q4_K → Q5_0, Q6_K → Q8_0; its tied
    embedding is Q8_0 in a Q4_0 file too (Q6_K asked, 576 % 256)."""
    assert tensor_type("blk.0.attn_q.weight", 576, "q4_k_m", 30, True) == "Q5_0"
    assert tensor_type("blk.0.attn_v.weight", 576, "q4_k_m", 30, True) == "Q8_0"
    assert tensor_type("blk.0.ffn_down.weight", 1536, "q4_k_m", 30, True) == "Q6_K"
    assert tensor_type("blk.3.ffn_down.weight", 1536, "q4_k_m", 30, True) == "Q4_K"
    assert tensor_type("token_embd.weight", 576, "q4_0", 30, True) == "Q8_0"
    assert tensor_type("token_embd.weight", 4096, "q4_0", 32, False) == "Q4_0"


def test_rope_freqs_are_transformers_llama3_scaling():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    s = SHAPES["1b"]
    config = LlamaConfig(hidden_size=s.hidden, num_attention_heads=s.heads, head_dim=s.head_dim,
                         max_position_embeddings=s.context,
                         rope_parameters={"rope_type": "llama3", "factor": s.rope_factor,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192,
                                          "rope_theta": s.rope_theta})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    plain = 1.0 / s.rope_theta ** (np.arange(0, s.head_dim, 2) / s.head_dim)
    np.testing.assert_allclose(plain / rope_freqs(s), inv_freq.numpy(), rtol=1e-5)


def test_blocks_dequantize_to_the_intended_spread(tiny_files):
    seen = Counter()
    for path in tiny_files.values():
        for t in read_header(path).table.tensors:
            values = _values(path, t)
            assert np.isfinite(values).all(), t.name
            kind = t.ggml_type
            if t.name.endswith(".weight") and len(t.shape) == 2:
                assert 0.018 < values.std() < 0.022 and abs(values.mean()) < 0.002, (t.name, kind)
                seen[kind] += 1
            elif "norm" in t.name:
                assert (values == 1).all(), t.name
    assert set(seen) == {"Q4_K", "Q6_K"}


@pytest.mark.parametrize("qtype", ["q4_0", "q8_0", "f16"])
def test_other_types_dequantize_to_the_intended_spread(tmp_path, qtype):
    _vocabs_installed()
    path = tmp_path / "f.gguf"
    write_synthetic(path, "135m", "llama", qtype, "llama2", layers=1)
    kinds = set()
    for t in read_header(path).table.tensors:
        if len(t.shape) == 2:
            values = _values(path, t)
            assert 0.018 < values.std() < 0.022, t.name
            kinds.add(t.ggml_type)
    assert kinds == {"q4_0": {"Q4_0", "Q8_0"}, "q8_0": {"Q8_0"}, "f16": {"F16"}}[qtype]


def test_metadata_as_the_converter_writes_it(tiny_files):
    headers = {arch: read_header(path) for arch, path in tiny_files.items()}

    def value(arch: str, key: str):
        return headers[arch].get(key)

    for arch, gguf_arch in (("llama3", "llama"), ("qwen2", "qwen2"), ("qwen3", "qwen3"),
                            ("llama", "llama"), ("mistral", "llama")):
        assert value(arch, "general.architecture") == gguf_arch
        assert value(arch, f"{gguf_arch}.embedding_length") == 256
        assert value(arch, f"{gguf_arch}.attention.head_count_kv") == 2
        assert value(arch, "general.file_type") == 15
        assert value(arch, "general.alignment") in (None, 32)
    assert value("qwen3", "qwen3.attention.key_length") == 64  # Qwen3's config states head_dim
    assert value("llama3", "llama.attention.key_length") is None
    assert value("llama3", "llama.rope.dimension_count") == 64
    assert value("llama3", "tokenizer.ggml.pre") == "llama-bpe"
    assert value("llama3", "tokenizer.ggml.bos_token_id") == 128000
    assert value("llama3", "tokenizer.ggml.eos_token_id") == 128009
    assert value("llama3", "tokenizer.ggml.add_bos_token") is True
    assert value("qwen3", "tokenizer.ggml.pre") == "qwen2"
    assert value("qwen3", "tokenizer.ggml.bos_token_id") == 151643
    assert value("qwen3", "tokenizer.ggml.add_bos_token") is False
    assert value("llama", "tokenizer.ggml.model") == "llama"
    assert value("llama", "tokenizer.ggml.unknown_token_id") == 0
    types = value("llama", "tokenizer.ggml.token_type")
    assert (types[0], types[1], types[3], types[258], types[300]) == (2, 3, 6, 6, 1)
    tokens = value("qwen3", "tokenizer.ggml.tokens")
    assert len(tokens) == 151936 and tokens[-1] == "[PAD151935]"
    assert value("qwen3", "tokenizer.ggml.token_type")[151667] == 4  # <think>: user-defined
    assert value("qwen3", "tokenizer.chat_template") == chat_template("qwen3")
    assert value("llama3", "tokenizer.chat_template") == chat_template("llama3_1")
    names = {arch: set(h.table.by_name()) for arch, h in headers.items()}
    assert {"blk.1.attn_q.bias", "blk.1.attn_k.bias", "blk.1.attn_v.bias"} <= names["qwen2"]
    assert {"blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"} <= names["qwen3"]
    assert "rope_freqs.weight" in names["llama3"] and "rope_freqs.weight" not in names["llama"]


def test_same_seed_same_file(tmp_path):
    _vocabs_installed()
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_synthetic(a, "tiny", "llama", "q4_0", "llama2", seed=7)
    write_synthetic(b, "tiny", "llama", "q4_0", "llama2", seed=7)
    assert a.read_bytes() == b.read_bytes()
    assert not list(tmp_path.glob(".*partial"))


OPEN = """
import json, sys
import numpy as np
from llama_cpp import Llama
out = {}
for path in sys.argv[1:]:
    m = Llama(model_path=path, n_ctx=64, n_threads=1, logits_all=True, verbose=False)
    ids = m.tokenize(b"The capital of France is", add_bos=True, special=False)
    m.eval(ids)
    logits = np.array(m.scores[:len(ids)])
    out[path] = [bool(np.isfinite(logits).all()), float(logits.std())]
print(json.dumps(out))
"""


@needs_peer
def test_every_arch_opens_in_llamacpp_with_finite_logits(tiny_files):
    done = subprocess.run([str(PEER), "-c", OPEN, *map(str, tiny_files.values())],
                          capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for arch, path in tiny_files.items():
        finite, std = result[str(path)]
        assert finite and 0.1 < std < 10, arch


QUANTIZE = """
import sys, llama_cpp
src, dst, ftype = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.nthread = ftype, 2
sys.exit(llama_cpp.llama_model_quantize(src.encode(), dst.encode(), p))
"""


@needs_peer
@pytest.mark.parametrize("qtype", ["q4_0", "q8_0", "q4_k_m"])
def test_llamacpps_quantizer_gives_our_type_mix(tmp_path, qtype):
    """A float file of SmolLM2-135M's width (rows of 576: the fallbacks) and 8 layers (the
    use_more_bits pattern), quantized by llama.cpp, has our file's type for every tensor."""
    from scripts.synth_gguf import TYPES

    _vocabs_installed()
    f16, ours, theirs = tmp_path / "f16.gguf", tmp_path / "ours.gguf", tmp_path / "theirs.gguf"
    write_synthetic(f16, "135m", "llama3", "f16", "llama2", layers=8)
    write_synthetic(ours, "135m", "llama3", qtype, "llama2", layers=8)
    subprocess.run([str(PEER), "-c", QUANTIZE, str(f16), str(theirs), str(TYPES[qtype][1])],
                   capture_output=True, timeout=600, check=True)
    mine = {t.name: t.ggml_type for t in read_header(ours).table.tensors}
    made = {t.name: t.ggml_type for t in read_header(theirs).table.tensors}
    assert made == mine
