"""Live runs decoded together: continuous batching of many visitors' recorded runs.

The article's serving lesson, applied to our own hosted demo: a decode step reads every weight
once, whatever the number of requests in it, so the steps of runs that overlap in time should be
one forward. A :class:`StepBatcher` owns a block pool (block_manager.py) and a paged model runner
(model_runner.py) for one model; each live `Run` (engine/runner.py) gets a
:class:`BatchedDecoder` (batch_member.py: the run's side) as its plugged-in decoder. A run's
prefill and each of its decode steps are handed to the batcher's worker thread, which runs one
forward for everything asked for at that moment — prompts (their K/V written into the pool, every
row of their attention kept, as a prefill records) and the decode steps of runs already in, laid
end to end as vLLM lays out a step that mixes prefills and decodes — and gives each run its own
logits, the attention and residual stream it records, and the batch size. Runs join with their
prefill and leave when they end, as in vLLM's continuous batching. A step takes prompts up to
STEP_TOKENS new tokens in all (vLLM's max_num_batched_tokens), so the runs decoding wait for
one bounded forward, not for every prompt of a class; the rest go in the next step.

Gathering: after a step the worker waits for every member decoding (its prefix loaded, not yet
released) to ask for its next step — each first draws its token on its own page — at most as
long as the last forward took (`gather_ms` at least, MAX_GATHER_MS at most). Waiting less splits
the class into cohorts that alternate steps (measured: batches of 9 and 1, then 5 and 5, at twice
the forwards); a forward costs about the same for 1 or 10 runs, so waiting up to one is cheaper.

Prefills first: a step waits while runs that are joining (in `joining`, their prefill not yet
asked for) come (at most PREFILL_FIRST_S), as vLLM's scheduler puts prefills first: a class
pressing Generate at once has its prompts in the same forwards and gets every first token
sooner, then decodes in one full batch instead of many small ones in between.

Admission: a run is admitted when the pool can hold its prompt and every new token it may ask
for (blocks reserved up front: no preemption) and fewer than `max_batch` runs are in; else it
waits (`admit` polls its stop event and reports its place through `on_wait`).

`turn`: the app's fair turn, shared with experiments that need the whole machine (a `Turn`:
acquire with an optional wait report, release, and whether others wait). The batch takes it as
one client and holds it while any run is in the batch — its steps, the prefills in them, and the
runs joining it — giving it back when the batch empties, or after `slice_s` when others wait (then
it queues again behind them, as any visitor's run would). Without one, nothing is taken.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from ..clock import clock_ms
from ..errors import EngineError, InputError
from ..sampling import Choice, greedy_choices
from .batch_member import Ask, BatchedDecoder, BatchedOutput, BatchView, Turn, Waiting
from .block_manager import BlockManager
from .model_runner import Chunk, PagedModelRunner

__all__ = ["BatchView", "BatchedDecoder", "BatchedOutput", "StepBatcher", "Turn"]

BLOCK_SIZE = 16
GATHER_MS = 20.0
MAX_GATHER_MS = 500.0
SLICE_S = 15.0
PREFILL_FIRST_S = 2.0  # the longest a decode step waits for runs joining to ask their prefill
STEP_TOKENS = 2048  # new tokens of prompts one step takes (a prompt alone may be longer)
HISTORY = 120  # recent steps the batcher remembers (the Serving page's live view)


class StepBatcher:
    """The batched decode steps of one model's live runs (see the module's docstring).

    `model` is what the steps multiply by (the runs' prefill runs on it too); `max_tokens`
    the longest prompt + new tokens one run may hold; the pool holds `slots` token positions."""

    def __init__(self, lm: Any, model: Any, weights: str, weight_bytes: int, *,
                 max_batch: int = 32, max_tokens: int = 512, slots: int = 8192,
                 turn: Turn | None = None, slice_s: float = SLICE_S,
                 gather_ms: float = GATHER_MS, pack: bool = False) -> None:
        """`pack`: the runner's packed copy of float weights (linear.py) — off by default: on
        the default model it is several times the weights' size and no faster for these
        batches (measured)."""
        if max_tokens > slots:
            raise InputError(f"a pool of {slots} slots cannot hold a run of {max_tokens} tokens")
        runner_lm = lm if model is lm.model else _WithModel(lm, model)
        num_blocks = -(-slots // BLOCK_SIZE)
        self.runner = PagedModelRunner(runner_lm, num_blocks, BLOCK_SIZE, pack)
        self.blocks = BlockManager(num_blocks, BLOCK_SIZE, prefix_sharing=False)
        self.lm, self.model, self.weights = lm, model, weights
        self.weight_bytes = int(weight_bytes)
        self.max_batch, self.max_tokens = max_batch, max_tokens
        self.turn, self.slice_s = turn, slice_s
        self._turn_lock = threading.Lock()  # taking or giving back the turn (never under _cond)
        self._turn_since: float | None = None  # when the batch took the turn; None: not held
        self.gather_ms = gather_ms
        # the model: one forward at a time; taken before `_cond`, never while holding it
        self._compute = threading.Lock()
        self._cond = threading.Condition()
        self._ids = itertools.count()
        self._members: dict[int, BatchedDecoder] = {}  # admitted, not released
        self._decoding: set[int] = set()  # members whose prefix is in the pool
        self._to_free: list[int] = []  # members that left, their blocks not yet returned
        self._reserved: dict[int, int] = {}  # member → blocks held for it
        self._asks: dict[int, Ask] = {}  # member → its pending step
        self._waiting: list[int] = []  # tickets waiting for admission, in order
        self._joining: set[int] = set()  # members about to ask for their prefill
        self._last_ms = 0.0
        self.steps = 0  # batched forwards run
        self.history: list[tuple[float, int, float]] = []  # recent (monotonic s, batch, forward ms)
        self._worker: threading.Thread | None = None

    # — admission —

    def admit(self, tokens: int, stop: threading.Event) -> BatchedDecoder:
        """engine/runner.py's Seats: a place for a run of `tokens` positions."""
        return self.decoder(tokens, stop)

    def decoder(self, max_tokens: int, stop: threading.Event | None = None,
                on_wait: Callable[[int], None] | None = None) -> BatchedDecoder:
        """A decoder for one run of at most `max_tokens` positions, once it is admitted (blocks
        while the batch is full or the pool short; `on_wait(place)` about every 0.5 s)."""
        if max_tokens > self.max_tokens:
            raise InputError(f"prompt + new tokens ({max_tokens}) exceed what a batched run may "
                             f"hold ({self.max_tokens})")
        need = self.blocks.blocks_for(max_tokens)
        with self._cond:
            ticket = next(self._ids)
            self._waiting.append(ticket)
            try:
                while not (self._waiting[0] == ticket and len(self._members) < self.max_batch
                           and sum(self._reserved.values()) + need <= self.blocks.num_blocks):
                    if stop is not None and stop.is_set():
                        raise EngineError("stopped while waiting for a place in the batch")
                    if on_wait is not None:
                        place = self._waiting.index(ticket) + 1
                        self._cond.release()
                        try:
                            on_wait(place)
                        finally:
                            self._cond.acquire()
                    self._cond.wait(0.5)
            finally:
                self._waiting.remove(ticket)
                self._cond.notify_all()
            decoder = BatchedDecoder(self, ticket, max_tokens)
            self._members[ticket] = decoder
            self._reserved[ticket] = need
        weakref.finalize(decoder, self.release, ticket)
        return decoder

    def release(self, member: int) -> None:
        """The member leaves: its reservation at once, its blocks at the next forward or load
        (the pool's tables change only under `_compute`, which is never taken here: a release
        may come from a finalizer in any thread, holding any lock)."""
        with self._cond:
            if self._members.pop(member, None) is None:
                return  # released already
            self._reserved.pop(member, None)
            self._asks.pop(member, None)
            self._decoding.discard(member)
            self._to_free.append(member)
            self._cond.notify_all()
        self._give_turn(rotate=False)  # the last run out gives the batch's turn back

    def _free_left(self) -> None:
        """Return the blocks of members that left (call holding `_compute`)."""
        with self._cond:
            left, self._to_free = self._to_free, []
        for member in left:
            if member in self.blocks.tables:
                self.blocks.free(member)

    @property
    def nbytes(self) -> int:
        """What the batcher holds beyond the model: its K/V pool (and any packed weights)."""
        return self.runner.pool_bytes + self.runner.packed_bytes

    def snapshot(self) -> BatchView:
        """What the batch is doing now, anonymous: counts, each decoding run's length, the
        recent steps' sizes and times (never a run's tokens)."""
        with self._cond:
            lengths = tuple(sorted(len(self.blocks.tables[m].tokens)
                                   for m in self._decoding if m in self.blocks.tables))
            return BatchView(len(self._members), len(self._waiting), lengths, self.steps,
                             tuple(self.history), self.max_batch)

    @property
    def reserved_blocks(self) -> int:
        """Blocks held for the members now in the batch."""
        with self._cond:
            return sum(self._reserved.values())

    @property
    def running(self) -> int:
        with self._cond:
            return len(self._members)

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    @contextlib.contextmanager
    def joining(self, member: int, on_wait: Waiting | None = None) -> Iterator[None]:
        """A run about to ask for its prefill: the batch's turn taken (`on_wait` reports while it
        is elsewhere), and until the prefill is asked for, the next step waits for it."""
        with self._cond:
            self._joining.add(member)
        try:
            self._take_turn(on_wait)
            yield
        finally:
            with self._cond:
                self._joining.discard(member)
                self._cond.notify_all()

    def _take_turn(self, on_wait: Waiting | None = None) -> None:
        if self.turn is None:
            return
        with self._turn_lock:
            if self._turn_since is None:
                self.turn.acquire(on_wait)
                self._turn_since = time.monotonic()

    def _give_turn(self, rotate: bool) -> None:
        """Give the turn back: the batch is empty, or (`rotate`) it has held its slice and
        others wait."""
        if self.turn is None:
            return
        with self._turn_lock:
            held = self._turn_since
            if held is None:
                return
            if rotate and not (time.monotonic() - held >= self.slice_s and self.turn.others_waiting):
                return
            if not rotate:
                with self._cond:
                    if self._members:
                        return
            self._turn_since = None
            self.turn.release()

    # — the steps —

    def ask(self, ask: Ask) -> BatchedOutput:
        member = ask.decoder.member
        with self._cond:
            if member not in self._members:
                raise EngineError("this run left the batch")
            self._asks[member] = ask
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, name="step-batcher",
                                                daemon=True)
                self._worker.start()
            self._cond.notify_all()
        ask.done.wait()
        if ask.error is not None:
            raise ask.error
        assert ask.result is not None
        return ask.result

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._asks:
                    if not self._cond.wait(30.0) and not self._asks:
                        self._worker = None
                        return  # idle: a later step starts a new worker
                wait_ms = min(max(self.gather_ms, self._last_ms), MAX_GATHER_MS)
                deadline = time.monotonic() + wait_ms / 1000
                while not self._decoding <= self._asks.keys() and time.monotonic() < deadline:
                    self._cond.wait(max(0.0, deadline - time.monotonic()))
                deadline = time.monotonic() + PREFILL_FIRST_S
                while not self._joining <= self._asks.keys() and time.monotonic() < deadline:
                    self._cond.wait(max(0.0, deadline - time.monotonic()))
                asks = self._take_asks()
            self._run(asks)

    def _take_asks(self) -> list[Ask]:
        """The next step's asks (holding `_cond`): every decode step, and prompts in the order
        they came up to STEP_TOKENS new tokens (the first one whatever its length)."""
        taken, prompt_tokens = [], 0
        for member, ask in list(self._asks.items()):
            if ask.prefill:
                if prompt_tokens and prompt_tokens + len(ask.tokens) > STEP_TOKENS:
                    continue
                prompt_tokens += len(ask.tokens)
            taken.append(ask)
            del self._asks[member]
        return taken

    def _run(self, asks: list[Ask]) -> None:
        try:
            self._take_turn()
            with self._compute:
                start = clock_ms(self.lm.device)
                outputs = self._forward(asks)
                ms = clock_ms(self.lm.device) - start
            self._last_ms = ms
            self.steps += 1
            self.history = (self.history + [(time.monotonic(), len(asks), ms)])[-HISTORY:]
            for ask, (logits, attention, hidden, choice) in zip(asks, outputs):
                ask.result = BatchedOutput(logits, attention, hidden, len(asks), ms, choice)
        except BaseException as err:  # noqa: BLE001 — every waiting run hears of it
            for ask in asks:
                ask.error = err if isinstance(err, EngineError) else EngineError(
                    f"the batched step failed: {type(err).__name__}: {err}")
        finally:
            for ask in asks:
                ask.done.set()
            self._give_turn(rotate=True)

    def _forward(self, asks: list[Ask]) -> list[tuple[torch.Tensor, torch.Tensor | None,
                                                        torch.Tensor | None, Choice | None]]:
        self._free_left()
        chunks = []
        for ask in asks:
            member = ask.decoder.member
            if ask.prefill:
                if member in self.blocks.tables:
                    raise EngineError("this run's prompt is in the batch already")
                self.blocks.allocate(member, [0] * len(ask.tokens))  # no prefix sharing: ids count
                slots = self.blocks.context_slots(member)
                chunks.append(Chunk(list(ask.tokens), 0, slots, slots))
                continue
            if len(self.blocks.tables[member].tokens) != ask.position:
                raise EngineError(f"a batched step at position {ask.position} does not follow "
                                  "the run's cache")
            slot = self.blocks.append(member, list(ask.tokens))[0]
            chunks.append(Chunk(list(ask.tokens), ask.position, [slot],
                                self.blocks.context_slots(member)))
        layers = frozenset(layer for ask in asks for layer in ask.layers)
        whole = frozenset(b for b, ask in enumerate(asks) if ask.prefill)
        done = self.runner.forward_recorded(chunks, (), layers, any(a.hidden for a in asks), whole)
        greedy = [b for b, ask in enumerate(asks) if ask.greedy_top_k is not None]
        choices = dict(zip(greedy, greedy_choices(
            done.logits[greedy], max(asks[b].greedy_top_k for b in greedy)))) if greedy else {}
        out = []
        for b, ask in enumerate(asks):
            length = ask.position + len(ask.tokens)
            if not ask.layers:
                attention = None
            elif ask.prefill:  # (L_rec, H, T, T) float16
                attention = torch.stack([done.whole[b][k] for k in ask.layers])
            else:  # (L_rec, H, S) float16, as a run records it
                attention = torch.stack([done.attention[k][b, :, :length] for k in ask.layers]
                                        ).to(torch.float16)
            hidden = done.hidden[b] if ask.hidden and done.hidden is not None else None
            choice = choices.get(b)
            if choice is not None and ask.greedy_top_k < len(choice.top_ids):
                choice = Choice(choice.token, choice.prob, choice.rank,
                                choice.top_ids[:ask.greedy_top_k],
                                choice.top_probs[:ask.greedy_top_k])
            out.append((done.logits[b], attention, hidden, choice))
        with self._cond:  # the prompts' K/V are in: their runs decode from the next step
            self._decoding.update(ask.decoder.member for ask in asks
                                  if ask.prefill and ask.decoder.member in self._members)
        return out


@dataclass(frozen=True, slots=True)
class _WithModel:
    """A loaded model's spec and device with another torch model (a weights variant's copy)."""

    base: Any
    model: Any

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)
