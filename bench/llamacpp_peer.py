"""The benchmark's peer: llama.cpp (llama-cpp-python) decoding the same GGUF file, greedy.

Runs in its own venv (`make llamacpp`), as a worker the benchmark starts once and drives over
stdin/stdout, so the model loads once and each round's run sits between the native runs of the
same round. Protocol: one JSON line in {"ids": [...], "tokens": N}, one JSON line out
{"tokens": [...], "prefill_ms": x, "step_ms": [...]}; "quit" ends it. A step is one
`eval([token])` and the argmax of its logits — what the native step's timed loop does too.

    .venv-llamacpp/bin/python bench/llamacpp_peer.py MODEL.gguf THREADS
"""

from __future__ import annotations

import json
import sys
import time

import llama_cpp
import llama_cpp.llama_cpp as bindings
import numpy as np
from llama_cpp import Llama


def _without_extra_buffers():
    """llama.cpp's default model parameters with its "extra buffer types" off. On these VMs the
    CPU reports AMX and ggml routes the matmuls to its AMX backend, which crashes (SIGSEGV in
    ggml_backend_amx_mul_mat: the VM does not grant AMX tile state); the extra buffers are AMX and
    weight repacking, which has no Q4_1 layout, so the Q4_1 file runs llama.cpp's usual AVX-512
    kernels."""
    params = _default_params()
    params.use_extra_bufts = False
    return params


_default_params = bindings.llama_model_default_params
bindings.llama_model_default_params = _without_extra_buffers


def next_token(llm: Llama) -> int:
    """Argmax of the last evaluated token's logits (llama.cpp computes only that row here)."""
    return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))))


def greedy(llm: Llama, ids: list[int], n: int) -> dict:
    llm.reset()
    start = time.perf_counter()
    llm.eval(ids)
    token = next_token(llm)
    prefill_ms = (time.perf_counter() - start) * 1000
    tokens, steps = [token], []
    for _ in range(n - 1):
        start = time.perf_counter()
        llm.eval([token])
        token = next_token(llm)
        steps.append((time.perf_counter() - start) * 1000)
        tokens.append(token)
    return {"tokens": tokens, "prefill_ms": prefill_ms, "step_ms": steps}


def main() -> None:
    path, threads = sys.argv[1], int(sys.argv[2])
    llm = Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    print(json.dumps({"ready": True, "version": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        request = json.loads(line)
        print(json.dumps(greedy(llm, request["ids"], request["tokens"])), flush=True)


if __name__ == "__main__":
    main()
