"""How a paged allocator (vLLM's PagedAttention) would lay out KV caches in fixed-size blocks.

This is a model of the allocation, computed from sequence lengths; the engine itself stores each
sequence's cache contiguously. Sequences grow one token per step together (as in a batch), and a
sequence takes the next free physical block whenever its last block is full.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PagedLayout:
    block_size: int
    lengths: tuple[int, ...]
    block_tables: tuple[tuple[int, ...], ...]  # per sequence: logical block → physical block

    @property
    def blocks(self) -> int:
        return sum(len(t) for t in self.block_tables)

    def waste(self, seq: int) -> int:
        """Unused token slots in the sequence's last block."""
        return len(self.block_tables[seq]) * self.block_size - self.lengths[seq]

    @property
    def total_waste(self) -> int:
        return sum(self.waste(i) for i in range(len(self.lengths)))

    def contiguous_waste(self, max_len: int) -> int:
        """Slots wasted if each sequence had reserved `max_len` contiguous slots up front."""
        return sum(max_len - n for n in self.lengths)


def paged_layout(lengths: list[int], block_size: int = 16) -> PagedLayout:
    if block_size < 1 or any(n < 0 for n in lengths):
        raise ValueError("block size must be positive and lengths non-negative")
    tables: list[list[int]] = [[] for _ in lengths]
    next_free = 0
    for t in range(max(lengths, default=0)):
        for seq, n in enumerate(lengths):
            if t < n and t % block_size == 0:  # this token opens a new block
                tables[seq].append(next_free)
                next_free += 1
    return PagedLayout(block_size, tuple(lengths), tuple(tuple(t) for t in tables))
