"""Ceilings: the measured memory read bandwidth and matmul FLOP/s a roofline is drawn against.

A leaf module (no torch, no other engine module), so the roofline, the charts and the trace file
can name the type without importing the micro-benchmarks that measure it (engine/kernels/microbench.py).
"""

from __future__ import annotations

from dataclasses import dataclass


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
