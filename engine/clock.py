"""Clocks for timing a step honestly: wall time, this process's CPU time, and what the rest of the
machine did meanwhile.

When other programs want the same cores as a decode step, the step's wall time can grow many
times over while its work stays the same, and the chart would teach the wrong lesson. So each step
records, besides its wall time, the CPU time this process got and the share of the machine's CPU
time that *other* processes used in the same interval (Linux `/proc/stat` minus
`/proc/self/stat`; None elsewhere). A leaf module: no engine imports.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# The tick counters count in steps of 1/_CLOCK_TICKS s (10 ms): readings less than one tick apart
# are one reading, shared by every thread of the process (a server's batch of runs samples them
# at every step of every run, and each reading is two files that /proc writes out in full).
SHARE_S = 1 / _CLOCK_TICKS
_last_ticks: tuple[float, tuple[int, int] | None, int | None] = (float("-inf"), None, None)


def clock_ms(device: torch.device) -> float:
    """Wall clock in ms; on CUDA, synchronize first so queued kernels are counted."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() * 1000.0


def process_cpu_ms() -> float:
    """CPU time of this process, all threads, in ms (torch's worker threads included)."""
    return time.process_time() * 1000.0


def _machine_ticks() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot; steal time counts as busy (a hypervisor
    that takes the core delays us as much as a neighbour does)."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != b"cpu":
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def _ticks() -> tuple[tuple[int, int] | None, int | None]:
    """(machine ticks, own ticks), read afresh at most every SHARE_S."""
    global _last_ticks
    at, machine, own = _last_ticks
    now = time.monotonic()
    if now - at >= SHARE_S:
        machine, own = _machine_ticks(), _own_ticks()
        _last_ticks = (now, machine, own)  # one assignment: threads see the old or the new
    return machine, own


def _own_ticks() -> int | None:
    """User + system clock ticks of this process (children excluded)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2:].split()  # the name in parentheses may contain spaces
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the line)


@dataclass(frozen=True, slots=True)
class MachineSample:
    """A point in time: wall ms, this process's CPU ms, and the machine's tick counters."""

    wall_ms: float
    cpu_ms: float
    ticks: tuple[int, int] | None
    own_ticks: int | None

    @classmethod
    def now(cls, device: torch.device, fresh: bool = False) -> "MachineSample":
        """`fresh`: the tick counters read now, not the per-SHARE_S cache (the two ends of a
        stretch of work shorter than SHARE_S would otherwise read the same counters)."""
        wall = clock_ms(device)
        ticks = (_machine_ticks(), _own_ticks()) if fresh else _ticks()
        return cls(wall, process_cpu_ms(), *ticks)


def others_share(before: MachineSample, after: MachineSample) -> float | None:
    """Fraction (0–1) of all CPUs' time between two samples that other processes used:
    (machine busy ticks − this process's ticks) / machine ticks. None where /proc is missing or
    the interval is under one tick."""
    if before.ticks is None or after.ticks is None or before.own_ticks is None \
            or after.own_ticks is None:
        return None
    total = after.ticks[1] - before.ticks[1]
    if total <= 0:
        return None
    others = (after.ticks[0] - before.ticks[0]) - (after.own_ticks - before.own_ticks)
    return min(max(others / total, 0.0), 1.0)


def load_average() -> float | None:
    """The 1-minute load average (runnable processes), None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
