"""What a load showed, computed once for the page, the CLI and the bench: the client's latency
percentiles, the server's own view over the same interval (its counters and histograms, the last
/metrics sample minus the first), and the difference between the two.

The client's TTFT includes what the server's cannot: the HTTP request, tokenizing and queueing
in the API process, and the trip back. The server's histograms have bucket resolution only
(Prometheus's histogram_quantile), so their means are compared, and quantiles shown as "≈".
"""

from __future__ import annotations

from dataclasses import dataclass

from ..timing.metrics import percentile
from .prometheus import histogram_delta, histogram_mean_ms, histogram_quantile_ms
from .record import LoadRun, MetricsSample


@dataclass(frozen=True, slots=True)
class ClientStats:
    requests_done: int
    output_tokens: int
    throughput_tok_s: float
    ttft: dict[str, float | None]  # "mean", "p50", "p90", "p99" in ms
    itl: dict[str, float | None]
    tpot: dict[str, float | None]
    e2e: dict[str, float | None]


def _stats(values: list[float]) -> dict[str, float | None]:
    mean = sum(values) / len(values) if values else None
    return {"mean": mean, "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99)}


def client_stats(run: LoadRun) -> ClientStats:
    done = [r for r in run.requests if r.finish in ("length", "stop")]
    return ClientStats(
        len(done), run.output_tokens, run.throughput_tok_s,
        _stats([r.ttft_ms for r in run.requests if r.ttft_ms is not None]),
        _stats([g for r in run.requests for g in r.itl_ms]),
        _stats([r.tpot_ms for r in run.requests if r.tpot_ms is not None]),
        _stats([r.e2e_ms for r in run.requests if r.e2e_ms is not None]))


@dataclass(frozen=True, slots=True)
class ServerStats:
    """The server's counters over the load (None: not exported, or no /metrics)."""

    ttft: dict[str, float | None]  # "mean", "p50", "p90" from the histogram, ms
    itl: dict[str, float | None]
    generation_tokens: float | None
    preemptions: float | None
    prefix_queries: float | None
    prefix_hits: float | None
    spec_drafts: float | None
    spec_accepted: float | None
    peak_running: float | None
    peak_waiting: float | None
    peak_kv_usage: float | None

    @property
    def prefix_hit_rate(self) -> float | None:
        if not self.prefix_queries or self.prefix_hits is None:
            return None
        return self.prefix_hits / self.prefix_queries

    @property
    def acceptance(self) -> float | None:
        if not self.spec_drafts or self.spec_accepted is None:
            return None
        return self.spec_accepted / self.spec_drafts


def _delta(first: MetricsSample, last: MetricsSample, name: str) -> float | None:
    a, b = getattr(first, name), getattr(last, name)
    return None if a is None or b is None else b - a


def _peak(samples: tuple[MetricsSample, ...], name: str) -> float | None:
    values = [getattr(s, name) for s in samples if getattr(s, name) is not None]
    return max(values) if values else None


def server_stats(run: LoadRun) -> ServerStats | None:
    if len(run.samples) < 2:
        return None
    first, last = run.samples[0], run.samples[-1]
    ttft, itl = histogram_delta(first.ttft, last.ttft), histogram_delta(first.itl, last.itl)

    def view(h: object) -> dict[str, float | None]:
        return {"mean": histogram_mean_ms(h), "p50": histogram_quantile_ms(0.5, h),
                "p90": histogram_quantile_ms(0.9, h)}

    return ServerStats(view(ttft), view(itl), *(_delta(first, last, k) for k in (
        "generation_tokens", "preemptions", "prefix_queries", "prefix_hits", "spec_drafts",
        "spec_accepted")), _peak(run.samples, "running"), _peak(run.samples, "waiting"),
        _peak(run.samples, "kv_usage"))


CLIENT_DELAY_LIMIT = 0.10  # the client's mean ITL this much above the server's: flagged


def client_delay(client: ClientStats, server: ServerStats | None) -> float | None:
    """How much longer the client's mean inter-token gap is than the server's own histogram's,
    as a fraction (None if either is missing). The two measure the same gaps — the server's as
    its engine emits tokens, the client's as they arrive — so a client far above the server means
    the client's own process was held up (a busy machine, a page drawing), not the engine."""
    if server is None or not server.itl["mean"] or client.itl["mean"] is None:
        return None
    return client.itl["mean"] / server.itl["mean"] - 1.0


def tokens_per_second_window(run: LoadRun, window_ms: float = 1000.0,
                             step_ms: float = 250.0) -> list[tuple[float, float]]:
    """(t_ms, output tokens/s over the window ending at t) across the load: the live throughput
    line, counted from the chunks' arrival on the client."""
    chunks = sorted((t, n) for r in run.requests for t, n in zip(r.chunk_ms, r.chunk_tokens))
    if not chunks:
        return []
    end = chunks[-1][0]
    points, t = [], step_ms
    while t <= end + step_ms:
        made = sum(n for c, n in chunks if t - window_ms < c <= t)
        points.append((t, 1000.0 * made / window_ms))
        t += step_ms
    return points
