"""A load on a serving engine: N streamed greedy requests, at most C in flight (or sent at a
Poisson rate), every chunk timed on the client, and the server's /metrics sampled about twice a
second while it runs — as a generator of LoadRun snapshots, so a page can draw it live.

Like vLLM's `benchmark_serving`: one thread per request in flight, arrivals drawn in advance,
TTFT from the moment the request is sent. Requests stream on their own threads, so a consumer that
is slow to ask for the next snapshot does not hold them up; but they share this process (and its
GIL) with it and with the /metrics parser, so heavy work here can delay a chunk's timestamp — the
page flags a client whose gaps run longer than the server's own (summary.client_delay). `stop()`
ends the streams and keeps what came.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from datetime import datetime, timezone

from .client import (
    RemoteError,
    StreamResult,
    fetch_metrics_text,
    list_models,
    normalize_base_url,
    stream_completion,
)
from .prometheus import MetricsFormatError, kv_cache_config, parse_metrics
from .record import LoadConfig, LoadRun, MetricsSample, RemoteRequest

POLL_S = 0.5
STOP_GRACE_S = 2.0
SETTLE_S = 0.3  # vLLM updates its histograms as each request is freed: wait before the last scrape


def arrival_times_s(config: LoadConfig) -> list[float]:
    """When each request may be sent (s after the start): all at once (concurrency alone limits
    them), or a Poisson process of `config.rate` per second — the local engine's arrivals for the
    same seed (engine/serving/requests.py), so both engines get the same load."""
    from ..serving.requests import arrival_times

    if config.rate is None:
        return [0.0] * config.requests
    return [t / 1000.0 for t in arrival_times(config.requests, "poisson", config.rate,
                                              config.seed)]


def resolve_model(base_url: str, model: str | None) -> tuple[str, list[str]]:
    """The model to ask for (the first listed if none is given) and every model listed."""
    models = list_models(base_url)
    if not models:
        raise RemoteError(f"{base_url} serves no model")
    if not model:
        return models[0], models
    if model not in models:
        raise RemoteError(f"{base_url} does not serve {model!r}; it serves: "
                          + ", ".join(models[:8]))
    return model, models


class LoadTest:
    """Iterate for snapshots (the last one is the finished load); `stop()` from another thread.
    `render` turns a prompt into the text sent (the chat template), None sends it as typed.
    `settle_s`: the wait before the last /metrics scrape (a scripted peer needs none)."""

    def __init__(self, config: LoadConfig, render: Callable[[str], str] | None = None,
                 poll_s: float = POLL_S, settle_s: float = SETTLE_S) -> None:
        self.config = config
        self.base_url = normalize_base_url(config.base_url)
        self.render = render or (lambda p: p)
        self.poll_s = poll_s
        self.settle_s = settle_s
        self._stop = threading.Event()
        self._done = threading.Event()  # every stream has ended (or was left after a stop)
        self._lock = threading.Lock()
        self._results = [StreamResult() for _ in range(config.requests)]
        self._texts = [self.render(config.prompts[i % len(config.prompts)])
                       for i in range(config.requests)]
        self._samples: list[MetricsSample] = []
        self._metrics_error: str | None = None
        self._kv: tuple[int | None, int | None] = (None, None)
        self._t0 = 0.0
        self._created = datetime.now(timezone.utc).isoformat(timespec="seconds")

    def stop(self) -> None:
        self._stop.set()

    def __iter__(self) -> Iterator[LoadRun]:
        model, _ = resolve_model(self.base_url, self.config.model)
        self._model = model
        self._sample()  # the baseline, before any request
        self._t0 = time.perf_counter()
        dispatcher = threading.Thread(target=self._dispatch, daemon=True)
        sampler = threading.Thread(target=self._sample_while_running, daemon=True)
        dispatcher.start()
        sampler.start()
        finished = False
        try:
            next_yield = time.perf_counter()
            while self._running(dispatcher):
                next_yield += self.poll_s
                time.sleep(max(0.0, next_yield - time.perf_counter()))
                yield self.snapshot()
                if self._stop.is_set():
                    break
            # A stopped stream ends at its next chunk; one still waiting for the server's first
            # byte is left to its (daemon) thread after STOP_GRACE_S and recorded as stopped.
            deadline = time.perf_counter() + (STOP_GRACE_S if self._stop.is_set() else 1e9)
            for thread in [dispatcher, *self._threads()]:
                thread.join(max(0.0, deadline - time.perf_counter()))
            self._done.set()
            sampler.join()
            time.sleep(self.settle_s)
            self._sample()
            finished = True
            yield self.snapshot()
        finally:  # also when the consumer drops the generator (a page's Stop or reload)
            if not finished:
                self._stop.set()
            self._done.set()

    def _running(self, dispatcher: threading.Thread) -> bool:
        return dispatcher.is_alive() or any(t.is_alive() for t in self._threads())

    def _sample_while_running(self) -> None:
        """/metrics every poll_s on its own thread, whatever the consumer of the snapshots does
        (a page's redraw can take longer than a poll interval)."""
        next_poll = time.perf_counter()
        while not self._done.is_set() and not self._stop.is_set():
            next_poll += self.poll_s
            if self._done.wait(max(0.0, next_poll - time.perf_counter())):
                return
            self._sample()

    def run_all(self) -> LoadRun:
        return deque(self, maxlen=1)[0]

    def _threads(self) -> list[threading.Thread]:
        with self._lock:
            return list(getattr(self, "_workers", []))

    def _dispatch(self) -> None:
        slots = threading.Semaphore(self.config.concurrency)
        arrivals = arrival_times_s(self.config)
        for i, arrival in enumerate(arrivals):
            while not self._stop.is_set() and time.perf_counter() - self._t0 < arrival:
                time.sleep(min(0.05, max(0.0, arrival - (time.perf_counter() - self._t0))))
            while not self._stop.is_set() and not slots.acquire(timeout=0.1):
                pass
            if self._stop.is_set():
                return
            worker = threading.Thread(target=self._send, args=(i, slots), daemon=True)
            with self._lock:  # a Stop between the check above and here sends nothing more
                if self._stop.is_set():
                    return
                self._workers = [*getattr(self, "_workers", []), worker]
                worker.start()

    def _send(self, i: int, slots: threading.Semaphore) -> None:
        try:
            stream_completion(self.base_url, self._model, self._texts[i],
                              self.config.max_new_tokens, self._results[i], self._stop.is_set)
        finally:
            slots.release()

    def _sample(self) -> None:
        try:
            text = fetch_metrics_text(self.base_url)
            # stamped when the body arrived: the server's state as of (about) then
            now_ms = 1000.0 * (time.perf_counter() - self._t0) if self._t0 else 0.0
            sample = parse_metrics(text, now_ms)
            if not self._samples:
                self._kv = kv_cache_config(text)
        except (RemoteError, MetricsFormatError) as error:
            if self._metrics_error is None:
                self._metrics_error = f"no server metrics: {error}"
            return
        with self._lock:
            self._samples.append(sample)

    def _samples_now(self) -> tuple[MetricsSample, ...]:
        with self._lock:
            return tuple(self._samples)

    def snapshot(self) -> LoadRun:
        """The load as it stands: unsent requests are "waiting", streams in flight "running"."""
        requests = []
        for i, r in enumerate(self._results):
            tokens, chunks = list(r.chunk_tokens), list(r.chunk_s)  # a chunk in mid-append:
            n = min(len(tokens), len(chunks))  # leave it to the next snapshot
            tokens, chunks = tokens[:n], chunks[:n]
            sent = None if r.sent_s is None else 1000.0 * (r.sent_s - self._t0)
            finish = r.finish if r.sent_s is not None else "waiting"
            if self._stop.is_set() and finish in ("running", "waiting"):
                finish = "stopped"
            requests.append(RemoteRequest(
                i, self._texts[i], sent, tuple(1000.0 * (c - self._t0) for c in chunks),
                tuple(tokens), tuple(r.token_ids), "".join(r.text), r.prompt_tokens, finish,
                r.error, tuple(r.prompt_token_ids)))
        errors = [r.error for r in requests if r.error]
        fatal = errors[0] if errors and all(r.finish in ("error", "waiting", "stopped")
                                            for r in requests) and not any(
            r.chunk_ms for r in requests) else None
        return LoadRun(self.config, getattr(self, "_model", self.config.model), tuple(requests),
                       self._samples_now(), self._created, self._stop.is_set(), fatal,
                       self._metrics_error, *self._kv)
