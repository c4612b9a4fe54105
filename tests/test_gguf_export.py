"""`export --format gguf` round trip (issue 29.3 and 29.4): the default model exported as fp32 and as
q4_0, read back tensor for tensor by gguf-py, run by transformers' GGUF loader and by our own
reader with the same greedy tokens as the engine; the shipped Q4_1 file opened by our reader
decodes as the default model.

Permutation, names and metadata are checked against llama.cpp's rules: the tokenizer written
from the loaded tokenizer equals, token for token and merge for merge, the one llama.cpp wrote
into the shipped file.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.real_model

PROMPT = "What is the capital of France?"
NEW_TOKENS = 8


def greedy(model, ids: list[int]) -> list[int]:
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                             do_sample=False, pad_token_id=2)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def prompt_ids(lm) -> list[int]:
    from engine.forward import prepare_prompt

    return prepare_prompt(lm.tokenizer, PROMPT, True)


@pytest.fixture(scope="module")
def exported(lm, tmp_path_factory) -> dict:
    """variant → (path, Exported) for fp32 and q4_0, written by the export code."""
    from engine.gguf.export import export_gguf
    from engine.outfile import out_file

    folder = tmp_path_factory.mktemp("gguf")
    done = {}
    for variant in ("fp32", "q4_0"):
        path = folder / f"smollm2-{variant}.gguf"
        done[variant] = (path, export_gguf(lm, variant, out_file(path, False)))
    return done


@pytest.fixture(scope="module")
def readers(exported) -> dict:
    """variant → gguf-py's GGUFReader of its exported file, parsed once (the metadata's 49,152
    tokens and their merges take seconds to parse): the read-back test's, and what
    transformers' GGUF loader gets from `gguf.GGUFReader` for the q4_0 file (it parses a file
    once for the config, then again for the weights). A reader only reads its memory map."""
    import gguf

    return {variant: gguf.GGUFReader(path) for variant, (path, _) in exported.items()}


def test_gguf_py_reads_back_every_tensor_as_written(exported, readers, lm):
    for variant, want_type in (("fp32", "F32"), ("q4_0", "Q4_0")):
        path, done = exported[variant]
        reader = readers[variant]
        written = {t.name: t for t in done.tensors}
        assert [t.name for t in reader.tensors] == list(written)
        assert "output.weight" not in written  # tied head: token_embd serves both
        for t in reader.tensors:
            ours = written[t.name]
            assert t.tensor_type.name == ours.ggml_type
            assert np.array_equal(np.asarray(t.data).view(np.uint8).reshape(-1),
                                  np.ascontiguousarray(ours.data).view(np.uint8).reshape(-1)), t.name
        types = {t.name: t.tensor_type.name for t in reader.tensors}
        assert types["blk.0.attn_q.weight"] == want_type and types["blk.0.attn_norm.weight"] == "F32"
        assert types["token_embd.weight"] == ("F32" if variant == "fp32" else "Q8_0")
        # the table our header reader made of the written file agrees with gguf-py's
        assert [(t.name, t.offset, t.nbytes) for t in done.table.tensors] == \
            [(t.name, int(t.data_offset), int(t.n_bytes)) for t in reader.tensors]
        if variant == "fp32":  # every weight is the model's own, q / k rows put back
            _fp32_file_is_the_model(reader, lm)


def _fp32_file_is_the_model(reader, lm) -> None:
    from engine.gguf.names import hf_name, unpermute

    params = dict(lm.model.named_parameters())
    for t in reader.tensors:
        w = torch.from_numpy(np.array(t.data)).reshape(tuple(int(d) for d in reversed(t.shape)))
        heads = 9 if ".attn_q." in t.name else 3 if ".attn_k." in t.name else None
        w = w if heads is None else unpermute(w, heads)
        assert torch.equal(w, params[hf_name(t.name)].detach()), t.name


def test_metadata_and_tokenizer_are_llama_cpps(exported, lm):
    from engine.gguf.header import read_header
    from engine.loader import default_gguf_path

    mine = read_header(exported["q4_0"][0])
    shipped = read_header(default_gguf_path())
    c = lm.model.config
    assert mine.table.architecture == "llama"
    for key, want in (("context_length", 8192), ("embedding_length", c.hidden_size),
                      ("block_count", c.num_hidden_layers), ("feed_forward_length", 1536),
                      ("attention.head_count", 9), ("attention.head_count_kv", 3),
                      ("vocab_size", 49152), ("rope.dimension_count", 64)):
        assert mine.get(f"llama.{key}") == want == shipped.get(f"llama.{key}"), key
    for key in ("llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon",
                "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
                "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
                "tokenizer.ggml.add_bos_token", "tokenizer.chat_template"):
        assert mine.get(key) == shipped.get(key), key
    assert np.array_equal(mine.get("tokenizer.ggml.token_type"),
                          shipped.get("tokenizer.ggml.token_type"))
    assert mine.get("general.file_type") == 2  # MOSTLY_Q4_0


def test_q_and_k_rows_are_permuted_as_llama_cpp_and_blocks_are_gguf_pys(exported, lm):
    import gguf

    from engine.gguf.header import read_header
    from engine.gguf.names import permute, unpermute
    from engine.gguf.reader import read_tensor
    from engine.loader import default_gguf_path

    path, done = exported["q4_0"]
    written = {t.name: t for t in done.tensors}
    attn = lm.model.model.layers[0].self_attn
    for name, w, heads in (("blk.0.attn_q.weight", attn.q_proj.weight, 9),
                           ("blk.0.attn_k.weight", attn.k_proj.weight, 3)):
        w = w.detach().float()
        assert torch.equal(unpermute(permute(w, heads), heads), w)
        want = gguf.quants.quantize(permute(w, heads).numpy(), gguf.GGMLQuantizationType.Q4_0)
        assert np.array_equal(written[name].data, want)
    # the same rows, from the shipped file (llama.cpp's own conversion): its permuted Q4_1 rows,
    # dequantized and put back, are the default model's q_proj
    shipped = read_header(default_gguf_path())
    q = torch.from_numpy(read_tensor(shipped, "blk.0.attn_q.weight"))
    assert torch.equal(unpermute(q, 9), attn.q_proj.weight.detach().float())


def test_the_fast_block_writer_is_engine_quants(lm):
    from engine.gguf.export import block_bytes
    from engine.quant.formats import quantize
    from engine.quant.ggml_blocks import ggml_blocks
    from engine.quant.scheme import FORMATS

    w = lm.model.model.layers[5].mlp.down_proj.weight.detach().float()
    for ggml in ("Q8_0", "Q4_0", "Q4_1"):
        assert torch.equal(block_bytes(w, ggml), ggml_blocks(quantize(w, FORMATS[ggml.lower()])))


def test_transformers_and_our_reader_run_the_q4_0_file_as_the_engines_q4_0(exported, readers, lm,
                                                                           prompt_ids, monkeypatch):
    """transformers' GGUF loader and our reader build the same weights from the q4_0 file, decode
    the same greedy tokens, and those weights are the engine's q4_0 variant (the rounding the
    quality and decode paths use, `formats.rounded`), checked on the first and last layers and
    the Q8_0 embedding."""
    import gguf
    from transformers import AutoModelForCausalLM

    from engine.loader import load_model
    from engine.quant.formats import rounded
    from engine.quant.scheme import FORMATS

    # transformers builds gguf-py's name map afresh for each of the model's 397 modules (9 s of
    # the load); the map is a pure function of (architecture, layers), so it is built once here
    monkeypatch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
    path: Path = exported["q4_0"][0]
    parsed, real = {path.resolve(): readers["q4_0"]}, gguf.GGUFReader

    def reader(file, mode="r"):  # the module's parse of the q4_0 file; any other file afresh
        known = parsed.get(Path(file).resolve()) if mode == "r" else None
        return known if known is not None else real(file, mode)

    monkeypatch.setattr(gguf, "GGUFReader", reader)
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                  dtype=torch.float32)
    ours = load_model(str(path), on_blocks=False)
    assert ours.gguf_tensors is not None and ours.gguf_tensors.type_counts() == \
        {"Q4_0": 210, "F32": 61, "Q8_0": 1}
    a, b = ours.model.state_dict(), theirs.state_dict()
    assert set(a) <= set(b) and all(torch.equal(a[k], b[k]) for k in a)
    source = dict(lm.model.named_parameters())
    for name in [n for n in a if ".layers.0." in n or ".layers.29." in n] + \
            ["model.embed_tokens.weight"]:
        w = source[name].detach()
        fmt = "q8_0" if "embed" in name else "q4_0"
        assert torch.equal(a[name], w if w.dim() == 1 else rounded(w, FORMATS[fmt])), name
    tokens = greedy(theirs, prompt_ids)
    assert greedy(ours.model, prompt_ids) == tokens
    print("q4_0 greedy tokens", tokens, repr(lm.tokenizer.decode(tokens)))


def test_the_shipped_gguf_opened_by_our_reader_is_the_default_model(lm, prompt_ids):
    from engine.loader import default_gguf_path, load_model

    opened = load_model(str(default_gguf_path()), on_blocks=False)
    table = opened.gguf_tensors
    assert table.type_counts() == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    q = table.by_name()["blk.0.attn_q.weight"]
    assert (q.ggml_type, q.shape, q.nbytes, q.bits_per_weight) == ("Q4_1", (576, 576), 207360, 5.0)
    a, b = opened.model.state_dict(), lm.model.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    from engine.forward import prepare_prompt

    assert prepare_prompt(opened.tokenizer, PROMPT, True) == prompt_ids
    tokens = greedy(opened.model, prompt_ids)
    assert tokens == greedy(lm.model, prompt_ids)
    print("default / shipped-file greedy tokens", tokens, repr(lm.tokenizer.decode(tokens)))
