"""What a load showed, computed once for the page, the CLI and the bench: the client's latency
percentiles, the server's own view over the same interval (its counters and histograms, the last
/metrics sample minus the first), and the difference between the two.

The client's TTFT includes what the server's cannot: the HTTP request, tokenizing and queueing
in the API process, and the trip back. The server's histograms have bucket resolution only
(Prometheus's histogram_quantile), so their means are compared, and quantiles shown as "≈".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..timing.metrics import percentile
from .prometheus import histogram_delta, histogram_mean_ms, histogram_quantile_ms
from .record import LoadRun, MetricsSample


@dataclass(frozen=True, slots=True)
class ClientStats:
    """The client's view, over the requests that completed (as benchmark_serving counts: a
    stopped or failed request's times are cut short). `itl` is per streamed chunk (its
    percentiles are what benchmark_serving reports); `itl_per_token_ms` = Σ(last − first token)
    ÷ Σ(output tokens − 1), the per-token mean that the server's ITL histogram mean (one entry per
    engine step, one token per step without speculation) measures too, even when the API merges
    tokens into one chunk."""

    requests_done: int
    output_tokens: int
    throughput_tok_s: float
    ttft: dict[str, float | None]  # "mean", "p50", "p90", "p99" in ms
    itl: dict[str, float | None]
    tpot: dict[str, float | None]
    e2e: dict[str, float | None]
    itl_per_token_ms: float | None = None


def _stats(values: list[float]) -> dict[str, float | None]:
    mean = sum(values) / len(values) if values else None
    return {"mean": mean, "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99)}


def client_stats(run: LoadRun) -> ClientStats:
    done = [r for r in run.requests if r.finish in ("length", "stop")]
    spans = [(r.chunk_ms[-1] - r.chunk_ms[0], r.output_tokens - 1) for r in done
             if r.output_tokens > 1]
    gaps = sum(n for _, n in spans)
    return ClientStats(
        len(done), run.output_tokens, run.throughput_tok_s,
        _stats([r.ttft_ms for r in done if r.ttft_ms is not None]),
        _stats([g for r in done for g in r.itl_ms]),
        _stats([r.tpot_ms for r in done if r.tpot_ms is not None]),
        _stats([r.e2e_ms for r in done if r.e2e_ms is not None]),
        sum(t for t, _ in spans) / gaps if gaps else None)


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
    """How much longer the client's per-token gap is than the server's own histogram's, as a
    fraction (None if either is missing, or the server speculates: then its histogram counts
    steps of several tokens). Both measure the same gaps — the server's as its engine emits
    tokens, the client's as they arrive — so a client far above the server means the client's
    own process was held up (a busy machine, a page drawing), not the engine."""
    if server is None or not server.itl["mean"] or client.itl_per_token_ms is None \
            or (server.spec_drafts or 0) > 0:
        return None
    return client.itl_per_token_ms / server.itl["mean"] - 1.0


MAX_WINDOW_POINTS = 2000


def tokens_per_second_window(run: LoadRun, window_ms: float = 1000.0,
                             step_ms: float = 250.0) -> list[tuple[float, float]]:
    """(t_ms, output tokens/s over the window ending at t) across the load: the live throughput
    line, counted from the chunks' arrival on the client. At most MAX_WINDOW_POINTS points (the
    step widens for a long load); cumulative sums, so a long load costs one sort."""
    times = np.array([t for r in run.requests for t in r.chunk_ms], dtype=np.float64)
    if not times.size:
        return []
    tokens = np.array([n for r in run.requests for n in r.chunk_tokens], dtype=np.float64)
    order = np.argsort(times, kind="stable")
    times, made = times[order], np.concatenate(([0.0], np.cumsum(tokens[order])))
    end = float(times[-1])
    step = max(step_ms, (end + step_ms) / MAX_WINDOW_POINTS)
    at = np.arange(step, end + step + 1e-9, step)
    upto = made[np.searchsorted(times, at, side="right")]  # tokens with time ≤ t
    before = made[np.searchsorted(times, at - window_ms, side="right")]  # ≤ t − window
    return [(float(t), float(1000.0 * (u - b) / window_ms)) for t, u, b in zip(at, upto, before)]
