"""The serving loop: requests arrive in real time, the scheduler picks each step's batch, the
model runner does one forward for all of it, and every step is recorded.

`ServingEngine` is a generator like `Run`: iterate it and each :class:`StepRecord` comes the moment
its step is done; `record()` hands out the (partial) :class:`ServingRun` any time, and a set
`stop_event` ends the stream between steps with everything so far kept. Decoding is greedy.

The stream's clock pauses while the consumer holds a yielded step (a page drawing its charts):
arrivals, token times and step starts are engine time, so TTFT and ITL measure the engine, not
the page, and a run driven by a page reads like one run to the end by `serve()`.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any, Callable, Iterator
from typing import Sequence as Seq

import torch

from ..clock import MachineSample, clock_ms, others_share, usable_cores
from ..errors import InputError
from ..forward import eos_token_ids
from ..settings import weights_name
from .block_manager import BlockManager
from .model_runner import Chunk, PagedModelRunner, serving_problem
from .record import BlockTableRow, RequestRecord, RequestSpec, ServingConfig, ServingRun, StepRecord
from .scheduler import Plan, Scheduler, Sequence

MAX_REQUESTS = 512
MAX_ARRIVAL_MS = 3_600_000.0  # an hour: later arrivals are a mistake, not a stream
IDLE_POLL_S = 0.25


def refusal(spec: RequestSpec, config: ServingConfig, max_context: int) -> str | None:
    """Why a request can never run (None: it can): it must fit the model's context and, alone,
    the block pool."""
    total = len(spec.prompt_token_ids) + spec.max_new_tokens
    if total > max_context:
        return f"prompt + new tokens ({total}) exceed the model's context ({max_context})"
    if -(-total // config.block_size) > config.num_blocks:
        return (f"prompt + new tokens ({total}) need more blocks than the pool holds "
                f"({config.num_blocks} × {config.block_size} slots)")
    return None


class ServingEngine:
    def __init__(self, lm: Any, requests: Seq[RequestSpec], config: ServingConfig,
                 stop_event: threading.Event | None = None, weights: str | None = None,
                 on_idle: Callable[[float], None] | None = None) -> None:
        """`on_idle(ms)` is called about every IDLE_POLL_S while nothing has arrived yet (ms:
        until the next arrival) — a page uses it to stay responsive (its Stop lands there)."""
        if not requests:
            raise InputError("a stream needs at least one request")
        if len(requests) > MAX_REQUESTS:
            raise InputError(f"at most {MAX_REQUESTS} requests per stream")
        problem = serving_problem(lm)
        if problem:
            raise InputError(problem)
        vocab = lm.spec.vocab_size
        for i, spec in enumerate(requests):
            if spec.arrival_ms > MAX_ARRIVAL_MS:
                raise InputError(f"request {i} arrives after an hour; streams are shorter")
            if any(not 0 <= t < vocab for t in spec.prompt_token_ids):
                raise InputError(f"request {i} has a token id outside the vocabulary ({vocab:,})")
        self.lm = lm
        self.config = config
        self.weights = weights or weights_name(lm.spec.dtype)
        self.stop_event = stop_event or threading.Event()
        self.on_idle = on_idle
        self.blocks = BlockManager(config.num_blocks, config.block_size, config.prefix_sharing)
        self.scheduler = Scheduler(config, self.blocks)
        self.runner = PagedModelRunner(lm, config.num_blocks, config.block_size)
        self.sequences = [Sequence(i, spec) for i, spec in enumerate(requests)]
        self.refused = {s.id: refusal(s.spec, config, lm.spec.max_context) for s in self.sequences}
        self.steps: list[StepRecord] = []
        self.eos = eos_token_ids(lm)
        self.created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.threads = torch.get_num_threads()
        self._started = False

    def _now(self, start: float) -> float:
        return clock_ms(self.lm.device) - start

    def __iter__(self) -> Iterator[StepRecord]:
        if self._started:
            raise RuntimeError("a ServingEngine runs once")
        self._started = True
        start = clock_ms(self.lm.device)
        pending = sorted((s for s in self.sequences if not self.refused[s.id]),
                         key=lambda s: (s.spec.arrival_ms, s.id))
        while (pending or self.scheduler.waiting or self.scheduler.running) \
                and not self.stop_event.is_set():
            now = self._now(start)
            while pending and pending[0].spec.arrival_ms <= now:
                self.scheduler.arrive(pending.pop(0))
            plan = self.scheduler.schedule()
            if plan.empty and not plan.preempted:
                if not pending:  # nothing can ever be admitted (cannot happen: refused up front)
                    break
                wait_ms = max(0.0, pending[0].spec.arrival_ms - now)
                if self.on_idle is not None:
                    self.on_idle(wait_ms)
                self.stop_event.wait(min(wait_ms / 1000, IDLE_POLL_S))
                continue
            if plan.empty:
                continue
            step = self._step(plan, start)
            paused = clock_ms(self.lm.device)
            yield step
            start += clock_ms(self.lm.device) - paused  # the consumer's time is not the stream's

    def _step(self, plan: Plan, start: float) -> StepRecord:
        blocks = self.blocks
        chunks, members = [], []
        for seq, position, slot in plan.decodes:
            chunks.append(Chunk([seq.output[-1]], position, [slot], blocks.context_slots(seq.id)))
            members.append(seq)
        for seq, cached in plan.prefills:
            tokens = seq.tokens
            context = blocks.context_slots(seq.id)
            chunks.append(Chunk(tokens[cached:], cached, context[cached:], context))
            members.append(seq)
        copies, blocks.copies = blocks.copies, []
        before = MachineSample.now(self.lm.device)
        begin = before.wall_ms - start
        for seq, cached in plan.prefills:
            if seq.admitted_ms is None:
                seq.admitted_ms = begin
                seq.cached_tokens = cached
        logits = self.runner.forward(chunks, copies)  # (B, vocab)
        chosen = logits.argmax(dim=-1).tolist()
        after = MachineSample.now(self.lm.device)
        end = after.wall_ms - start
        index = len(self.steps)
        for seq, token in zip(members, chosen):
            seq.output.append(int(token))
            seq.token_ms.append(end)
            seq.token_steps.append(index)
            if token in self.eos:
                self.scheduler.finish(seq, "eos")
            elif len(seq.output) >= seq.spec.max_new_tokens:
                self.scheduler.finish(seq, "length")
        kind = "mixed" if plan.prefills and plan.decodes else ("prefill" if plan.prefills else "decode")
        step = StepRecord(
            index=index, start_ms=begin, ms=end - begin, kind=kind,
            requests=tuple(s.id for s in members),
            new_tokens=tuple(len(c.token_ids) for c in chunks),
            tables=self._tables(), free_blocks=blocks.free_blocks,
            shared_blocks=blocks.shared_blocks(), copied_blocks=len(copies),
            waiting=len(self.scheduler.waiting), preempted=tuple(s.id for s in plan.preempted),
            cpu_ms=after.cpu_ms - before.cpu_ms, others_share=others_share(before, after))
        self.steps.append(step)
        return step

    def _tables(self) -> tuple[BlockTableRow, ...]:
        return tuple(BlockTableRow(seq.id, tuple(self.blocks.tables[seq.id].blocks),
                                   len(self.blocks.tables[seq.id].tokens))
                     for seq in self.scheduler.running)

    def _request_record(self, seq: Sequence) -> RequestRecord:
        if self.refused[seq.id]:
            finish = "refused"
        elif seq.finish:
            finish = seq.finish
        elif seq in self.scheduler.running or seq.output:
            finish = "stopped" if self.stop_event.is_set() else "running"
        else:
            finish = "waiting"
        text = self.lm.tokenizer.decode(seq.output, skip_special_tokens=True) if seq.output else ""
        return RequestRecord(seq.id, seq.spec, seq.admitted_ms, tuple(seq.output),
                             tuple(seq.token_ms), tuple(seq.token_steps), text,
                             seq.cached_tokens, seq.preemptions, finish)

    def record(self) -> ServingRun:
        return ServingRun(model=self.lm.spec.name, weights=self.weights, config=self.config,
                          requests=tuple(self._request_record(s) for s in self.sequences),
                          steps=tuple(self.steps), threads=self.threads, created=self.created,
                          stopped=self.stop_event.is_set(), cores=usable_cores())

    def refusals(self) -> dict[int, str]:
        """Request id → why it can never run, for the requests refused up front."""
        return {i: why for i, why in self.refused.items() if why}


def serve(lm: Any, requests: Seq[RequestSpec], config: ServingConfig,
          stop_event: threading.Event | None = None, weights: str | None = None) -> ServingRun:
    engine = ServingEngine(lm, requests, config, stop_event, weights)
    for _ in engine:
        pass
    return engine.record()
