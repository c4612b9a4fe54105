"""Ceilings of this machine, measured: memory read bandwidth and matmul FLOP/s.

Small micro-benchmarks (best of a few repeats, synchronized on CUDA), cached per machine and
device in the cache folder, so the roofline is drawn against this machine's own numbers.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .loader import cache_root, resolve_dtype
from .runner import clock_ms


@dataclass(frozen=True, slots=True)
class Ceilings:
    device: str
    bandwidth_gb_s: float  # bytes read per second / 1e9
    matmul_tflop_s: float  # FLOP/s / 1e12
    dtype: str
    measured_at: str
    cached: bool = False

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the two ceilings meet."""
        return self.matmul_tflop_s * 1e12 / (self.bandwidth_gb_s * 1e9)


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


def _best_seconds(fn, device: torch.device, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = clock_ms(device)
        fn()
        best = min(best, clock_ms(device) - start)
    return best / 1000.0


def measure_bandwidth(device: torch.device, megabytes: int = 1024, repeats: int = 8,
                      spread_s: float = 1.5) -> float:
    """GB/s reading a buffer far larger than the caches (a sum touches every byte once): the best
    of `repeats` reads spread over `spread_s` seconds. Spread, because on a shared VM the reading
    changes from second to second (here ~30 GB/s when both vCPUs share a core complex, ~50 GB/s
    when they do not): the ceiling is the best this machine showed, so MBU is never flattered."""
    x = torch.rand(megabytes * 2**20 // 4, dtype=torch.float32, device=device)  # distinct pages
    x.sum()
    best = float("inf")
    for i in range(repeats):
        if i:
            time.sleep(spread_s / max(repeats - 1, 1))
        start = clock_ms(device)
        x.sum()
        best = min(best, clock_ms(device) - start)
    return x.nbytes / (best / 1000.0) / 1e9


def measure_matmul(device: torch.device, dtype: torch.dtype, n: int = 1024, repeats: int = 5) -> float:
    """TFLOP/s of an n×n by n×n matmul (2·n³ FLOPs)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n**3 / _best_seconds(lambda: a @ b, device, repeats) / 1e12


def _cache_file() -> Path:
    return cache_root().parent / "ceilings.json"


def ceilings(device: torch.device | str, dtype: torch.dtype | str = torch.float32,
             refresh: bool = False, megabytes: int = 1024, n: int = 1024) -> Ceilings:
    """The measured ceilings for this machine, device and matmul dtype (a model's weights dtype),
    from the cache unless `refresh`."""
    device = torch.device(device)
    if isinstance(dtype, str):
        dtype = resolve_dtype(dtype, device)
    key = f"{device_name(device)} | {device.type} | {dtype} | torch {torch.__version__}"
    path = _cache_file()
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if not refresh and key in table:
        return Ceilings(**{**table[key], "cached": True})
    result = Ceilings(device=device_name(device),
                      bandwidth_gb_s=measure_bandwidth(device, megabytes),
                      matmul_tflop_s=measure_matmul(device, dtype, n), dtype=str(dtype),
                      measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
    table[key] = {k: v for k, v in asdict(result).items() if k != "cached"}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table, indent=2))
    os.replace(tmp, path)
    return result
