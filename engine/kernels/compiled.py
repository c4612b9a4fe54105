"""Compiled decode: the same decode step through `torch.compile`, next to the eager one (and
the hand-written C one of engine/kernels/native.py, when `compare_decode` is given it).

Why: on a CPU a small model's eager decode step is far from the memory roof, and the reason is
the kernels, not the bytes. PyTorch calls MKL's sgemm, tuned for many rows, with a one-row
matrix, and thousands of small ops add Python overhead between them. Inductor with freezing and
max-autotune generates matrix-vector kernels for this CPU's vector units from its C++ GEMM
template, and fuses the small ops. The bytes per token do not change — only how close the step
gets to the bandwidth ceiling (MBU), which the Timing page and bench/engine_bench.py measure.

gpt-fast style: a StaticCache (fixed shapes, so the graph compiles once), an eager prefill, and a
compiled one-token decode step; the eager baseline runs the very same function uncompiled on the
same cache, so the comparison isolates the compiler. The compiled graph holds a packed copy of
the weights (frozen constants): about one more model's worth of memory. A model opened from a
GGUF file is not compiled (`COMPILE_MAPPED`): its matrices are multiplied by C kernels on the
file's blocks, which dynamo cannot trace, and freezing them would be that float copy; its eager
step still runs against the native one.
"""

from __future__ import annotations

import shutil
import statistics
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import StaticCache

from i18n import N_, _

from ..errors import EngineError, InputError
from ..forward import prefill, timed_greedy
from ..loader import LoadedModel, is_mapped_model
from ..timing.roofline import Work, forward_work
from .microbench import bandwidth_buffer, read_gb_s
from .native import NativeDecoder

# Inductor options for the CPU: freeze weights as constants (lets it pre-pack them) and autotune
# each matmul between its C++ GEMM template and ATen (MKL). Passed through `config.patch` around
# every call: `torch.compile(options=…)` did not switch freezing on in torch 2.13 (measured: no
# speedup), the patched global config did.
CPU_INDUCTOR = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
STATIC_CACHE_TOKENS = 256  # fixed cache length: one compiled graph for every prompt that fits
COMPILE_MAPPED = N_("torch.compile cannot compile a model opened from a GGUF file: its matrices are "
                    "multiplied on the file's stored blocks by C kernels the compiler cannot "
                    "trace. Eager and native C compare here; the default model compiles.")

Progress = Callable[[str, float], None]


def compile_problem(device: torch.device) -> str | None:
    """Why compiling cannot work here (one line), or None. On the CPU inductor builds C++."""
    if device.type != "cpu":
        return None
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "compiling for the CPU needs a C++ compiler (g++ or clang++); none was found"
    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").exists():
        return "compiling for the CPU needs the Python headers (Python.h, e.g. python3-dev)"
    return None


@dataclass(frozen=True, slots=True)
class DecodeComparison:
    """Eager, compiled and native decode of the same greedy continuation, in paired rounds."""

    prompt_tokens: int
    new_tokens: int
    rounds: int
    eager_itl_ms: float  # median over rounds of each round's median decode step
    compiled_itl_ms: float | None  # None: not compiled in this comparison
    compile_s: float  # the first compiled call: tracing, autotuning, C++ build (0 when reused)
    same_tokens: bool  # every contestant's greedy tokens == eager's, in every round
    tokens: tuple[int, ...]
    work: Work  # roofline.forward_work at the middle decode step (FLOPs, bytes moved)
    native_itl_ms: float | None = None  # the hand-written C step (engine/kernels/native.py); None: not run
    native_note: str = ""  # why the native step did not run, if it did not
    bandwidth_gb_s: float | None = None  # best read bandwidth between the runs (None: not read)

    def __post_init__(self) -> None:
        if any(ms is not None and ms <= 0 for ms in
               (self.eager_itl_ms, self.compiled_itl_ms, self.native_itl_ms)):
            raise ValueError("step times must be positive")

    @property
    def steps(self) -> dict[str, float]:
        """Contestant → median ITL (ms), eager first; only those that ran."""
        found = {"eager": self.eager_itl_ms, "compiled": self.compiled_itl_ms,
                 "native C": self.native_itl_ms}
        return {name: ms for name, ms in found.items() if ms is not None}

    def speedup(self, name: str) -> float:
        """How many times faster per token than eager."""
        return self.eager_itl_ms / self.steps[name]


_epoch = 0  # bumped whenever a new decoder resets dynamo: older decoders must compile again


