"""Is a stored-block matrix-vector product at the memory roof? One decode token's product with
an 8B model's largest matrices (14,336 × 4,096, eight of them: far past the caches), in each
type's kernel (engine/gguf/stored.c), against a plain read of the same bytes (the read the
bandwidth ceiling and every MBU use: engine/kernels/microbench.py's `read_gb_s`), from anonymous
memory (NumPy asks for huge pages) and from a file's mapping (4 KiB pages, as a GGUF is opened).
A ratio well under 1 means the kernel, not the memory, sets the decode time.

    .venv/bin/python bench/stored_gemv.py [Q4_0 Q4_0x8 Q8_0 Q8_0x8 Q4_K Q4_Kx8 Q6_K Q6_Kx8]
        [--threads 1 2] [--rounds 5]

Q4_0x8, Q8_0x8, Q4_Kx8, Q6_Kx8: the matrices with 8 rows interleaved, as a file's Q4_0, Q8_0,
Q4_K and Q6_K linear layers are opened (engine/gguf/stored_rows8.h, stored_rows8q8.h,
stored_rows8k.h, stored_rows8q6.h).

Random codes with small scales (the kernels' speed does not depend on the values); best of
`rounds`, each type and place read back to back. Needs a quiet machine (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.gguf import stored  # noqa: E402
from engine.kernels.microbench import read_gb_s  # noqa: E402

ROWS, COLS, COUNT = 14_336, 4_096, 8
SCALE_AT = {"Q4_0": 0, "Q8_0": 0, "Q4_K": 0, "Q6_K": 208}  # where a block's f16 scale d sits


def matrices(kind: str, rng: np.random.Generator) -> list[np.ndarray]:
    if kind.endswith("x8"):
        base = kind[:-2]
        return [stored.interleave(stored.StoredMatrix.view("w", base, ROWS, COLS, m)).data
                for m in matrices(base, rng)]
    _, per, nbytes = stored.TYPES[kind]
    small = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    out = []
    for _ in range(COUNT):
        blocks = rng.integers(0, 256, size=(ROWS, COLS // per, nbytes), dtype=np.uint8)
        blocks[:, :, SCALE_AT[kind]:SCALE_AT[kind] + 2] = small
        if kind == "Q4_K":
            blocks[:, :, 2:4] = small  # dmin
        out.append(np.ascontiguousarray(blocks.reshape(ROWS, -1)))
    return out


def best_gb_s(run, views: list[np.ndarray], rounds: int) -> float:
    total = sum(v.nbytes for v in views)
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        for v in views:
            run(v)
        best = max(best, total / (time.perf_counter() - start) / 1e9)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*",
                        default=["Q4_0", "Q4_0x8", "Q8_0", "Q8_0x8", "Q4_K", "Q4_Kx8", "Q6_K",
                                 "Q6_Kx8"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lib = stored.library()
    x, y = torch.randn(1, COLS), torch.empty(1, ROWS)
    work = np.zeros(lib.matmul_work_bytes(COLS, 1), np.uint8)
    rng = np.random.default_rng(0)
    print("| type | memory | threads | product GB/s | read GB/s | product ÷ read |")
    print("|---|---|---|---|---|---|")
    for kind in args.types:
        anonymous = matrices(kind, rng)
        with tempfile.NamedTemporaryFile(suffix=".bin") as f:
            for m in anonymous:
                f.write(m.tobytes())
            f.flush()
            mapped = np.memmap(f.name, dtype=np.uint8, mode="r")
            size = anonymous[0].nbytes
            places = {"anonymous": anonymous,
                      "file mapping": [mapped[i * size:(i + 1) * size] for i in range(COUNT)]}
            for place, views in places.items():
                for threads in args.threads:
                    code = (stored.INTERLEAVED[kind[:-2]][0] if kind.endswith("x8")
                            else stored.TYPES[kind][0])

                    def product(v, t=threads, code=code):
                        lib.stored_matmul(v.ctypes.data, code, ROWS, COLS,
                                          x.data_ptr(), 1, y.data_ptr(), t, work.ctypes.data)

                    def read(v, t=threads):
                        torch.set_num_threads(t)
                        with warnings.catch_warnings():  # a read-only mapping: only read here
                            warnings.simplefilter("ignore", UserWarning)
                            read_gb_s(torch.from_numpy(v).view(torch.float32))

                    best_gb_s(read, views, 1)  # pages in
                    g, r = best_gb_s(product, views, args.rounds), best_gb_s(read, views, args.rounds)
                    print(f"| {kind} | {place} | {threads} | {g:.1f} | {r:.1f} | {g / r:.2f} |",
                          flush=True)
            del places, mapped


if __name__ == "__main__":
    main()
