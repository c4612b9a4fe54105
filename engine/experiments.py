"""Experiment results computed on a trace, kept with it: a session's record and a "lecture pack".

The app's experiments (timing sweeps, KV cache on vs off, cache variants, the decode-kernel
comparison) take seconds to minutes. `Experiments` holds their results so that a reload restores
them and a downloaded trace file carries them (`meta.json` → `"experiments"`, plain JSON: see
docs/trace-format.md). Reading validates every number, as for the trace itself.

This module sits above the subsystems whose results it holds (kernels, kv, quant, timing); the
trace file format (engine/records/tracefile.py) carries the section as plain JSON and never
imports it, and engine/files.py turns a file's section into an `Experiments`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from .errors import TraceFormatError
from .experiment_checks import MAX_RESULTS, MAX_SERIES, entries, number, series, whole
from .experiments_kv import long_point, needle_from_dict, needle_to_dict, shrink_from_dict, shrink_to_dict
from .kernels.compiled import DecodeComparison
from .kv.cachelab import OnOff, VariantRun
from .kv.kvcache import CacheConfig
from .kv.shrink.needle import LengthPoint, NeedleRun
from .kv.shrink.run import ShrinkRun
from .quant.drift import DriftStudy, drift_from_dict, drift_to_dict
from .quant.study import QuantStudy
from .quant.study_record import study_from_dict, study_to_dict
from .timing.dtype_compare import DtypeComparison, DtypeRun
from .timing.roofline import Work
from .timing.sweeps import SweepPoint

SWEEPS = ("prompt_length", "context", "batch")  # TTFT by prompt, ITL by context, batch throughput


@dataclass(frozen=True, slots=True, eq=False)
class Experiments:
    sweeps: Mapping[str, tuple[SweepPoint, ...]] = field(default_factory=dict)
    cache_on_off: tuple[OnOff, ...] = ()
    cache_variants: tuple[VariantRun, ...] = ()
    decode_comparison: DecodeComparison | None = None
    dtype_comparison: DtypeComparison | None = None
    quant_study: QuantStudy | None = None  # the Quantization page's comparison of weight variants
    quant_drift: DriftStudy | None = None  # the Quantization page's per-layer drift
    cache_shrink: tuple[ShrinkRun, ...] = ()  # the KV page's shrinking methods (engine/kv/shrink)
    long_context: tuple[LengthPoint, ...] = ()  # the unmodified model as the prompt grows
    needle: NeedleRun | None = None  # a needle in a haystack, read by each method

    def __post_init__(self) -> None:
        unknown = set(self.sweeps) - set(SWEEPS)
        if unknown:
            raise ValueError(f"unknown sweeps {sorted(unknown)}")

    @property
    def empty(self) -> bool:
        return not (self.sweeps or self.cache_on_off or self.cache_variants
                    or self.decode_comparison or self.dtype_comparison or self.quant_study
                    or self.quant_drift or self.cache_shrink or self.long_context
                    or self.needle is not None)

    def to_dict(self) -> dict[str, Any]:
        """The plain-JSON section a trace file carries (records.tracefile.ExperimentsSection)."""
        return experiments_to_dict(self)


def experiments_to_dict(found: Experiments) -> dict[str, Any]:
    comparison = found.decode_comparison
    return {
        "sweeps": {name: [[p.size, p.ms, p.tokens_per_s, list(p.repeats_ms)] for p in points]
                   for name, points in found.sweeps.items()},
        "cache_on_off": [on_off_to_dict(r) for r in found.cache_on_off],
        "cache_variants": [{"kind": r.config.kind, "window": r.config.window,
                            "sinks": r.config.sinks, "kl": r.kl.tolist(),
                            "agree": r.agree.tolist(), "kv_bytes": r.kv_bytes.tolist()}
                           for r in found.cache_variants],
        "decode_comparison": None if comparison is None else {
            "prompt_tokens": comparison.prompt_tokens, "new_tokens": comparison.new_tokens,
            "rounds": comparison.rounds, "eager_itl_ms": comparison.eager_itl_ms,
            "compiled_itl_ms": comparison.compiled_itl_ms, "compile_s": comparison.compile_s,
            "same_tokens": comparison.same_tokens, "tokens": list(comparison.tokens),
            "flops": comparison.work.flops, "bytes": comparison.work.bytes,
            "native_itl_ms": comparison.native_itl_ms, "native_note": comparison.native_note,
            "bandwidth_gb_s": comparison.bandwidth_gb_s},
        "dtype_comparison": None if found.dtype_comparison is None else {
            "prompt_tokens": found.dtype_comparison.prompt_tokens,
            "new_tokens": found.dtype_comparison.new_tokens,
            "rounds": found.dtype_comparison.rounds,
            "source_dtype": found.dtype_comparison.source_dtype,
            "runs": [{"dtype": r.dtype, "itl_ms": r.itl_ms, "round_ms": list(r.round_ms),
                      "ratio": r.ratio, "same_tokens": r.same_tokens, "tokens": list(r.tokens)}
                     for r in found.dtype_comparison.runs]},
        "quant_study": None if found.quant_study is None else study_to_dict(found.quant_study),
        "quant_drift": None if found.quant_drift is None else drift_to_dict(found.quant_drift),
        "cache_shrink": [shrink_to_dict(r) for r in found.cache_shrink],
        "long_context": [[p.tokens, p.kv_bytes, p.ttft_ms, p.itl_ms, p.delayed]
                         for p in found.long_context],
        "needle": needle_to_dict(found.needle),
    }


ON_OFF_VERSION = 2  # 1: one round, no version field; 2: every round's total and delay flag


def on_off_to_dict(r: OnOff) -> dict[str, Any]:
    """A KV cache on/off result as the file keeps it (version `ON_OFF_VERSION`)."""
    return {"version": ON_OFF_VERSION, "new_tokens": r.new_tokens, "on_ms": r.on_ms.tolist(),
            "off_ms": r.off_ms.tolist(), "same_tokens": r.same_tokens,
            "on_rounds_ms": list(r.totals(True)), "off_rounds_ms": list(r.totals(False)),
            "on_delayed": list(r.on_delayed), "off_delayed": list(r.off_delayed)}


def _comparison(d: Any) -> DecodeComparison | None:
    if d is None:
        return None
    if not isinstance(d, dict):
        raise TraceFormatError("experiment results: decode_comparison must be an object")
    tokens = d.get("tokens")
    if not isinstance(tokens, list) or len(tokens) > MAX_SERIES:
        raise TraceFormatError("experiment results: decode_comparison tokens must be a list")
    note = d.get("native_note", "")
    if not isinstance(note, str) or len(note) > 1000:
        raise TraceFormatError("experiment results: native_note must be short text")
    return DecodeComparison(
        prompt_tokens=whole(d.get("prompt_tokens"), "prompt_tokens"),
        new_tokens=whole(d.get("new_tokens"), "new_tokens"),
        rounds=whole(d.get("rounds"), "rounds"),
        eager_itl_ms=number(d.get("eager_itl_ms"), "eager ITL", positive=True),
        compiled_itl_ms=number(d.get("compiled_itl_ms"), "compiled ITL", optional=True,
                                positive=True),
        compile_s=number(d.get("compile_s"), "compile time"),
        same_tokens=bool(d.get("same_tokens")),
        tokens=tuple(whole(t, "token") for t in tokens),
        work=Work(number(d.get("flops"), "FLOPs"), number(d.get("bytes"), "bytes")),
        native_itl_ms=number(d.get("native_itl_ms"), "native ITL", optional=True, positive=True),
        native_note=note,
        bandwidth_gb_s=number(d.get("bandwidth_gb_s"), "bandwidth", optional=True))


DTYPES = ("float32", "float16", "bfloat16")


def _dtype_comparison(d: Any) -> DtypeComparison | None:
    if d is None:
        return None
    if not isinstance(d, dict) or d.get("source_dtype") not in DTYPES:
        raise TraceFormatError("experiment results: dtype_comparison must be an object with a "
                               "source dtype")
    runs = entries(d, "runs")
    if not runs or len({r.get("dtype") for r in runs}) != len(runs) \
            or any(r.get("dtype") not in DTYPES for r in runs):
        raise TraceFormatError(f"experiment results: dtype runs must be distinct among "
                               f"{', '.join(DTYPES)}")
    parsed = []
    for r in runs:
        tokens = r.get("tokens")
        if not isinstance(tokens, list) or len(tokens) > MAX_SERIES:
            raise TraceFormatError("experiment results: dtype run tokens must be a list")
        parsed.append(DtypeRun(
            dtype=r["dtype"], itl_ms=number(r.get("itl_ms"), "dtype ITL", positive=True),
            round_ms=tuple(float(v) for v in series(r.get("round_ms"), "dtype round times")),
            ratio=number(r.get("ratio"), "dtype ratio"), same_tokens=bool(r.get("same_tokens")),
            tokens=tuple(whole(t, "token") for t in tokens)))
    return DtypeComparison(
        prompt_tokens=whole(d.get("prompt_tokens"), "prompt_tokens"),
        new_tokens=whole(d.get("new_tokens"), "new_tokens"),
        rounds=whole(d.get("rounds"), "rounds"), source_dtype=d["source_dtype"],
        runs=tuple(parsed))


def _sweep_point(p: list[Any]) -> SweepPoint:
    """[size, median ms, tokens/s] (format 2) or with the repeats' ms as a fourth entry."""
    repeats = p[3] if len(p) == 4 else []
    if not isinstance(repeats, list) or len(repeats) > MAX_RESULTS:
        raise TraceFormatError(f"experiment results: a sweep point has at most {MAX_RESULTS} "
                               "repeats")
    return SweepPoint(whole(p[0], "sweep size"), number(p[1], "sweep ms", positive=True),
                      number(p[2], "sweep tokens/s"),
                      repeats_ms=tuple(number(v, "sweep repeat", positive=True) for v in repeats))


