"""KV-cache experiments on the loaded model: what each cache variant costs in memory and quality,
and what turning the cache off costs in time.

Quality is measured by teacher forcing: the full-cache run's tokens are fed to every variant, and
at each step the variant's next-token distribution is compared with the full cache's (KL
divergence, and whether the most probable token agrees).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from .kvcache import CacheConfig, build_cache, cache_layer_bytes
from .loader import LoadedModel
from .runner import Run
from .settings import GenerationSettings


@dataclass(frozen=True, slots=True, eq=False)
class VariantRun:
    config: CacheConfig
    kl: np.ndarray  # (steps,) KL(full ‖ variant) in nats
    agree: np.ndarray  # (steps,) bool: same most probable token as the full cache
    kv_bytes: np.ndarray  # (steps,) bytes held after each step

    @property
    def agreement(self) -> float:
        return float(self.agree.mean()) if len(self.agree) else 1.0


@torch.inference_mode()
def _teacher_forced(lm: LoadedModel, ids: list[int], n_prompt: int, config: CacheConfig
                    ) -> tuple[list[torch.Tensor], list[int]]:
    cache = build_cache(lm.model, config)
    seq = torch.tensor([ids], device=lm.device)
    logps, sizes = [], []
    out = lm.model(input_ids=seq[:, :n_prompt], cache=cache, use_cache=True, logits_to_keep=1)
    for i in range(n_prompt, len(ids) + 1):
        logps.append(torch.log_softmax(out.logits[0, -1].float(), -1))
        sizes.append(sum(cache_layer_bytes(cache)))
        if i < len(ids):
            out = lm.model(input_ids=seq[:, i:i + 1], cache=cache, use_cache=True, logits_to_keep=1)
    return logps, sizes


def compare_caches(lm: LoadedModel, prompt_ids: list[int], output_ids: list[int],
                   configs: list[CacheConfig]) -> Iterator[VariantRun]:
    """The full cache first, then each variant, on the same token sequence."""
    ids = list(prompt_ids) + list(output_ids[:-1])
    ref, ref_sizes = _teacher_forced(lm, ids, len(prompt_ids), CacheConfig())
    yield VariantRun(CacheConfig(), np.zeros(len(ref)), np.ones(len(ref), dtype=bool),
                     np.array(ref_sizes))
    for config in configs:
        logps, sizes = _teacher_forced(lm, ids, len(prompt_ids), config)
        kl = np.array([float((r.exp() * (r - v)).sum()) for r, v in zip(ref, logps)])
        agree = np.array([int(r.argmax()) == int(v.argmax()) for r, v in zip(ref, logps)])
        yield VariantRun(config, kl, agree, np.array(sizes))


@dataclass(frozen=True, slots=True, eq=False)
class OnOff:
    new_tokens: int
    on_ms: np.ndarray  # per step, cache on
    off_ms: np.ndarray  # per step, cache off
    same_tokens: bool

    @property
    def speedup(self) -> float:
        return float(self.off_ms.sum() / self.on_ms.sum())


def cache_on_off(lm: LoadedModel, prompt: str, lengths: list[int]) -> Iterator[OnOff]:
    """Generate the same greedy tokens with the cache and without it, for each output length."""
    for n in lengths:
        runs = {}
        for kv in (True, False):
            settings = GenerationSettings(max_new_tokens=n, kv_cache=kv, record_attention=False,
                                          record_hidden=False)
            runs[kv] = Run(lm, prompt, settings).run_all()
        on, off = runs[True], runs[False]
        yield OnOff(n, np.array([s.latency_ms for s in on.steps]),
                    np.array([s.latency_ms for s in off.steps]),
                    on.output_token_ids == off.output_token_ids)
