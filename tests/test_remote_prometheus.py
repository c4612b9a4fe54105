"""engine/remote/prometheus.py: vLLM's /metrics text into a MetricsSample, and the histogram
arithmetic — on the real server's text (live, marked `vllm`), on hand-written exposition text, and
against hand-worked numbers and a transcription of Prometheus's own histogram_quantile
(promql/quantile.go, bucketQuantile) as the reference.
"""

from __future__ import annotations

import math
import random

import pytest

from engine.remote.client import fetch_metrics_text, normalize_base_url
from engine.remote.prometheus import (
    MetricsFormatError,
    histogram_delta,
    histogram_mean_ms,
    histogram_quantile_ms,
    parse_metrics,
)
from engine.remote.record import Histogram

# Two engines (data parallel) and one other model, as vLLM writes them (prometheus_client's text
# format: a counter's TYPE line names it with _total, and a _created gauge sits beside it).
TWO_ENGINES = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="toy"} 2.0
vllm:num_requests_running{engine="1",model_name="toy"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="toy"} 0.0
vllm:num_requests_waiting{engine="1",model_name="toy"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="toy"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="toy"} 0.6
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="toy"} 1.0
vllm:num_preemptions_total{engine="1",model_name="toy"} 2.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="toy"} 1.7e+09
vllm:num_preemptions_created{engine="1",model_name="toy"} 1.7e+09
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="toy"} 100.0
vllm:prefix_cache_queries_total{engine="1",model_name="toy"} 60.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="toy"} 32.0
vllm:prefix_cache_hits_total{engine="1",model_name="toy"} 16.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="toy"} 1000.0
vllm:generation_tokens_total{engine="1",model_name="toy"} 234.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="toy"} 40.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="toy"} 25.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="toy"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="toy"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="toy"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="toy"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="toy"} 1.5
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="toy"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5",model_name="toy"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="toy"} 2.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="toy"} 2.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="toy"} 0.5
# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{engine="0",model_name="toy"} 1.7e+09
# HELP vllm:num_requests_waiting_by_reason Waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="toy",reason="capacity"} 9.0
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
"""


# --- the real server ---------------------------------------------------------------------------

@pytest.mark.vllm
def test_the_real_servers_metrics_parse_into_a_coherent_sample(vllm_url: str) -> None:
    """vllm_url (tests/conftest.py): INFERENCE_EXPLORER_VLLM_URL, else the server on :8011, else
    one started for the session."""
    text = fetch_metrics_text(normalize_base_url(vllm_url))
    sample = parse_metrics(text, 12.5)
    assert sample.t_ms == 12.5
    assert sample.running is not None and sample.running >= 0
    assert sample.waiting is not None and sample.waiting >= 0
    assert sample.kv_usage is not None and 0.0 <= sample.kv_usage <= 1.0
    for counter in (sample.preemptions, sample.prefix_queries, sample.prefix_hits,
                    sample.generation_tokens):
        assert counter is not None and counter >= 0 and float(counter).is_integer()
    assert sample.prefix_hits <= sample.prefix_queries
    assert sample.spec_drafts is None and sample.spec_accepted is None  # no speculation there
    for h in (sample.ttft, sample.itl):
        assert h is not None and len(h.bounds) >= 2 and math.isinf(h.bounds[-1])
        assert list(h.bounds) == sorted(h.bounds) and list(h.counts) == sorted(h.counts)
        assert h.counts[-1] == h.count and h.sum >= 0
    # the numbers are the text's own: the generation counter read back by hand
    line = next(s for s in text.splitlines() if s.startswith("vllm:generation_tokens_total"))
    assert sample.generation_tokens == float(line.rsplit(" ", 1)[1])


# --- hand-written exposition text ---------------------------------------------------------------

def test_label_sets_are_summed_and_kv_usage_is_averaged():
    s = parse_metrics(TWO_ENGINES, 7.0)
    assert (s.t_ms, s.running, s.waiting) == (7.0, 5.0, 4.0)
    assert s.kv_usage == pytest.approx(0.4)  # a fraction per engine: the mean, not 0.8
    assert (s.preemptions, s.prefix_queries, s.prefix_hits) == (3.0, 160.0, 48.0)
    assert (s.generation_tokens, s.spec_drafts, s.spec_accepted) == (1234.0, 40.0, 25.0)


def test_histograms_are_summed_per_bound_over_label_sets():
    s = parse_metrics(TWO_ENGINES, 0.0)
    assert s.ttft == Histogram((0.1, 0.5, math.inf), (1.0, 5.0, 6.0), 2.0, 6.0)
    assert s.itl is None


def test_created_gauges_and_other_metrics_are_not_mistaken_for_vllm_s():
    """`_created` timestamps (1.7e9) must not be added to counters; `waiting_by_reason` is not
    `waiting`; a process counter is not a vLLM one."""
    s = parse_metrics(TWO_ENGINES, 0.0)
    assert s.preemptions == 3.0 and s.waiting == 4.0


def test_a_server_without_vllm_metrics_gives_none_everywhere():
    text = ("# HELP tgi_request_count Requests.\n# TYPE tgi_request_count counter\n"
            "tgi_request_count_total 5.0\n# TYPE up gauge\nup 1\n")
    s = parse_metrics(text, 0.0)
    assert (s.running, s.waiting, s.kv_usage, s.preemptions, s.generation_tokens,
            s.ttft, s.itl) == (None,) * 7
    assert parse_metrics("", 0.0).running is None


def test_a_histogram_without_its_count_is_absent():
    text = ("# TYPE vllm:inter_token_latency_seconds histogram\n"
            'vllm:inter_token_latency_seconds_bucket{le="0.1"} 1.0\n'
            'vllm:inter_token_latency_seconds_bucket{le="+Inf"} 1.0\n'
            "vllm:inter_token_latency_seconds_sum 0.05\n")
    assert parse_metrics(text, 0.0).itl is None


@pytest.mark.parametrize("text", [
    "<!DOCTYPE html>\n<html><body>Not found</body></html>\n",
    '{"running": 3}',
    "hello world\n",
    "vllm:num_requests_running{engine=\"0\" 3.0\n",
    "# TYPE vllm:time_to_first_token_seconds histogram\n"
    'vllm:time_to_first_token_seconds_bucket{le="soon"} 1.0\n'
    "vllm:time_to_first_token_seconds_count 1.0\n",
    "vllm:num_requests_running three\n",
    "\x00\x01\x02 binary",
], ids=["html", "json", "words", "unclosed labels", "bucket bound not a number",
        "value not a number", "binary"])
def test_garbage_is_a_metrics_format_error(text):
    with pytest.raises(MetricsFormatError) as caught:
        parse_metrics(text, 0.0)
    assert str(caught.value).startswith("not Prometheus text") and "\n" not in str(caught.value)


# --- histogram arithmetic -----------------------------------------------------------------------

H = Histogram((0.1, 0.2, 0.5, math.inf), (10.0, 30.0, 40.0, 40.0), 8.0, 40.0)


def test_histogram_delta_is_what_was_observed_between_two_scrapes():
    before = Histogram((0.1, 0.2, 0.5, math.inf), (4.0, 10.0, 12.0, 12.0), 2.0, 12.0)
    assert histogram_delta(before, H) == Histogram((0.1, 0.2, 0.5, math.inf),
                                                   (6.0, 20.0, 28.0, 28.0), 6.0, 28.0)
    assert histogram_delta(None, H) is None and histogram_delta(H, None) is None
    other = Histogram((0.1, 1.0, math.inf), (1.0, 2.0, 2.0), 0.5, 2.0)
    assert histogram_delta(other, H) is None  # different buckets: no difference to take


def test_histogram_mean_is_sum_over_count_in_ms():
    assert histogram_mean_ms(H) == pytest.approx(200.0)  # 8 s over 40 observations
    assert histogram_mean_ms(Histogram((math.inf,), (0.0,), 0.0, 0.0)) is None
    assert histogram_mean_ms(None) is None


@pytest.mark.parametrize("q, expected_ms", [
    (0.25, 100.0),  # rank 10: the top of the first bucket, interpolated from 0
    (0.125, 50.0),  # rank 5: halfway through (0, 0.1]
    (0.5, 150.0),  # rank 20: (0.1, 0.2] holds ranks 10..30, so 0.1 + 0.1·(10/20)
    (0.9, 380.0),  # rank 36: (0.2, 0.5] holds 30..40, so 0.2 + 0.3·(6/10)
    (1.0, 500.0),  # rank 40 is reached in the last finite bucket
])
def test_histogram_quantile_hand_worked(q, expected_ms):
    assert histogram_quantile_ms(q, H) == pytest.approx(expected_ms)


def test_a_quantile_in_the_inf_bucket_is_the_highest_finite_bound():
    """Prometheus: "If the quantile falls into the highest bucket, the upper bound of the 2nd
    highest bucket is returned"."""
    h = Histogram((0.1, 0.25, math.inf), (2.0, 3.0, 10.0), 9.0, 10.0)
    assert histogram_quantile_ms(0.5, h) == pytest.approx(250.0)
    assert histogram_quantile_ms(0.99, h) == pytest.approx(250.0)