class CompiledDecoder:
    """A static KV cache and a compiled decode step for one loaded model (compiled on first use).

    One live decoder per process: the frozen weights are constants of the compiled graph, and
    dynamo's guards compare only tensor shapes, so a graph compiled for one model would serve
    another of the same shapes with the first one's weights (a test caught it). Creating a
    decoder therefore resets dynamo, dropping every earlier graph and its packed weights.
    """

    def __init__(self, lm: LoadedModel, max_tokens: int = STATIC_CACHE_TOKENS) -> None:
        global _epoch
        torch._dynamo.reset()
        _epoch += 1
        self._epoch, self._compiled_in = _epoch, -1
        self.lm, self.max_tokens = lm, max_tokens
        self.cache = StaticCache(config=lm.model.config, max_cache_len=max_tokens)
        self._compiled = torch.compile(self._decode, dynamic=False, fullgraph=True)

    @property
    def compiled(self) -> bool:
        """Compiled, and no newer decoder has reset dynamo since."""
        return self._compiled_in == _epoch

    def _decode(self, token: torch.Tensor) -> torch.Tensor:
        """(1, 1) token → (V,) logits; writes its K/V at the cache's next position."""
        out = self.lm.model(input_ids=token, cache=self.cache, use_cache=True)
        return out.logits[0, -1]

    def _call(self, token: torch.Tensor, compiled: bool) -> torch.Tensor:
        if not compiled:
            return self._decode(token)
        if self._epoch != _epoch:
            raise EngineError("a newer compiled decoder replaced this one; create it again")
        if self.lm.device.type == "cpu":
            import torch._inductor.config as inductor_config

            with inductor_config.patch(CPU_INDUCTOR):
                return self._compiled(token)
        return self._compiled(token)

    @torch.inference_mode()
    def greedy(self, prompt_ids: list[int], new_tokens: int,
               compiled: bool) -> tuple[list[int], list[float]]:
        """Eager prefill, then greedy decode steps; returns the tokens and each decode step's ms."""
        if len(prompt_ids) + new_tokens > self.max_tokens:
            raise InputError(f"prompt ({len(prompt_ids)}) + new tokens ({new_tokens}) exceed the "
                             f"static cache of {self.max_tokens} tokens")
        device = self.lm.device
        self.cache.reset()
        first, _ = prefill(self.lm.model, torch.tensor([prompt_ids], device=device), self.cache)
        return timed_greedy(first, lambda token, _i: self._call(
            torch.tensor([[token]], device=device), compiled), new_tokens, device)

    def compile(self, prompt_ids: list[int]) -> float:
        """Trigger the compilation (first call); returns its seconds, 0 if it was already done."""
        if self.compiled:
            return 0.0
        if self._epoch != _epoch:
            raise EngineError("a newer compiled decoder replaced this one; create it again")
        if is_mapped_model(self.lm.model):
            raise EngineError(_(COMPILE_MAPPED))
        problem = compile_problem(self.lm.device)
        if problem:
            raise EngineError(problem)
        start = time.perf_counter()
        try:
            self.greedy(prompt_ids, 3, compiled=True)
        except EngineError:
            raise
        except Exception as err:  # inductor's failures are long; the user gets the first line
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise EngineError(f"torch.compile failed: {first}") from err
        self._compiled_in = _epoch
        return time.perf_counter() - start


def compare_decode(decoder: CompiledDecoder, prompt_ids: list[int], new_tokens: int = 32,
                   rounds: int = 3, say: Progress | None = None, compile: bool = True,
                   native: NativeDecoder | None = None, native_note: str = "",
                   bandwidth_mb: int = 1024) -> DecodeComparison:
    """Eager decode on the static cache against the compiled step (compiled once, if `compile`)
    and the native C step (if given): each round runs every contestant once, the order rotating
    from round to round, so a drift of the shared machine touches all of them alike. Each run
    is bracketed by reads of a `bandwidth_mb` buffer (0: none): the best one is kept, so the
    ceiling a fast run is compared with comes from the same stretch of time."""
    if new_tokens < 2 or rounds < 1:
        raise InputError("the comparison needs at least 2 new tokens and 1 round")
    say = say or (lambda _text, _fraction: None)
    compile_s = 0.0
    if compile:
        say("Compiling the decode step (the first time takes minutes on a laptop CPU)…", 0.0)
        compile_s = decoder.compile(prompt_ids)
    runs: dict[str, Callable[[], tuple[list[int], list[float]]]] = {
        "eager": lambda: decoder.greedy(prompt_ids, new_tokens, False)}
    if compile:
        runs["compiled"] = lambda: decoder.greedy(prompt_ids, new_tokens, True)
    if native is not None:
        runs["native C"] = lambda: native.greedy(prompt_ids, new_tokens)
    medians: dict[str, list[float]] = {name: [] for name in runs}
    tokens, same = (), True
    names = list(runs)
    buffer = bandwidth_buffer(decoder.lm.device, bandwidth_mb) if bandwidth_mb else None
    reads: list[float] = []
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if buffer is not None:
                reads.append(read_gb_s(buffer))
            got, times = runs[name]()
            medians[name].append(statistics.median(times))
            tokens = tokens or tuple(got)
            same = same and tuple(got) == tokens
        say(f"Round {r + 1} of {rounds}: " + ", ".join(
            f"{name} {ms[-1]:.1f} ms" for name, ms in medians.items()) + " per token",
            (r + 1) / rounds)
    if buffer is not None:
        reads.append(read_gb_s(buffer))
    itl = {name: statistics.median(ms) for name, ms in medians.items()}
    middle = len(prompt_ids) + new_tokens // 2
    return DecodeComparison(
        prompt_tokens=len(prompt_ids), new_tokens=new_tokens, rounds=rounds,
        eager_itl_ms=itl["eager"], compiled_itl_ms=itl.get("compiled"), compile_s=compile_s,
        same_tokens=same, tokens=tokens, work=forward_work(decoder.lm.spec, 1, middle - 1),
        native_itl_ms=itl.get("native C"), native_note=native_note,
        bandwidth_gb_s=max(reads) if reads else None)
