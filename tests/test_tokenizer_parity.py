"""Our tokenizer of a GGUF's vocabulary against llama.cpp's, token for token (engine/gguf/vocab.py).

The files: tiny synthetic GGUFs (scripts/synth_gguf.py) carrying three real vocabularies, Llama
3.1's and Qwen3's byte-level BPE and Llama 2's SentencePiece (`make vocab`), and the default
model's own GGUF (SmolLM2's byte-level BPE, as llama.cpp's converter wrote it). llama.cpp's ids were
recorded once into tests/fixtures/llamacpp_tokens/ (scripts/llamacpp_tokens.py), since CI builds
no llama.cpp: typed text (English, 繁體中文, 简体中文, code, emoji with ZWJ sequences, odd
whitespace, digit runs, combining marks, special-token strings as text), the first text with the
vocabulary's BOS, and text whose special tokens are parsed (chat prompts, the chat template's
own rendering). Always: ours equals the recording, the way the engine tokenizes each kind
(engine/forward.py). Where llama.cpp's venv exists (`make llamacpp`): llama.cpp re-run live on
the same files equals the recording too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.forward import text_ids
from engine.gguf.header import read_header
from engine.gguf.vocab import gguf_tokenizer
from scripts.llamacpp_tokens import (
    CHAT,
    FIXTURES,
    PEER_PYTHON,
    SPECIAL_TEXTS,
    TEXTS,
    VOCAB_ARCH,
    VOCABS,
    chat_text,
    llamacpp_tokens,
    tiny_file,
)
from scripts.synth_vocab import VocabMissing, chat_template, vocab_path


def recorded(vocab: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{vocab}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """vocab → its tiny file; a missing vocabulary fails (CI runs `make vocab` first)."""
    try:
        for vocab in VOCAB_ARCH:
            vocab_path(vocab)
    except VocabMissing as err:
        pytest.fail(str(err))
    folder = tmp_path_factory.mktemp("vocab")
    return {vocab: tiny_file(folder, vocab) for vocab in VOCABS}


@pytest.fixture(scope="module")
def tokenizers(files) -> dict[str, Any]:
    from engine.gguf.header import read_header

    # as the loader builds it: from the header it has already read (checked equal below)
    return {vocab: gguf_tokenizer(path, read_header(path).metadata) for vocab, path in files.items()}


def _differing(tokenizer: Any, texts: list[str], ids: list[list[int]], special: bool) -> list[str]:
    def ours(text: str) -> list[int]:
        if special:  # how prepare_prompt tokenizes a chat template's text
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return text_ids(tokenizer, text)  # typed text: special-token strings are text
    return [text for text, want in zip(texts, ids, strict=True) if ours(text) != want]


@pytest.mark.parametrize("vocab", VOCABS)
def test_recordings_hold_todays_texts(vocab):
    """A text added or changed in scripts/llamacpp_tokens.py must be recorded again."""
    rec = recorded(vocab)
    assert rec["texts"] == TEXTS and rec["chat"] == CHAT
    assert rec["special_texts"][:len(SPECIAL_TEXTS)] == SPECIAL_TEXTS
    assert len(rec["ids"]) == len(TEXTS) >= 10


@pytest.mark.parametrize("vocab", VOCABS)
def test_typed_text_tokenizes_as_llamacpp(vocab, tokenizers):
    rec, tokenizer = recorded(vocab), tokenizers[vocab]
    assert _differing(tokenizer, rec["texts"], rec["ids"], special=False) == []
    assert text_ids(tokenizer, rec["texts"][0], add_special_tokens=True) == rec["prompt_ids"]


@pytest.mark.parametrize("vocab", VOCABS)
def test_special_tokens_and_chat_prompts_tokenize_as_llamacpp(vocab, tokenizers):
    rec, tokenizer = recorded(vocab), tokenizers[vocab]
    assert chat_text(tokenizer) == rec["chat_text"]
    assert _differing(tokenizer, rec["special_texts"], rec["special_ids"], special=True) == []


@pytest.mark.parametrize("vocab", VOCABS)
def test_chat_template_is_the_files_and_the_tokenizers(vocab, files, tokenizers):
    """Our tokenizer uses the file's template, which for a synthetic file is tokenizer_config's
    (Llama 2's package has none: then neither has one)."""
    in_file = read_header(files[vocab]).get("tokenizer.chat_template")
    assert getattr(tokenizers[vocab], "chat_template", None) == in_file
    if vocab in VOCAB_ARCH:
        assert in_file == chat_template(vocab)
        assert (in_file is None) == (vocab == "llama2")
    else:
        assert in_file


def test_the_comparison_sees_a_tokenizer_that_differs(files):
    """transformers' own SentencePiece spacing (Metaspace, prepend_scheme "first", which
    engine/gguf/vocab.py replaces) differs from llama.cpp on text that starts with a space: the
    test above would fail for it."""
    from tokenizers import pre_tokenizers

    tokenizer = gguf_tokenizer(files["llama2"])
    backend = tokenizer.backend_tokenizer
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    rec = recorded("llama2")
    assert " hello" in _differing(tokenizer, rec["texts"], rec["ids"], special=False)


def test_the_comparison_sees_qwens_eos_text_as_text(files, monkeypatch):
    """Without llama.cpp's by-text control tokens, Qwen3's ordinary "</s>" splits in a prompt."""
    from engine.gguf import vocab

    monkeypatch.setattr(vocab, "_control_by_text", lambda path, v: v.get("token_type"))
    rec = recorded("qwen3")
    differing = _differing(gguf_tokenizer(files["qwen3"]), rec["special_texts"],
                           rec["special_ids"], special=True)
    assert differing == [t for t in SPECIAL_TEXTS if "</s>" in t]


@pytest.mark.skipif(not PEER_PYTHON.exists(), reason="llama.cpp's venv is not built "
                                                     "(make llamacpp)")
@pytest.mark.parametrize("vocab", VOCABS)
def test_llamacpp_live_equals_the_recording(vocab, files):
    rec = recorded(vocab)
    live = llamacpp_tokens(files[vocab], rec["texts"], rec["special_texts"])
    assert live["ids"] == rec["ids"]
    assert live["prompt_ids"] == rec["prompt_ids"]
    assert live["special_ids"] == rec["special_ids"]
    assert live["chat_template"] == read_header(files[vocab]).get("tokenizer.chat_template")


@pytest.mark.parametrize("vocab", ["llama3_1", "qwen3", "llama2"])
def test_built_from_the_header_or_from_the_file_it_is_the_same_tokenizer(vocab, files, tokenizers):
    again = gguf_tokenizer(files[vocab])  # transformers' own reading of the file
    assert again.backend_tokenizer.to_str() == tokenizers[vocab].backend_tokenizer.to_str()
    assert again.chat_template == tokenizers[vocab].chat_template


@pytest.mark.parametrize("vocab", VOCABS)
def test_the_chat_prompts_special_tokens_are_the_files_control_tokens(vocab, files, tokenizers):
    """A trace marks a prompt token special (the chips, the story page's count) by
    `special_ids`: exactly the tokens the file types CONTROL (3), Llama 3's header markers
    included, which the tokenizer's named special tokens leave out."""
    from engine.forward import prepare_prompt, special_ids

    tokenizer = tokenizers[vocab]
    if getattr(tokenizer, "chat_template", None) is None:
        pytest.skip(f"{vocab}'s file has no chat template")
    types = read_header(files[vocab]).get("tokenizer.ggml.token_type")
    ids = prepare_prompt(tokenizer, "Hi", True)
    assert [i in special_ids(tokenizer) for i in ids] == [types[i] == 3 for i in ids]