def test_an_empty_histogram_has_no_quantile():
    assert histogram_quantile_ms(0.5, Histogram((0.1, math.inf), (0.0, 0.0), 0.0, 0.0)) is None
    assert histogram_quantile_ms(0.5, None) is None


def prometheus_bucket_quantile(q: float, bounds: list[float], counts: list[float]) -> float:
    """promql/quantile.go bucketQuantile for 0 < q < 1, cumulative counts, +Inf last."""
    rank = q * counts[-1]
    b = next((i for i in range(len(bounds) - 1) if counts[i] >= rank), len(bounds) - 1)
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * (rank / count)


def test_histogram_quantile_agrees_with_prometheus_on_random_histograms():
    rng = random.Random(0)
    bounds = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
              math.inf]  # vLLM's TTFT buckets (a prefix of them)
    for _ in range(300):
        per_bucket = [rng.choice([0, 0, 1, 2, 7, 30]) for _ in bounds]
        if sum(per_bucket) == 0:
            continue
        counts = [float(sum(per_bucket[: i + 1])) for i in range(len(bounds))]
        h = Histogram(tuple(bounds), tuple(counts), 1.0, counts[-1])
        for q in (0.01, 0.5, 0.9, 0.99):
            expected = 1000.0 * prometheus_bucket_quantile(q, bounds, counts)
            assert histogram_quantile_ms(q, h) == pytest.approx(expected), (q, counts)