def _rounds(r: Mapping[str, Any], key: str, kind: type, length: int | None) -> tuple:
    """A version-2 list of per-round values ([] for delay flags not measured)."""
    values = r.get(key)
    if kind is bool and values == []:
        return ()
    if not isinstance(values, list) or not 1 <= len(values) <= MAX_RESULTS \
            or (length is not None and len(values) != length):
        raise TraceFormatError(f"experiment results: cache on/off {key} must be a list of 1 to "
                               f"{MAX_RESULTS} values, one per round")
    if kind is bool:
        return tuple(bool(v) for v in series(values, key, bool))
    return tuple(number(v, key, positive=True) for v in values)


def on_off_from_dict(r: Any) -> OnOff:
    """A KV cache on/off result of version 1 (one round) or 2 (rounds and delay flags)."""
    if not isinstance(r, dict):
        raise TraceFormatError("experiment results: a cache on/off result must be an object")
    version = r.get("version", 1)
    if isinstance(version, bool) or version not in (1, ON_OFF_VERSION):
        raise TraceFormatError(f"experiment results: cache on/off results of version "
                               f"{str(version)[:20]} (this app reads 1 to {ON_OFF_VERSION})")
    on_ms = series(r.get("on_ms"), "cache-on times")
    off_ms = series(r.get("off_ms"), "cache-off times", length=len(on_ms))
    if on_ms.sum() <= 0:
        raise TraceFormatError("experiment results: cache-on times must add up to > 0")
    found = OnOff(whole(r.get("new_tokens"), "new tokens"), on_ms, off_ms,
                  bool(r.get("same_tokens")))
    if version == 1:
        return found
    on_rounds = _rounds(r, "on_rounds_ms", float, None)
    on_delayed = _rounds(r, "on_delayed", bool, len(on_rounds))
    off_delayed = _rounds(r, "off_delayed", bool, len(on_rounds))
    if len(on_delayed) != len(off_delayed):
        raise TraceFormatError("experiment results: cache on/off delay flags must be given for "
                               "both runs of every round, or for none")
    return replace(found, on_rounds_ms=on_rounds,
                   off_rounds_ms=_rounds(r, "off_rounds_ms", float, len(on_rounds)),
                   on_delayed=on_delayed, off_delayed=off_delayed)


