"""One forward over a batch of requests whose K/V live in the block pool.

The model's own modules and weights do the work (embedding, norms, activation, rotary embedding)
and the projections use its weight tensors (packed for small batches, linear.py; a GGUF's stored
matrices multiply on their own blocks) — so whatever weights the session loaded run here
unchanged; attention is ours, because it reads K/V through block tables. Every request's new
tokens are laid end to end in one row (vLLM's "flattened" batch), so each Linear reads its weights
once per step for the whole batch: that is why a decode step of 8 requests costs little more than
a step of 1. Attention then gathers each request's context from the pool by its slots and runs
padded with a mask.

Order inside each layer: write the step's new K/V into the pool, do any copy-on-write block copies
(and write again, so a request's own values win), then gather. A request may therefore attend to a
shared prefix block that another request in the same step is computing — as in vLLM, blocks are
shared from the step that fills them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from .linear import Linear, has_float_weight

SUPPORTED = ("llama",)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One request's share of a step: `token_ids` at positions start … start + len − 1, their
    K/V written to `new_slots`; attention reads `context_slots` (all positions 0 … end − 1)."""

    token_ids: list[int]
    start: int
    new_slots: list[int]
    context_slots: list[int]


def serving_problem(lm: Any) -> str | None:
    """Why the batched engine cannot serve this model (None: it can)."""
    if lm.spec.model_type not in SUPPORTED:
        return (f"serving runs need a Llama-family model (this one is {lm.spec.model_type!r}); "
                "its attention is read through block tables by code written for that layout")
    if lm.spec.sliding_window:
        return "serving runs do not implement sliding-window attention"
    return None


def packs_weights(lm: Any) -> bool:
    """Whether the runner packs a copy of the weights (float Linears; a GGUF's stored ones are
    multiplied as they are)."""
    return has_float_weight(lm.model.lm_head)


def check_pool_memory(lm: Any, slots: int, pack: bool = True) -> None:
    """Refuse, before allocating, a pool plus packed weights over half the free memory."""
    from ..errors import InputError
    from ..quant.variants import available_memory

    pool = slots * lm.spec.kv_bytes_per_token
    packed = lm.spec.weight_bytes if pack and packs_weights(lm) else 0
    need = pool + packed  # the pool and the packed copy of the weights
    free = available_memory()
    if need > free / 2:
        what = (f"a pool of {slots:,} token slots ({pool / 1e9:.1f} GB of K/V) plus a packed copy "
                f"of the weights needs {need / 1e9:.1f} GB" if packed else
                f"a pool of {slots:,} token slots needs {pool / 1e9:.1f} GB of K/V")
        raise InputError(f"{what}, more than half of the {free / 1e9:.1f} GB of free memory: "
                         "not started")


