"""A serving engine's Prometheus /metrics, read with prometheus_client's own parser (never by
hand), into the few numbers the explorer shows; and histogram arithmetic (the change over a load,
its mean and quantiles, as Prometheus's histogram_quantile computes them).

The names are vLLM's (docs: "Production Metrics"); a server that lacks one gets None for it.
Counters are summed over label sets (one per model and engine), gauges too, except KV usage,
which is a fraction per engine and is averaged.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from .record import Histogram, MetricsSample

GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
          "kv_usage": "vllm:kv_cache_usage_perc"}
COUNTERS = {"preemptions": "vllm:num_preemptions", "prefix_queries": "vllm:prefix_cache_queries",
            "prefix_hits": "vllm:prefix_cache_hits",
            "spec_drafts": "vllm:spec_decode_num_draft_tokens",
            "spec_accepted": "vllm:spec_decode_num_accepted_tokens",
            "generation_tokens": "vllm:generation_tokens"}
HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds",
              "itl": "vllm:inter_token_latency_seconds"}


MAX_VALUE = float(1 << 53)


class MetricsFormatError(ValueError):
    """The text is not Prometheus exposition format."""


def parse_metrics(text: str, t_ms: float) -> MetricsSample:
    """One sample from a /metrics body; MetricsFormatError if it is not Prometheus text."""
    values: dict[str, list[float]] = {}
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    wanted_hist = set(HISTOGRAMS.values())
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name
                if family.name in wanted_hist:
                    if name.endswith("_bucket"):
                        bound = float(sample.labels.get("le", "nan"))
                        per = buckets.setdefault(family.name, {})
                        per[bound] = per.get(bound, 0.0) + sample.value
                    elif name.endswith("_sum"):
                        sums[family.name] = sums.get(family.name, 0.0) + sample.value
                    elif name.endswith("_count"):
                        counts[family.name] = counts.get(family.name, 0.0) + sample.value
                elif family.type == "counter" and name == family.name + "_total":
                    values.setdefault(family.name, []).append(sample.value)
                elif family.type == "gauge" and name == family.name:
                    values.setdefault(family.name, []).append(sample.value)
    except (ValueError, TypeError, IndexError, KeyError) as error:
        raise MetricsFormatError(f"not Prometheus text ({str(error)[:120]})") from None

    def total(name: str) -> float | None:
        found = values.get(name)
        return _sane(float(sum(found))) if found else None

    kv = [v for v in values.get(GAUGES["kv_usage"], ()) if _sane(v) is not None and v <= 1]
    hists: dict[str, Histogram | None] = {}
    for key, name in HISTOGRAMS.items():
        if name in buckets and name in counts:
            bounds = tuple(sorted(b for b in buckets[name] if not math.isnan(b)))
            hists[key] = _sane_histogram(Histogram(
                bounds, tuple(buckets[name][b] for b in bounds), sums.get(name, 0.0),
                counts[name]))
        else:
            hists[key] = None
    return MetricsSample(
        t_ms, total(GAUGES["running"]), total(GAUGES["waiting"]),
        float(sum(kv) / len(kv)) if kv else None,
        *(total(COUNTERS[k]) for k in ("preemptions", "prefix_queries", "prefix_hits",
                                        "spec_drafts", "spec_accepted", "generation_tokens")),
        hists["ttft"], hists["itl"])


def _sane(value: float) -> float | None:
    """A gauge or counter as a record may hold it: finite, not negative, below 2⁵³ (else None:
    the server said something no engine state can be)."""
    return value if math.isfinite(value) and 0 <= value < MAX_VALUE else None


def _sane_histogram(h: Histogram) -> Histogram | None:
    """None unless bounds are ≥ 0 (+inf last allowed, finite ones below a day) and the counts
    cumulative, with sane numbers throughout."""
    finite = [b for b in h.bounds if not math.isinf(b)]
    if any(not 0 <= b < 86_400 for b in finite) or any(b < 0 for b in h.bounds):
        return None
    numbers = (*h.counts, h.sum, h.count)
    if any(_sane(v) is None for v in numbers) or list(h.counts) != sorted(h.counts):
        return None
    return h


def kv_cache_config(text: str) -> tuple[int | None, int | None]:
    """(tokens per KV block, blocks in the pool) from vLLM's `cache_config_info` labels (None where
    the server does not say): what its KV-cache usage % is a fraction of."""
    def whole(value: str | None) -> int | None:
        if value is None or not value.isdigit() or len(value) > 10:
            return None
        return int(value) if 1 <= int(value) < 1 << 31 else None

    try:
        for family in text_string_to_metric_families(text):
            if family.name == "vllm:cache_config_info":
                for sample in family.samples:
                    labels = sample.labels
                    return whole(labels.get("block_size")), whole(labels.get("num_gpu_blocks"))
    except (ValueError, TypeError, IndexError, KeyError):
        pass
    return None, None


def histogram_delta(before: Histogram | None, after: Histogram | None) -> Histogram | None:
    """What was observed between two scrapes (None if either lacks it or the buckets differ)."""
    if before is None or after is None or before.bounds != after.bounds:
        return None
    return Histogram(after.bounds, tuple(b - a for a, b in zip(before.counts, after.counts)),
                     after.sum - before.sum, after.count - before.count)


def histogram_mean_ms(h: Histogram | None) -> float | None:
    if h is None or h.count <= 0:
        return None
    return 1000.0 * h.sum / h.count


def histogram_quantile_ms(q: float, h: Histogram | None) -> float | None:
    """Prometheus's histogram_quantile: find the bucket holding rank q·count and interpolate
    linearly inside it (the lowest bucket from 0). Resolution is the bucket width — coarse."""
    if h is None or h.count <= 0 or not h.bounds:
        return None
    total = h.counts[-1] if math.isinf(h.bounds[-1]) else h.count  # as Prometheus: the +Inf bucket
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(h.bounds, h.counts):
        if count >= rank:
            if math.isinf(bound):
                return 1000.0 * lower_bound
            width = count - lower_count
            fraction = (rank - lower_count) / width if width > 0 else 1.0
            return 1000.0 * (lower_bound + (bound - lower_bound) * fraction)
        lower_bound, lower_count = bound, count
    return 1000.0 * lower_bound