def experiments_from_dict(data: Any) -> Experiments:
    """Rebuild and check; any damage raises TraceFormatError (never a traceback)."""
    if data is None:
        return Experiments()
    if not isinstance(data, dict):
        raise TraceFormatError("experiment results must be an object")
    try:
        sweeps_in = data.get("sweeps") or {}
        if not isinstance(sweeps_in, dict) or set(sweeps_in) - set(SWEEPS):
            raise TraceFormatError(f"experiment results: sweeps must be among {', '.join(SWEEPS)}")
        sweeps = {}
        for name, points in sweeps_in.items():
            if not isinstance(points, list) or len(points) > MAX_RESULTS \
                    or not all(isinstance(p, list) and len(p) in (3, 4) for p in points):
                raise TraceFormatError(f"experiment results: sweep {name} must be a list of "
                                       "[size, ms, tokens/s, repeats] entries")
            sweeps[name] = tuple(_sweep_point(p) for p in points)
        on_off = [on_off_from_dict(r) for r in entries(data, "cache_on_off")]
        variants = []
        for r in entries(data, "cache_variants"):
            kl = series(r.get("kl"), "KL")
            variants.append(VariantRun(
                CacheConfig(str(r.get("kind")), whole(r.get("window", 0), "window"),
                            whole(r.get("sinks", 0), "sinks")),
                kl, series(r.get("agree"), "agreement", bool, len(kl)),
                series(r.get("kv_bytes"), "KV bytes", length=len(kl))))
        if variants and variants[0].kv_bytes[-1] <= 0:
            raise TraceFormatError("experiment results: the first cache variant's memory must be > 0")
        return Experiments(sweeps, tuple(on_off), tuple(variants),
                           _comparison(data.get("decode_comparison")),
                           _dtype_comparison(data.get("dtype_comparison")),
                           None if data.get("quant_study") is None
                           else study_from_dict(data["quant_study"]),
                           None if data.get("quant_drift") is None
                           else drift_from_dict(data["quant_drift"]),
                           tuple(shrink_from_dict(r) for r in entries(data, "cache_shrink")),
                           tuple(long_point(p) for p in entries(data, "long_context")),
                           needle_from_dict(data.get("needle")))
    except TraceFormatError:
        raise
    except (AttributeError, TypeError, ValueError, ArithmeticError) as err:
        raise TraceFormatError(f"experiment results are damaged: {err}") from err