class PagedModelRunner:
    """Holds the K and V pools: (layers, num_blocks · block_size slots, kv_heads, head_dim)."""

    def __init__(self, lm: Any, num_blocks: int, block_size: int, pack: bool = True) -> None:
        """`pack` False: no packed copy of float weights (linear.py), F.linear on the model's."""
        problem = serving_problem(lm)
        if problem:
            raise ValueError(problem)
        check_pool_memory(lm, num_blocks * block_size, pack)
        self.model = lm.model
        self.spec = lm.spec
        self.device = lm.device
        inner = lm.model.model
        dtype = inner.norm.weight.dtype  # the model's float dtype (a GGUF's embedding is stored)
        shape = (lm.spec.layers, num_blocks * block_size, lm.spec.kv_heads, lm.spec.head_dim)
        self.k_pool = torch.zeros(shape, dtype=dtype, device=lm.device)
        self.v_pool = torch.zeros(shape, dtype=dtype, device=lm.device)
        self.block_size = block_size
        self.linears = [{name: Linear(module, pack) for name, module in (
            ("q", layer.self_attn.q_proj), ("k", layer.self_attn.k_proj),
            ("v", layer.self_attn.v_proj), ("o", layer.self_attn.o_proj),
            ("gate", layer.mlp.gate_proj), ("up", layer.mlp.up_proj), ("down", layer.mlp.down_proj))}
            for layer in inner.layers[:lm.spec.layers]]
        self.lm_head = Linear(lm.model.lm_head, pack)

    @property
    def pool_bytes(self) -> int:
        return self.k_pool.nbytes + self.v_pool.nbytes

    @property
    def packed_bytes(self) -> int:
        """The packed copies of the weights this runner holds (0 without)."""
        return sum(lin.packed.nbytes for lin in [self.lm_head, *(
            x for layer in self.linears for x in layer.values())] if lin.packed is not None)

    def read_kv(self, layer: int, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V stored at `slots` of one layer: (len(slots), kv_heads, head_dim) each."""
        index = torch.tensor(slots, device=self.device)
        return self.k_pool[layer, index], self.v_pool[layer, index]

    @torch.inference_mode()
    def forward(self, chunks: list[Chunk], copies: list[tuple[int, int]] = ()) -> torch.Tensor:
        """Logits (B, vocab) at the last new position of each chunk."""
        return self.forward_recorded(chunks, copies).logits

    @torch.inference_mode()
    def forward_recorded(self, chunks: list[Chunk], copies: list[tuple[int, int]] = (),
                         attention_layers: frozenset[int] = frozenset(),
                         hidden: bool = False, whole: frozenset[int] = frozenset()) -> "Recorded":
        """`forward`, also keeping for each chunk's last new position what a traced run records:
        each layer of `attention_layers`'s softmax row per head over the chunk's context (those
        layers' attention computed explicitly, the others by SDPA), and with `hidden` the
        residual stream entering every layer and leaving the last. For the chunks whose index is
        in `whole` (a prompt's prefill) every new position's row is kept, as a prefill records."""
        device, spec, bs = self.device, self.spec, self.block_size
        inner = self.model.model
        lengths = [len(c.token_ids) for c in chunks]
        ids = torch.tensor([t for c in chunks for t in c.token_ids], device=device)  # (T,)
        positions = torch.tensor([c.start + i for c in chunks for i in range(len(c.token_ids))],
                                 device=device)  # (T,)
        new_slots = torch.tensor([s for c in chunks for s in c.new_slots], device=device)  # (T,)
        q_max = max(lengths)
        l_max = max(len(c.context_slots) for c in chunks)
        batch = len(chunks)
        # where each request's queries sit in the flat row, padded to q_max: (B, Q)
        flat = torch.zeros(batch, q_max, dtype=torch.long, device=device)
        ctx = torch.zeros(batch, l_max, dtype=torch.long, device=device)  # context slots (B, L)
        mask = torch.zeros(batch, 1, q_max, l_max, dtype=torch.bool, device=device)
        offset = 0
        for b, c in enumerate(chunks):
            n, length = lengths[b], len(c.context_slots)
            flat[b, :n] = torch.arange(offset, offset + n, device=device)
            ctx[b, :length] = torch.tensor(c.context_slots, device=device)
            query_pos = torch.arange(c.start, c.start + n, device=device)[:, None]  # (n, 1)
            mask[b, 0, :n, :length] = torch.arange(length, device=device)[None, :] <= query_pos
            mask[b, 0, n:, 0] = True  # padded query rows look at one slot: no NaN, never read
            offset += n
        valid = torch.zeros(batch, q_max, dtype=torch.bool, device=device)
        for b, n in enumerate(lengths):
            valid[b, :n] = True
        copy_src = torch.tensor([s * bs + i for s, _ in copies for i in range(bs)], device=device)
        copy_dst = torch.tensor([d * bs + i for _, d in copies for i in range(bs)], device=device)
        last = torch.tensor([sum(lengths[:b + 1]) - 1 for b in range(batch)], device=device)
        batch_rows = torch.arange(batch, device=device)
        last_query = torch.tensor(lengths, device=device) - 1  # (B,) each chunk's last new row
        attention: dict[int, torch.Tensor] = {}  # layer → (B, H, L) the last query's softmax
        kept: dict[int, dict[int, torch.Tensor]] = {b: {} for b in whole}  # chunk → layer → rows
        residual: list[torch.Tensor] = []  # (B, hidden) entering each layer, then leaving

        hidden_states = inner.embed_tokens(ids)[None]  # (1, T, hidden)
        cos, sin = inner.rotary_emb(hidden_states, position_ids=positions[None])  # (1, T, D)
        groups = spec.heads // spec.kv_heads
        for index, layer in enumerate(inner.layers[:spec.layers]):
            if hidden:
                residual.append(hidden_states[0, last])
            attn = layer.self_attn
            x = layer.input_layernorm(hidden_states)
            lin = self.linears[index]
            q, k, v = lin["q"](x), lin["k"](x), lin["v"](x)
            q = q.view(1, -1, spec.heads, spec.head_dim).transpose(1, 2)  # (1, H, T, D)
            k = k.view(1, -1, spec.kv_heads, spec.head_dim).transpose(1, 2)  # (1, KV, T, D)
            v = v.view(1, -1, spec.kv_heads, spec.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k_new, v_new = k[0].transpose(0, 1), v[0].transpose(0, 1)  # (T, KV, D)
            self.k_pool[index, new_slots] = k_new
            self.v_pool[index, new_slots] = v_new
            if copies:
                self.k_pool[index, copy_dst] = self.k_pool[index, copy_src]
                self.v_pool[index, copy_dst] = self.v_pool[index, copy_src]
                self.k_pool[index, new_slots] = k_new
                self.v_pool[index, new_slots] = v_new
            keys = self.k_pool[index, ctx].permute(0, 2, 1, 3)  # (B, KV, L, D)
            values = self.v_pool[index, ctx].permute(0, 2, 1, 3)
            keys = keys.repeat_interleave(groups, dim=1)  # (B, H, L, D)
            values = values.repeat_interleave(groups, dim=1)
            queries = q[0][:, flat].permute(1, 0, 2, 3)  # (B, H, Q, D)
            if index in attention_layers:
                scores = (queries @ keys.transpose(-1, -2)) * attn.scaling  # (B, H, Q, L)
                probs = torch.softmax(scores.masked_fill(~mask, float("-inf")).float(), dim=-1)
                out = probs.to(values.dtype) @ values  # (B, H, Q, D)
                attention[index] = probs[batch_rows, :, last_query]
                for b in whole:  # (H, n, context) float16, as the prefill's recorder keeps it
                    kept[b][index] = probs[b, :, :lengths[b], :len(chunks[b].context_slots)].to(
                        torch.float16)
            else:
                out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask,
                                                     scale=attn.scaling)  # (B, H, Q, D)
            out = out.permute(0, 2, 1, 3)[valid]  # (T, H, D), flat order
            hidden_states = hidden_states + lin["o"](
                out.reshape(1, -1, spec.heads * spec.head_dim))
            x = layer.post_attention_layernorm(hidden_states)
            hidden_states = hidden_states + lin["down"](
                layer.mlp.act_fn(lin["gate"](x)) * lin["up"](x))
        if hidden:
            residual.append(hidden_states[0, last])
        logits = self.lm_head(inner.norm(hidden_states[0, last]))  # (B, vocab)
        return Recorded(logits, attention, torch.stack(residual, dim=1) if hidden else None, kept)


@dataclass(frozen=True, slots=True, eq=False)
class Recorded:
    """A forward's logits (B, vocab); `attention`: layer → (B, H, L) the last new position's
    softmax row per head (positions past a chunk's context are 0); `hidden`: (B, layers + 1,
    hidden) or None; `whole`: for the chunks asked whole, layer → (H, new, context) float16."""

    logits: torch.Tensor
    attention: dict[int, torch.Tensor]
    hidden: torch.Tensor | None
    whole: dict[int, dict[int, torch.Tensor]]
