"""A GGUF's tokenizer, token for token as llama.cpp tokenizes the file's vocabulary.

The tokenizer is transformers' own conversion of the file's vocabulary (the one
`AutoTokenizer.from_pretrained(..., gguf_file=...)` makes, without that path re-reading every
tensor), so a GGUF opened here tokenizes as the default model, which transformers converts. It
is checked against llama.cpp on the same files, text by text (tests/test_tokenizer_parity.py,
scripts/llamacpp_tokens.py: English, Chinese, code, emoji, odd whitespace, digits, combining
marks, special-token text, chat prompts). For byte-level BPE vocabularies (`gpt2`: Llama 3,
Qwen, SmolLM) transformers already splits as llama.cpp does (the pre-tokenizer regex chosen by
`tokenizer.ggml.pre`, no Unicode normalization, user-defined tokens matched whole). Two things are
set right here:

Tokens llama.cpp makes control tokens by their text. Its vocabulary loader (llama-vocab.cpp,
"auto-detect special tokens by text") marks every end-of-generation text it knows (`</s>`,
`<|im_end|>`, `<|endoftext|>`, …) and the fill-in-the-middle ones (`<|fim_prefix|>`, …) as control
tokens whatever the file says, so in a prompt's special text they are one token each. Qwen's
vocabulary has `</s>` as an ordinary token (id 128247): llama.cpp reads "…Hello!</s>" in a chat
prompt as "Hello", "!", "</s>", transformers as "Hello", "!</", "s", ">". Here they are special
tokens too (typed text keeps them as text either way: engine/forward.py `text_ids`).

SentencePiece vocabularies (`llama`: Llama 2, Mistral v0.1). llama.cpp puts a space before every
piece of raw text that starts the input or follows a special token (`add_space_prefix`, on
unless the file says otherwise), turns every space into "▁" and merges by score. transformers
builds a Metaspace pre-tokenizer with prepend_scheme "first" instead, which adds no "▁" to text
that already starts with a space (" hello": llama.cpp "▁" "▁hell" "o", Metaspace "▁hell" "o")
nor after a special token. The normalizer Llama 2's own tokenizer.json has, Prepend("▁") then
Replace(" ", "▁"), with no pre-tokenizer, does what llama.cpp does: tokenizers normalizes each
piece of text between added tokens on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .header import GGUFError

SPACE = "\u2581"  # SentencePiece's visible space
CONTROL = 3  # tokenizer.ggml.token_type of a control token
# llama-vocab.cpp's end-of-generation texts (its EOT and EOM texts are among them) and its
# fill-in-the-middle texts, which it looks for only where the file names no such token (the key)
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["})
FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>",
                "<PRE>", "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>",
                "<SUF>", "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>",
                "<MID>", "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}


def gguf_tokenizer(path: Path, metadata: dict[str, Any] | None = None) -> Any:
    """The tokenizer of the GGUF at `path` (a transformers TokenizersBackend); GGUFError with the
    first line of whatever the conversion raised. `metadata`: the file's, already read and
    checked (engine/gguf/header.py), so the vocabulary is not parsed a second time."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        convert_gguf_tokenizer,
        get_gguf_tokenizer,
    )
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    try:
        if metadata is None:
            arch, vocab, settings = get_gguf_tokenizer(str(path))
            named = _named_fim(_metadata_keys(path))
        else:
            arch, vocab, settings = _tokenizer_parts(metadata)
            named = _named_fim(metadata)
        vocab["token_type"] = _control_by_text(named, vocab)
        backend, extra = convert_gguf_tokenizer(arch, vocab)
        if vocab.get("tokenizer_type") == "llama":
            _sentencepiece_spaces(backend, vocab.get("add_prefix_space", True) is not False)
        return TokenizersBackend(tokenizer_object=backend, **settings, **extra)
    except Exception as err:  # noqa: BLE001 — the file's vocabulary, whatever the converter
        # or the tokenizers library (which raises plain Exception) makes of it, is a user's file
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise GGUFError(f"{Path(path).name}: cannot build its tokenizer: {first}") from err


def _tokenizer_parts(metadata: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """What transformers' `get_gguf_tokenizer` returns, from metadata already read: the
    architecture, the vocabulary's fields and the tokenizer settings (its own mapping tables)."""
    from transformers.integrations.gguf import gguf_tokenizer_mapping as mapping

    def plain(value: Any) -> Any:
        return value.tolist() if hasattr(value, "tolist") else (
            list(value) if isinstance(value, tuple) else value)

    grouped = {group: {name: plain(metadata[f"tokenizer.{key}"]) for key, name in renames.items()
                       if f"tokenizer.{key}" in metadata}
               for group, renames in mapping.GGUF_TOKENIZER_MAPPING.items()}
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer.get("tokenizer_type") == "llama":
        config.setdefault("add_bos_token", True)
    for name, key in mapping._SPECIAL_TOKENS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    return metadata["general.architecture"], tokenizer, config


def _metadata_keys(path: Path) -> dict[str, Any]:
    from transformers.integrations.gguf.reader import read_gguf_metadata

    metadata, _names = read_gguf_metadata(str(path))  # its arrays as counts: the keys only
    return metadata


def _control_by_text(named: set[str], vocab: dict[str, Any]) -> list[int] | None:
    """The file's token types with llama.cpp's by-text control tokens marked control (`named`:
    the fill-in-the-middle kinds the file names by id, which are not looked for by text)."""
    types = vocab.get("token_type")
    if types is None:
        return None
    texts = set(EOG_TEXTS)
    for kind, candidates in FIM_TEXTS.items():
        if kind not in named:
            texts.update(candidates)
    types = list(types)
    for i, token in enumerate(vocab["tokens"]):
        if token in texts and i < len(types):
            types[i] = CONTROL
    return types


def _named_fim(metadata: dict[str, Any]) -> set[str]:
    """The fill-in-the-middle tokens the file names by id (tokenizer.ggml.fim_pre_token_id, …;
    the old prefix / suffix / middle keys count too)."""
    old = {"prefix": "fim_pre", "suffix": "fim_suf", "middle": "fim_mid"}
    named = {k.removeprefix("tokenizer.ggml.").removesuffix("_token_id") for k in metadata
             if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")}
    return {old.get(k, k) for k in named}


def _sentencepiece_spaces(backend: Any, add_space_prefix: bool) -> None:
    """llama.cpp's SentencePiece spacing: "▁" before each piece of raw text (when the file's
    add_space_prefix is on), every space "▁", nothing split before the merges; decoding drops
    the one leading space only where one was put there."""
    from tokenizers import decoders, normalizers

    steps = [normalizers.Replace(" ", SPACE)]
    if add_space_prefix:
        steps.insert(0, normalizers.Prepend(SPACE))
    backend.normalizer = normalizers.Sequence(steps)
    backend.pre_tokenizer = None
    if not add_space_prefix:
        backend.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                             decoders.Fuse()])
