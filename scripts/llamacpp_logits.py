"""Record what llama.cpp computes on small GGUF files, for tests that run without llama.cpp.

For the shipped SmolLM2 Q4_1 file and small synthetic files of every architecture and type the
engine opens (scripts/synth_gguf.py, seeded: the same bytes on every machine), llama.cpp
(llama-cpp-python, its own defaults) is given a prompt's token ids and records: the first step's
ten most probable tokens with their logits, its greedy continuation, and each step's margin
between the first and second token (greedy tokens can only be expected to agree while that
margin is clear of the 8-bit rounding both engines make). tests/test_gguf_llamacpp_parity.py
compares the engine's mapped model against this file; where `.venv-llamacpp` exists it also runs
llama.cpp live.

    .venv/bin/python scripts/llamacpp_logits.py   # needs `make llamacpp` and `make vocab`

llama.cpp runs in its own venv as bench/llamacpp_peer.py's worker, with its defaults.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (name, shape, arch, type, vocab): synthetic files the tests rebuild from the same seed
SYNTHETIC = [("llama3-q4_0", "tiny", "llama3", "q4_0", "llama3_1"),
             ("llama3-q4_k_m", "tiny", "llama3", "q4_k_m", "llama3_1"),
             ("llama3-q8_0", "tiny", "llama3", "q8_0", "llama3_1"),
             ("mistral-q4_k_m", "tiny", "mistral", "q4_k_m", "llama2"),
             ("qwen2-q4_k_m", "tiny", "qwen2", "q4_k_m", "qwen3"),
             ("qwen3-q4_0", "tiny", "qwen3", "q4_0", "qwen3")]
PROMPT_IDS = [9, 1000, 2000, 3000, 400, 77, 1234, 5678, 910, 11, 12, 13, 14, 15, 16, 17]
STEPS = 16
SEED = 7


def shipped_prompt() -> list[int]:
    """The chat-templated prompt the engine's tests use on the shipped file (fixed ids)."""
    return [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
            411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 4898, 314, 260, 6376, 4461, 47, 2, 198,
            1, 520, 9531, 198]


PEER = ROOT / ".venv-llamacpp" / "bin" / "python"


def record(path: Path, ids: list[int]) -> dict:
    """llama.cpp's greedy run of `ids` on `path`, with the first step's top 10 and margins."""
    peer = subprocess.Popen([str(PEER), str(ROOT / "bench" / "llamacpp_peer.py"), str(path), "2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready = json.loads(peer.stdout.readline())
        peer.stdin.write(json.dumps({"ids": ids, "tokens": STEPS, "top": 10}) + "\n")
        peer.stdin.flush()
        done = json.loads(peer.stdout.readline())
        peer.stdin.write("quit\n")
        peer.stdin.flush()
    finally:
        peer.wait(timeout=60)
    return {"prompt_ids": ids, "top10": done["top"], "tokens": done["tokens"],
            "margins": done["margins"], "llama_cpp": ready["version"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "llamacpp_logits.json"))
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from engine.loader import default_gguf_path
    from scripts.synth_gguf import write_synthetic

    found = {"shipped": record(default_gguf_path(), shipped_prompt())}
    with tempfile.TemporaryDirectory() as folder:
        for name, shape, arch, qtype, vocab in SYNTHETIC:
            path = Path(folder) / f"{name}.gguf"
            write_synthetic(path, shape, arch, qtype, vocab, SEED)
            found[name] = record(path, PROMPT_IDS) | {
                "synthetic": {"shape": shape, "arch": arch, "type": qtype, "vocab": vocab,
                              "seed": SEED}}
    Path(args.out).write_text(json.dumps(found, indent=1) + "\n")
    print(f"{args.out}: {len(found)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
