"""ModelStore: the models visitors chose, each loaded once, within a memory cap.

Each visitor's (source, weights) choice maps to its own entry, so one visitor switching to q4_0
never swaps the model under another visitor's run (the old single shared model did). The weights
are a variant name (engine/quant/variants.py): fp32, fp16 and bf16 load the model in that dtype;
the integer variants (int8, q4_0, q4_1, …) are `apply_variant` copies of the fp32 entry, with
their native decoder built at the same time (it reads the stored codes; the copy holds them
dequantized for everything torch runs: the prefill, the pages' own forwards). Entries are
kept least-recently-used first out once their weights pass `max_bytes`; a model a session still
holds stays alive with that session (Python frees it when the last run drops it), so the cap bounds
what the store keeps, not what running sessions hold. The process's one compiled decoder lives here
too (a compiled graph's frozen weights must belong to the model that asks for it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from i18n import N_, _

from .errors import EngineError
from .loader import LoadedModel, is_mapped_model, load_model
from .records.trace import Trace
from .settings import FLOAT_DTYPES, GenerationSettings, weights_name

Key = tuple[str, str]  # (source, weights variant)
NATIVE_TOKENS = 256  # default size of a shared native decoder's cache (prompt + answer)
WARM_PROMPT = "Hello."
WARM_TOKENS = 4  # decode steps of `warm_up`'s run: the first few are the slow ones


@dataclass(eq=False)
class ModelEntry:
    """A loaded model and what is built from it on first use (each built once, under a lock).

    `weights` is the variant `lm` holds and `weight_bytes` its stored bytes, measured
    (`WeightReport.nbytes`; None: the loaded tensors', `lm.spec.weight_bytes`).
    """

    lm: LoadedModel
    extras: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    weights: str = "fp32"
    weight_bytes: int | None = None
    native_tokens: int = NATIVE_TOKENS

    @property
    def stored_bytes(self) -> int:
        return self.lm.spec.weight_bytes if self.weight_bytes is None else self.weight_bytes

    def native(self) -> Any:
        """The shared native decoder for these weights (built once: packing and, the first time
        on this machine, compiling take seconds — call it inside the model turn); raises
        EngineError with the one-line reason it cannot run."""
        def build(lm: LoadedModel) -> Any:
            problem = self.native_problem()
            if problem is not None:
                return EngineError(problem)
            try:
                return native_decoder(lm, self.weights, self.native_tokens)
            except EngineError as err:
                return err  # remembered: the reason is shown, the build is not retried

        got = self.extra("native", build)
        if isinstance(got, EngineError):
            raise EngineError(str(got))
        return got

    def batcher(self, turn: Any = None, **options: Any) -> Any:
        """The shared StepBatcher of these weights (engine/serving/batcher.py: live runs decoded
        in one batch), built once with `turn` and `options` on the weights the native step's
        prefill runs on (its variant's copy); raises EngineError saying why it cannot run."""
        from .serving.batcher import StepBatcher
        from .serving.model_runner import serving_problem

        try:  # outside `extra`'s lock, which building the native decoder takes too
            model = self.native().model
        except EngineError:
            model = self.lm.model

        def build(lm: LoadedModel) -> Any:
            problem = serving_problem(lm)
            if problem is not None:
                return EngineError(problem)
            weight_bytes = sum(p.nbytes for p in model.parameters())  # tied ones once
            return StepBatcher(lm, model, self.weights, weight_bytes, turn=turn, **options)

        got = self.extra("batcher", build)
        if isinstance(got, EngineError):
            raise EngineError(str(got))
        return got

    def native_problem(self) -> str | None:
        """Why the native step cannot run these weights (one line), or None — without building
        the decoder (cheap: for the sidebar)."""
        got = self.extras.get("native")  # no lock: a build under way must not block the sidebar
        if isinstance(got, EngineError):
            return str(got)
        if got is not None:
            return None
        return decoder_problem(self.lm, self.weights)

    def extra(self, name: str, build: Callable[[LoadedModel], Any]) -> Any:
        """`build(lm)` once per entry (the native decoder, the embedding index…)."""
        with self._lock:
            if name not in self.extras:
                self.extras[name] = build(self.lm)
            return self.extras[name]

    @property
    def nbytes(self) -> int:
        """The weights, plus what extras report holding (the native decoder's packed copy…)."""
        with self._lock:
            extras = sum(getattr(x, "nbytes", 0) for x in self.extras.values())
        return self.lm.spec.weight_bytes + int(extras)


MAPPED_VARIANTS = N_("a model opened from a GGUF file runs on the file's own blocks, as stored; "
                     "the weights variants are copies of the default model's float32 weights")


def on_file_blocks(lm: LoadedModel, weights: str) -> bool:
    """Whether the native step decodes on a GGUF file's own blocks: a model opened from a .gguf
    on the CPU (memory-mapped, engine/gguf/mapped.py), with the weights as loaded."""
    from .kernels.stored_decoder import is_mapped

    return is_mapped(lm) and weights_name(weights) == "fp32"


def decoder_problem(lm: LoadedModel, weights: str) -> str | None:
    """Why the native step cannot run these weights (one line), or None. A model opened from a
    GGUF on the CPU decodes on its mapped blocks (kernels/stored_decoder.py), as loaded."""
    from .kernels.stored_decoder import is_mapped, stored_problem

    if is_mapped(lm):
        return stored_problem(lm) if weights_name(weights) == "fp32" else MAPPED_VARIANTS
    from .kernels.native import native_problem

    return native_problem(lm, weights)


def native_decoder(lm: LoadedModel, weights: str = "fp32", max_tokens: int = NATIVE_TOKENS) -> Any:
    """The native decoder of `lm`'s weights: the C step on a GGUF file's mapped blocks, or on
    the packed torch weights; EngineError with the one-line reason it cannot run."""
    from .kernels.stored_decoder import StoredDecoder, is_mapped

    if is_mapped(lm):
        problem = decoder_problem(lm, weights)
        if problem:
            raise EngineError(problem)
        return StoredDecoder(lm, max_tokens=max_tokens)
    from .kernels.native import NativeDecoder

    return NativeDecoder(lm, max_tokens=max_tokens, weights=weights)


@dataclass(frozen=True, slots=True, eq=False)
class WeightsVariant:
    """A variant of a loaded float32 model: the torch model holding its weights (dequantized to
    float32), its stored bytes (measured), and its native decoder or why there is none."""

    lm: LoadedModel
    weights: str
    weight_bytes: int
    native: Any  # a NativeDecoder, or None
    native_problem: str | None


def build_variant(base: LoadedModel, weights: str, native_tokens: int = NATIVE_TOKENS,
                  with_native: bool = True) -> WeightsVariant:
    """`apply_variant(base, weights)`'s copy and its native decoder over that copy (the copy's
    weights lie on the variant's grid, so the decoder packs its codes losslessly and its steps
    equal a torch forward of the copy); fp32 of a model opened from a GGUF file decodes on the
    file's blocks (`native_decoder`). Needs the model lock: it quantizes every matrix."""
    from .kernels.native import NativeDecoder, native_problem
    from .quant.apply import apply_variant
    from .quant.kmix import K_VARIANTS

    if weights in FLOAT_DTYPES and weights != "fp32":
        raise EngineError(f"{weights} weights load the model in {FLOAT_DTYPES[weights]}: no copy")
    if weights != "fp32" and is_mapped_model(base.model):  # no float32 weights to copy
        raise EngineError(_(MAPPED_VARIANTS))
    if with_native and weights in K_VARIANTS and native_problem(base, weights) is None:
        # A K-quant copy does not always requantize to its own blocks (the Q4_K / Q6_K searches
        # land elsewhere on a few rows of SmolLM2), so the decoder makes the copy itself and
        # packs the blocks it was dequantized from.
        try:
            native = NativeDecoder(base, max_tokens=native_tokens, weights=weights)
            return WeightsVariant(native.lm, weights, native.report.nbytes, native, None)
        except EngineError:
            pass  # the copy alone, below, and the reason
    if weights == "fp32":
        lm, nbytes = base, base.spec.weight_bytes
    else:
        copy, report = apply_variant(base, weights)
        lm, nbytes = replace(base, model=copy), report.nbytes
    native, problem = None, decoder_problem(lm, weights)
    if with_native and problem is None:
        try:
            native = native_decoder(lm, weights, native_tokens)
        except EngineError as err:
            problem = str(err)
    return WeightsVariant(lm, weights, nbytes, native, problem)


def warm_up(entry: ModelEntry, settings: GenerationSettings | None = None,
            prompt: str = WARM_PROMPT) -> Trace:
    """One short run on the entry, as a visitor's first one runs (its native decoder built, the
    decode steps on it where it can run): what only a model's first run pays — packing the native
    step and, the first time on this machine, compiling it; torch's first prefill — is paid here
    and not by the first visitor. It runs the shared native decoder: call it holding the model
    turn, like any run. Returns the run's trace."""
    from .runner import Run

    settings = settings or GenerationSettings(max_new_tokens=WARM_TOKENS)
    native, problem = None, None
    if settings.decoder == "native":
        try:
            native = entry.native()
        except EngineError as err:
            problem = str(err)
    return Run(entry.lm, prompt, settings, native=native, native_problem=problem,
               weights=entry.weights).run_all()


def _variant_entry(base: LoadedModel, weights: str, native_tokens: int) -> ModelEntry:
    built = build_variant(base, weights, native_tokens)
    entry = ModelEntry(built.lm, weights=weights, weight_bytes=built.weight_bytes,
                       native_tokens=native_tokens)
    entry.extras["native"] = built.native if built.native is not None else EngineError(
        built.native_problem or "the native decoder is unavailable")
    return entry


class ModelStore:
    """Entries by (source, weights); `loader(source, dtype=…)` loads the float ones, `variant(base
    lm, weights, native_tokens)` builds the others from the fp32 entry; `native_tokens` sizes the
    shared native decoders' caches."""

    def __init__(self, max_bytes: int, loader: Callable[..., LoadedModel] = load_model,
                 native_tokens: int = NATIVE_TOKENS,
                 variant: Callable[[LoadedModel, str, int], ModelEntry] = _variant_entry) -> None:
        self.max_bytes = max_bytes
        self.native_tokens = native_tokens
        self._loader = loader
        self._variant = variant
        self._entries: OrderedDict[Key, ModelEntry] = OrderedDict()
        self._loading: dict[Key, threading.Lock] = {}
        self._lock = threading.Lock()
        self._compiled: tuple[Key, Any] | None = None
        self._failed: dict[Key, Exception] = {}
        self._background: set[Key] = set()

    def _build(self, source: str, weights: str) -> ModelEntry:
        if weights in FLOAT_DTYPES:
            return ModelEntry(self._loader(source, dtype=FLOAT_DTYPES[weights]), weights=weights,
                              native_tokens=self.native_tokens)
        from .quant import VARIANT_NAMES

        if weights not in VARIANT_NAMES and not weights.startswith("awq_"):
            raise EngineError(f"unknown weights {weights!r}: use one of {', '.join(VARIANT_NAMES)}")
        base = self.get(source, "fp32").lm
        if base.gguf_tensors is not None:
            raise EngineError(_(MAPPED_VARIANTS))
        return self._variant(base, weights, self.native_tokens)

    def get(self, source: str, weights: str) -> ModelEntry:
        """The entry for this choice, loading it if needed (one load per key, even when several
        sessions ask at once); raises what `load_model` raises (EngineError for a bad choice).
        `weights`: a variant name (or a dtype name: float16 = fp16)."""
        key = (source, weights_name(weights))
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            gate = self._loading.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    return self._entries[key]
            try:
                entry = self._build(*key)
            finally:
                with self._lock:
                    self._loading.pop(key, None)  # a failed load leaves nothing behind
            with self._lock:
                self._entries[key] = entry
                self._evict(keep=key)
            return entry

    def entries(self) -> list[ModelEntry]:
        """The loaded entries (a snapshot; their order of use unchanged)."""
        with self._lock:
            return list(self._entries.values())

    def peek(self, source: str, weights: str) -> ModelEntry | None:
        """The entry if it is loaded (now the most recently used); never loads, never waits."""
        key = (source, weights_name(weights))
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
            return self._entries.get(key)

    def load_in_background(self, source: str, weights: str) -> None:
        """Start loading in a thread (once: a load under way is not started again); a failure
        is kept for `failure()`. For a page that must draw before the model is ready."""
        key = (source, weights_name(weights))
        with self._lock:
            if key in self._entries or key in self._loading or key in self._background:
                return
            self._failed.pop(key, None)
            self._background.add(key)

        def load() -> None:
            try:
                self.get(*key)
            except Exception as err:  # noqa: BLE001 — reported to the page by failure()
                with self._lock:
                    self._failed[key] = err
            finally:
                with self._lock:
                    self._background.discard(key)

        threading.Thread(target=load, name=f"load {source} {key[1]}", daemon=True).start()

    def failure(self, source: str, weights: str) -> Exception | None:
        with self._lock:
            return self._failed.get((source, weights_name(weights)))

    def _evict(self, keep: Key) -> None:
        while sum(e.nbytes for e in self._entries.values()) > self.max_bytes:
            oldest = next((k for k in self._entries if k != keep), None)
            if oldest is None:
                return
            del self._entries[oldest]
            if self._compiled is not None and self._compiled[0] == oldest:
                self._compiled = None

    def compiled(self, key: Key, build: Callable[[LoadedModel], Any]) -> Any:
        """The one compiled decoder, for `key`'s model (a new key replaces the old one). Not
        remembered if the model was evicted meanwhile: the caller still gets a working one."""
        key = (key[0], weights_name(key[1]))
        entry = self.get(*key)
        with self._lock:
            if self._compiled is None or self._compiled[0] != key:
                decoder = build(entry.lm)
                if key not in self._entries:
                    return decoder
                self._compiled = (key, decoder)
            return self._compiled[1]

    @property
    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._entries)
