"""Which requests run in the next step: admission, decoding, preemption.

Kept apart from the block pool (block_manager.py) and the forward (model_runner.py), as in
nano-vllm. Policies:

- **continuous** (iteration-level scheduling, Orca / vLLM): every step decodes each running request
  by one token and, in the same forward, prefills waiting requests as long as a batch slot and
  enough blocks are free. A finished request's slot is refilled at the next step.
- **static**: a batch is admitted only when the previous batch has fully finished, so every batch
  lasts as long as its longest member.

Prefill is not chunked: an admitted request's whole (uncached) prompt runs in its first step.
When a running request needs a new block and none is free, the most recently admitted request is
preempted (its blocks freed; it waits again and recomputes its prompt and tokens so far — vLLM's
recompute preemption).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .record import RequestSpec, ServingConfig


@dataclass
class Sequence:
    id: int
    spec: RequestSpec
    output: list[int] = field(default_factory=list)
    token_ms: list[float] = field(default_factory=list)
    token_steps: list[int] = field(default_factory=list)
    admitted_ms: float | None = None
    cached_tokens: int = 0
    preemptions: int = 0
    finish: str | None = None

    @property
    def tokens(self) -> list[int]:
        """Every token whose K/V the request needs: prompt and all output so far."""
        return list(self.spec.prompt_token_ids) + self.output


@dataclass
class Plan:
    prefills: list[tuple[Sequence, int]]  # (request, cached prompt tokens)
    decodes: list[tuple[Sequence, int, int]]  # (request, position of its input token, its slot)
    preempted: list[Sequence]

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes


class Scheduler:
    def __init__(self, config: ServingConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def arrive(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def _needs_block(self, seq: Sequence) -> bool:
        table = self.blocks.tables[seq.id]
        position = len(table.tokens)
        index = position // self.blocks.block_size
        return index == len(table.blocks) or self.blocks.ref[table.blocks[index]] > 1

    def _preempt_for(self, seq: Sequence, preempted: list[Sequence]) -> bool:
        """Free blocks until `seq` can grow; False when `seq` itself had to go."""
        while self._needs_block(seq) and self.blocks.free_blocks == 0:
            victim = self.running.pop()  # the most recently admitted
            self.blocks.free(victim.id)
            victim.preemptions += 1
            self.waiting.appendleft(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    def schedule(self) -> Plan:
        preempted: list[Sequence] = []
        decodes: list[tuple[Sequence, int, int]] = []
        for seq in list(self.running):  # oldest first; victims are taken from the newest
            if seq not in self.running or not self._preempt_for(seq, preempted):
                continue
            position = len(self.blocks.tables[seq.id].tokens)
            decodes.append((seq, position, self.blocks.append(seq.id, seq.output[-1:])[0]))
        prefills: list[tuple[Sequence, int]] = []
        may_admit = not preempted and (self.config.scheduler == "continuous" or not self.running)
        while may_admit and self.waiting and len(self.running) < self.config.max_batch:
            seq = self.waiting[0]
            if not self.blocks.can_allocate(seq.tokens):
                break
            self.waiting.popleft()
            cached = self.blocks.allocate(seq.id, seq.tokens)
            self.running.append(seq)
            prefills.append((seq, cached))
        return Plan(prefills, decodes, preempted)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.finish = reason
        self.running.remove(seq)
        self.blocks.free(seq.id)
