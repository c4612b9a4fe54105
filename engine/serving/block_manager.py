"""The KV block pool: which physical block holds which tokens of which request.

vLLM's PagedAttention idea, kept apart from the scheduler and the model runner (as nano-vllm does):
the K/V of every request live in fixed-size blocks of one shared pool; a request's block table
maps its logical block i (positions i·block_size …) to a physical block. Nothing is reserved ahead:
a request takes a block only when its previous one is full, so at most block_size − 1 slots per
request are empty.

Prefix sharing follows vLLM's automatic prefix caching: a *full* block is identified by its tokens
and every token before them (a chain key), so two requests whose prompts start with the same
tokens map those blocks to the same physical block (reference-counted). A freed block keeps its key
until it is handed out again, so a later request can still find it. A request never writes into a
block another request also holds: it copies the block first (copy-on-write) — this happens when a
prompt is cached up to its very last token, which must still be computed for its logits.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

BlockKey = tuple  # (parent key or None, tokens of the block): equal keys ⇔ equal token prefixes


@dataclass
class _Table:
    blocks: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # the token ids whose K/V the blocks hold (or will)
    keys: list[BlockKey] = field(default_factory=list)  # chain keys of its full blocks


class BlockManager:
    """Allocates, shares, copies and frees blocks. Slots are numbered block · block_size + offset."""

    def __init__(self, num_blocks: int, block_size: int, prefix_sharing: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_sharing = prefix_sharing
        self.ref = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._key_of: dict[int, BlockKey] = {}
        self._block_of: dict[BlockKey, int] = {}
        self.tables: dict[int, _Table] = {}
        self.copies: list[tuple[int, int]] = []  # (source, destination) copies not yet done in the pool

    # ---- queries -------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def shared_blocks(self) -> int:
        return sum(1 for r in self.ref if r > 1)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _chain(self, tokens: list[int]) -> list[BlockKey]:
        keys: list[BlockKey] = []
        parent: BlockKey | None = None
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            parent = (parent, tuple(tokens[start:start + self.block_size]))
            keys.append(parent)
        return keys

    def cached_blocks(self, tokens: list[int]) -> list[int]:
        """Physical blocks already holding the leading full blocks of `tokens` (prefix sharing)."""
        if not self.prefix_sharing:
            return []
        found = []
        for key in self._chain(tokens):
            block = self._block_of.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def can_allocate(self, tokens: list[int]) -> bool:
        """Enough free blocks for `tokens` plus the first generated token, counting cached ones."""
        cached = self.cached_blocks(tokens)
        reused_free = sum(1 for b in cached if self.ref[b] == 0)
        needed = self.blocks_for(len(tokens) + 1) - len(cached) + reused_free
        return needed <= self.free_blocks

    def slot(self, request: int, position: int) -> int:
        table = self.tables[request]
        return table.blocks[position // self.block_size] * self.block_size + position % self.block_size

    def context_slots(self, request: int) -> list[int]:
        return [self.slot(request, p) for p in range(len(self.tables[request].tokens))]

    # ---- changes -------------------------------------------------------------------------
    def _take(self) -> int:
        block, _ = self._free.popitem(last=False)  # least recently freed first: keeps cached keys longest
        old = self._key_of.pop(block, None)
        if old is not None and self._block_of.get(old) == block:
            del self._block_of[old]
        self.ref[block] = 1
        return block

    def _hold(self, block: int) -> None:
        if self.ref[block] == 0:
            del self._free[block]
        self.ref[block] += 1

    def allocate(self, request: int, tokens: list[int]) -> int:
        """Give `request` blocks for `tokens`; returns how many leading tokens are already cached
        (their K/V need not be computed). At least the last token is always left to compute."""
        if request in self.tables:
            raise ValueError(f"request {request} already holds blocks")
        cached = self.cached_blocks(tokens)
        table = _Table()
        for block in cached:
            self._hold(block)
            table.blocks.append(block)
        self.tables[request] = table
        table.keys = self._chain(tokens)[:len(cached)]
        table.tokens = list(tokens[:len(cached) * self.block_size])
        cached_tokens = min(len(table.tokens), len(tokens) - 1)
        del table.tokens[cached_tokens:]
        self.append(request, tokens[cached_tokens:])
        return cached_tokens

    def append(self, request: int, new_tokens: list[int]) -> list[int]:
        """Slots for the K/V of `new_tokens` at the request's next positions: new blocks as needed,
        a copy of a shared block before writing into it. Full blocks get their chain key."""
        table = self.tables[request]
        slots = []
        for token in new_tokens:
            position = len(table.tokens)
            index = position // self.block_size
            if index == len(table.blocks):
                table.blocks.append(self._take())
            elif self.ref[table.blocks[index]] > 1:  # copy-on-write
                source = table.blocks[index]
                target = self._take()
                self.ref[source] -= 1
                self.copies.append((source, target))
                table.blocks[index] = target
                del table.keys[index:]
            table.tokens.append(token)
            slots.append(table.blocks[index] * self.block_size + position % self.block_size)
            if len(table.tokens) % self.block_size == 0 and len(table.keys) == index:
                self._register(table, index)
        return slots

    def _register(self, table: _Table, index: int) -> None:
        parent = table.keys[index - 1] if index else None
        key = (parent, tuple(table.tokens[index * self.block_size:(index + 1) * self.block_size]))
        table.keys.append(key)
        if self.prefix_sharing and key not in self._block_of:
            block = table.blocks[index]
            self._block_of[key] = block
            self._key_of[block] = key

    def truncate(self, request: int, length: int) -> None:
        """Forget positions ≥ `length` (rejected draft tokens); blocks beyond it are freed."""
        table = self.tables[request]
        del table.tokens[length:]
        for index in range(length // self.block_size, len(table.keys)):  # contents will change
            block = table.blocks[index]
            if self.ref[block] == 1 and self._block_of.get(table.keys[index]) == block:
                del self._block_of[table.keys[index]]
                del self._key_of[block]
        del table.keys[length // self.block_size:]
        keep = self.blocks_for(length)
        for block in table.blocks[keep:]:
            self._release(block)
        del table.blocks[keep:]

    def _release(self, block: int) -> None:
        self.ref[block] -= 1
        if self.ref[block] == 0:
            self._free[block] = None

    def free(self, request: int) -> None:
        for block in self.tables.pop(request).blocks:
            self._release(block)
