"""KV-cache experiments on the loaded model: what each cache variant costs in memory and quality,
and what turning the cache off costs in time.

Quality is measured by teacher forcing: the full-cache run's tokens are fed to every variant, and
at each step the variant's next-token distribution is compared with the full cache's (KL
divergence, and whether the most probable token agrees).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from ..errors import InputError
from ..forward import cache_layer_bytes
from ..loader import LoadedModel
from ..runner import Run
from ..settings import GenerationSettings
from .kvcache import CacheConfig, build_cache


@dataclass(frozen=True, slots=True, eq=False)
class VariantRun:
    config: CacheConfig
    kl: np.ndarray  # (steps,) KL(full ‖ variant) in nats
    agree: np.ndarray  # (steps,) bool: same most probable token as the full cache
    kv_bytes: np.ndarray  # (steps,) bytes held after each step

    @property
    def agreement(self) -> float:
        return float(self.agree.mean()) if len(self.agree) else 1.0


def check_sequence(lm: LoadedModel, ids: list[int], max_tokens: int) -> None:
    """Refuse, with one line, a token sequence the model should not be run on here: longer than
    this app's limit or the model's context, or with ids outside its vocabulary."""
    if len(ids) > max_tokens:
        raise InputError(f"this trace has {len(ids):,} tokens; experiments here run the model on "
                         f"at most {max_tokens:,}")
    if lm.spec.max_context and len(ids) > lm.spec.max_context:
        raise InputError(f"this trace has {len(ids):,} tokens, more than the model's context of "
                         f"{lm.spec.max_context:,}")
    if any(not 0 <= i < lm.spec.vocab_size for i in ids):
        raise InputError("this trace has token ids outside the loaded model's vocabulary")


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
                   configs: list[CacheConfig], max_tokens: int = 4096) -> Iterator[VariantRun]:
    """The full cache first, then each variant, on the same token sequence (at most `max_tokens`
    of it: a longer one is refused, since each variant reruns it token by token)."""
    ids = list(prompt_ids) + list(output_ids[:-1])
    check_sequence(lm, ids, max_tokens)
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


def cache_on_off(lm: LoadedModel, prompt: str, lengths: list[int], max_prompt_tokens: int = 2048,
                 max_new_tokens: int = 4096, stop: threading.Event | None = None
                 ) -> Iterator[OnOff]:
    """Generate the same greedy tokens with the cache and without it, for each output length.
    Once `stop` is set (a time budget), the runs end early and the cut length is not reported."""
    if any(not 1 <= n <= max_new_tokens for n in lengths):
        raise InputError(f"output lengths must be between 1 and {max_new_tokens} tokens here")
    for n in lengths:
        runs = {}
        for kv in (True, False):
            settings = GenerationSettings(max_new_tokens=n, kv_cache=kv, record_attention=False,
                                          record_hidden=False, max_prompt_tokens=max_prompt_tokens)
            runs[kv] = Run(lm, prompt, settings, stop_event=stop).run_all()
        on, off = runs[True], runs[False]
        if on.stop_reason == "stopped" or off.stop_reason == "stopped":
            return
        yield OnOff(n, np.array([s.latency_ms for s in on.steps]),
                    np.array([s.latency_ms for s in off.steps]),
                    on.output_token_ids == off.output_token_ids)
