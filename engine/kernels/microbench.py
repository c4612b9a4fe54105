"""Ceilings of this machine, measured: memory read bandwidth and matmul FLOP/s.

Small micro-benchmarks (best of a few repeats, synchronized on CUDA), cached per machine and
device in the cache folder, so the roofline is drawn against this machine's own numbers.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..clock import clock_ms
from ..loader import cache_root, resolve_dtype
from .ceilings import Ceilings  # the type lives in a leaf module; still importable from here

HUGE_PAGE = 2 * 2**20
MADV_HUGEPAGE = 14  # Linux <sys/mman.h>


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} ({torch.get_num_threads()} threads)"


def huge_page_buffer(floats: int) -> torch.Tensor:
    """A float32 buffer whose memory is advised to use 2 MB pages (before it is first touched):
    one TLB entry per 2 MB instead of per 4 KB. The native decoder keeps its weights in one
    (fewer TLB misses while it streams them; bench/engine_bench.py measures the decode), and
    the bandwidth ceiling is read from one, so it never counts TLB misses the decoder does not
    have. Where the advice is unavailable (not Linux, THP off) the buffer is a plain one."""
    raw = torch.empty(floats + HUGE_PAGE // 4, dtype=torch.float32)
    start = (-raw.data_ptr()) % HUGE_PAGE // 4
    buffer = raw[start:start + floats]
    if sys.platform != "linux":
        return buffer
    try:
        libc = ctypes.CDLL(None)
        libc.madvise(ctypes.c_void_p(buffer.data_ptr()),
                     ctypes.c_size_t(floats * 4 // HUGE_PAGE * HUGE_PAGE), ctypes.c_int(MADV_HUGEPAGE))
    except (OSError, AttributeError):
        pass
    return buffer


def _best_seconds(fn, device: torch.device, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = clock_ms(device)
        fn()
        best = min(best, clock_ms(device) - start)
    return best / 1000.0


def bandwidth_buffer(device: torch.device, megabytes: int = 1024) -> torch.Tensor:
    """A buffer far larger than the caches, random (distinct pages); on the CPU in 2 MB pages,
    as the native decoder's weights are."""
    floats = megabytes * 2**20 // 4
    if device.type == "cpu":
        return huge_page_buffer(floats).uniform_()
    return torch.rand(floats, dtype=torch.float32, device=device)


def read_gb_s(buffer: torch.Tensor) -> float:
    """GB/s of one read of the whole buffer (a sum touches every byte once)."""
    start = clock_ms(buffer.device)
    buffer.sum()
    return buffer.nbytes / ((clock_ms(buffer.device) - start) / 1000.0) / 1e9


SPREAD_S = 1.5  # the bandwidth reads are spread over this many seconds


def measure_bandwidth(device: torch.device, megabytes: int = 1024, repeats: int = 8,
                      spread_s: float = SPREAD_S) -> float:
    """GB/s: the best of `repeats` reads of a `bandwidth_buffer`, spread over `spread_s` seconds.
    Spread, because on a shared VM the reading changes with time, in states that last seconds.
    The ceiling is the best this machine showed, so MBU is never flattered (and `ceilings` keeps
    the best reading ever made)."""
    buffer = bandwidth_buffer(device, megabytes)
    buffer.sum()
    best = 0.0
    for i in range(repeats):
        if i:
            time.sleep(spread_s / max(repeats - 1, 1))
        best = max(best, read_gb_s(buffer))
    return best


def measure_matmul(device: torch.device, dtype: torch.dtype, n: int = 1024, repeats: int = 5) -> float:
    """TFLOP/s of an n×n by n×n matmul (2·n³ FLOPs)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / _best_seconds(lambda: a @ b, device, repeats) / 1e12


def _cache_file() -> Path:
    return cache_root().parent / "ceilings.json"


def cached_ceilings(device: torch.device | str, dtype: torch.dtype | str = torch.float32
                    ) -> Ceilings | None:
    """The stored ceilings for this device and dtype, or None: reads a file, measures nothing."""
    device = torch.device(device)
    if isinstance(dtype, str):
        dtype = resolve_dtype(dtype, device)
    try:
        table = json.loads(_cache_file().read_text())
        return Ceilings(**{**table[_key(device, dtype)], "cached": True})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ceilings(device: torch.device | str, dtype: torch.dtype | str = torch.float32,
             refresh: bool = False, megabytes: int = 1024, n: int = 1024,
             spread_s: float = SPREAD_S) -> Ceilings:
    """The measured ceilings for this machine, device and matmul dtype (a model's weights dtype),
    from the cache unless `refresh`; a refresh keeps the best of the new and the stored figures
    (a ceiling is the best this machine has shown). `megabytes`, `n` and `spread_s` size the
    measurement (see `measure_bandwidth`, `measure_matmul`)."""
    device = torch.device(device)
    if isinstance(dtype, str):
        dtype = resolve_dtype(dtype, device)
    key = _key(device, dtype)
    path = _cache_file()
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if not refresh and key in table:
        return Ceilings(**{**table[key], "cached": True})
    best_read = max((table[k]["bandwidth_gb_s"] for k in _same_device(table, device)), default=0.0)
    result = Ceilings(device=device_name(device),
                      bandwidth_gb_s=max(measure_bandwidth(device, megabytes, spread_s=spread_s),
                                         best_read),
                      matmul_tflop_s=max(measure_matmul(device, dtype, n),
                                         table.get(key, {}).get("matmul_tflop_s", 0.0)),
                      dtype=str(dtype), measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
    table[key] = {k: v for k, v in asdict(result).items() if k != "cached"}
    _write(path, table)
    return result


def raise_bandwidth(device: torch.device | str, gb_s: float) -> bool:
    """Keep a read bandwidth seen elsewhere (e.g. between decode runs) if it beats the stored
    ceiling of this device (every weights dtype: bandwidth does not depend on it): a ceiling
    read in a slow moment would let a fast decode show MBU > 1. Returns whether a ceiling rose
    (never when none is stored yet: nothing is measured unasked)."""
    device = torch.device(device)
    try:
        table = json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return False
    lower = [k for k in _same_device(table, device) if table[k]["bandwidth_gb_s"] < gb_s]
    for k in lower:
        table[k].update(bandwidth_gb_s=gb_s, measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
    if lower:
        _write(_cache_file(), table)
    return bool(lower)


def _same_device(table: dict, device: torch.device) -> list[str]:
    """Keys of `table` measured on this device (any matmul dtype), with this torch."""
    head, tail = _key(device, "*").split(" * ")
    return [k for k in table if k.startswith(head) and k.endswith(tail)]


def _key(device: torch.device, dtype: torch.dtype | str) -> str:
    return f"{device_name(device)} | {device.type} | {dtype} | torch {torch.__version__}"


def _write(path: Path, table: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table, indent=2))
    os.replace(tmp, path)
