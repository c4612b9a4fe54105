"""The benchmark's peer: llama.cpp (llama-cpp-python) decoding the same GGUF file, greedy.

Runs in its own venv (`make llamacpp`), as a worker the benchmark starts once and drives over
stdin/stdout, so the model loads once and each round's run sits between the native runs of the
same round. Once loaded it says {"ready": true, "version", "load_s" (the model's load, the
import excluded), "n_vocab"}. Protocol: one JSON line in {"ids": [...], "tokens": N}, one JSON
line out {"tokens": [...], "prefill_ms": x, "step_ms": [...]} (with "top": k in, also the first
step's k best [id, logit] — every logit with k ≥ n_vocab — and each step's margin between its
best two); "quit" ends it. A step is one `eval([token])` and the argmax of its logits — what the
native step's timed loop does too.

    .venv-llamacpp/bin/python bench/llamacpp_peer.py MODEL.gguf THREADS [--no-extra-buffers]

llama.cpp runs with its own defaults (its weight repacking included): the peer at its best on
the machine at hand. `--no-extra-buffers` is the workaround for the AMX crash some VMs have.
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
    """llama.cpp's default model parameters with its "extra buffer types" off: the workaround
    for hosts where ggml routes matmuls to its AMX backend and crashes (SIGSEGV in
    ggml_backend_amx_mul_mat: a VM that reports AMX without granting tile state). The extra
    buffers are AMX and weight repacking (interleaved rows for its AVX2 / AVX-512 kernels), so
    this costs llama.cpp up to half its speed where they run: the benchmark uses it only after
    the peer crashed with its defaults, and says so in its table (bench/gguf_bench.py)."""
    params = _default_params()
    params.use_extra_bufts = False
    return params


_default_params = bindings.llama_model_default_params


def last_logits(llm: Llama) -> np.ndarray:
    """The last evaluated token's logits (llama.cpp computes only that row here)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def greedy(llm: Llama, ids: list[int], n: int, top: int = 0) -> dict:
    """A greedy run, timed; with `top`, also the first step's `top` best tokens and logits and
    each step's margin between the best two (what the parity tests compare against)."""
    llm.reset()
    start = time.perf_counter()
    llm.eval(ids)
    logits = last_logits(llm)
    token = int(np.argmax(logits))
    prefill_ms = (time.perf_counter() - start) * 1000
    tokens, steps, margins = [token], [], []
    first = [[int(i), float(logits[i])] for i in np.argsort(-logits)[:top]]
    for _ in range(n - 1):
        if top:
            best = np.sort(logits)[-2:]
            margins.append(float(best[1] - best[0]))
        start = time.perf_counter()
        llm.eval([token])
        logits = last_logits(llm)
        token = int(np.argmax(logits))
        steps.append((time.perf_counter() - start) * 1000)
        tokens.append(token)
    done = {"tokens": tokens, "prefill_ms": prefill_ms, "step_ms": steps}
    if top:
        best = np.sort(logits)[-2:]
        done |= {"top": first, "margins": [*margins, float(best[1] - best[0])]}
    return done


def main() -> None:
    path, threads = sys.argv[1], int(sys.argv[2])
    if "--no-extra-buffers" in sys.argv[3:]:
        bindings.llama_model_default_params = _without_extra_buffers
    start = time.perf_counter()
    llm = Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    load_s = time.perf_counter() - start
    print(json.dumps({"ready": True, "version": llama_cpp.__version__, "load_s": load_s,
                      "n_vocab": llm.n_vocab()}), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        request = json.loads(line)
        print(json.dumps(greedy(llm, request["ids"], request["tokens"], request.get("top", 0))),
              flush=True)


if __name__ == "__main__":
    main()
