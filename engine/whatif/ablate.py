"""Switch heads or a layer's MLP off, and see what the model does without them.

A head's contribution to the residual stream is its slice of the attention output before the
output projection (TransformerLens's `blocks.L.attn.hook_z`): o_proj reads the heads'
outputs side by side, head h in columns h·d … (h+1)·d − 1. Zero ablation sets that slice to 0 at
every position; mean ablation sets it to its mean over the prompt's positions (the head still
adds its average, not what it read here). An MLP ablation zeroes the MLP's output
(`hook_mlp_out`). The hooks sit on o_proj's input and on the MLP's output, so the rest of the
forward is transformers' own, KV cache included.

Shapes: S prompt positions, H heads, d head dimension, V vocabulary, L layers.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from i18n import _

from ..errors import EngineError, InputError
from ..loader import LoadedModel
from ..records.trace import Trace
from ..runner import Run
from ..settings import GenerationSettings

TOP = 10  # candidates shown for the first generated token


@dataclass(frozen=True, slots=True)
class Ablation:
    layer: int
    heads: tuple[int, ...] = ()
    mlp: bool = False
    mean: bool = False  # mean over the prompt instead of zero (heads only)

    def describe(self) -> str:
        parts = [f"head{'s' if len(self.heads) > 1 else ''} {', '.join(map(str, self.heads))}"
                 ] if self.heads else []
        parts += ["the MLP"] if self.mlp else []
        how = "mean-ablated" if self.mean else "zeroed"
        return f"layer {self.layer}: {' and '.join(parts) or 'nothing'} {how}"


def check_ablation(lm: LoadedModel, a: Ablation) -> None:
    spec = lm.spec
    if not 0 <= a.layer < spec.layers:
        raise InputError(f"--layer {a.layer} is not a layer of this model (0 … {spec.layers - 1})")
    bad = [h for h in a.heads if not 0 <= h < spec.heads]
    if bad or len(set(a.heads)) != len(a.heads):
        raise InputError(f"heads must be distinct, each 0 … {spec.heads - 1}: got "
                         f"{', '.join(map(str, a.heads))}")


def _head_means(lm: LoadedModel, layer: int, ids: Sequence[int]) -> torch.Tensor:
    """(H · d,) the mean over the prompt's positions of o_proj's input at `layer`."""
    seen: list[torch.Tensor] = []
    o_proj = lm.model.model.layers[layer].self_attn.o_proj
    hook = o_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0][0].mean(0)))
    try:
        with torch.inference_mode():
            lm.model(input_ids=torch.tensor([list(ids)], device=lm.device), use_cache=False)
    finally:
        hook.remove()
    return seen[0]


@contextlib.contextmanager
def ablated(lm: LoadedModel, a: Ablation, prompt_ids: Sequence[int] | None = None) -> Iterator[None]:
    """Within the block every forward of `lm.model` runs with `a` applied (mean ablation reads
    its means from `prompt_ids` first)."""
    check_ablation(lm, a)
    block = lm.model.model.layers[a.layer]
    d = lm.spec.head_dim
    hooks = []
    if a.heads:
        cols = torch.cat([torch.arange(h * d, (h + 1) * d) for h in a.heads])  # (|heads| · d,)
        if a.mean:
            if prompt_ids is None:
                raise InputError("mean ablation needs the prompt to take the means over")
            means = _head_means(lm, a.layer, prompt_ids)[cols]  # (|heads| · d,)

        def heads_off(_module: Any, args: tuple) -> tuple:
            z = args[0].clone()  # (B, T, H · d): every head's output, side by side
            z[..., cols] = means.to(z.dtype) if a.mean else 0.0
            return (z, *args[1:])

        hooks.append(block.self_attn.o_proj.register_forward_pre_hook(heads_off))
    if a.mlp:
        hooks.append(block.mlp.register_forward_hook(
            lambda _m, _args, out: torch.zeros_like(out)))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


@dataclass(frozen=True, slots=True, eq=False)
class AblationResult:
    ablation: Ablation
    baseline: torch.Tensor  # (V,) probabilities of the first generated token, unablated
    ablated: torch.Tensor  # (V,) the same with the ablation
    baseline_run: Trace  # the prompt's run, recorded (greedy, torch)
    ablated_run: Trace  # the same run with the ablation: its attention, its text

    @property
    def baseline_tokens(self) -> tuple[int, ...]:
        return self.baseline_run.output_token_ids

    @property
    def ablated_tokens(self) -> tuple[int, ...]:
        return self.ablated_run.output_token_ids

    @property
    def kl(self) -> float:
        """KL(baseline ‖ ablated) of the first generated token's distribution, nats."""
        p, q = self.baseline.double(), self.ablated.double()
        return float((p * (p.clamp_min(1e-300).log() - q.clamp_min(1e-300).log())).sum())

    @property
    def top1_changed(self) -> bool:
        return int(self.baseline.argmax()) != int(self.ablated.argmax())

    @property
    def first_difference(self) -> int | None:
        pairs = zip(self.baseline_tokens, self.ablated_tokens)
        found = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        if found is None and len(self.baseline_tokens) != len(self.ablated_tokens):
            return min(len(self.baseline_tokens), len(self.ablated_tokens))
        return found

    def top(self, probs: torch.Tensor, k: int = TOP) -> list[dict[str, float | int]]:
        values, ids = torch.topk(probs, k)
        return [{"id": int(i), "prob": float(p)} for p, i in zip(values, ids)]

    def to_json(self, decode: Callable[[Sequence[int]], str]) -> dict[str, Any]:
        return {"ablation": self.ablation.describe(), "kl": self.kl,
                "top1_changed": self.top1_changed,
                "baseline": {"top": self.top(self.baseline),
                             "text": decode(self.baseline_tokens)},
                "ablated": {"top": self.top(self.ablated), "text": decode(self.ablated_tokens)},
                "first_difference": self.first_difference}


@torch.inference_mode()
def next_token_probs(lm: LoadedModel, ids: Sequence[int]) -> torch.Tensor:
    """(V,) float32 softmax of the last position's logits."""
    out = lm.model(input_ids=torch.tensor([list(ids)], device=lm.device), use_cache=False,
                   logits_to_keep=1)
    return torch.softmax(out.logits[0, -1].float(), -1)


def ablation_settings(settings: GenerationSettings, new_tokens: int) -> GenerationSettings:
    """The runs an ablation compares: greedy (the text changes only where the model does), in
    torch (the hooks sit on torch modules), recording what the run's settings record."""
    return replace(settings, max_new_tokens=new_tokens, temperature=0.0, decoder="torch",
                   kv_cache=True)


def ablate(lm: LoadedModel, prompt: str, a: Ablation, settings: GenerationSettings,
           new_tokens: int = 16, weights: str | None = None,
           stop: threading.Event | None = None) -> AblationResult:
    """The first generated token's distribution and a greedy run, with and without `a`. `stop`
    (a click's budget) is checked before each forward and between the runs' steps: set, the
    ablation ends with an EngineError saying so (half a comparison compares nothing)."""
    chosen = ablation_settings(settings, new_tokens)

    def run_all() -> Trace:
        trace = Run(lm, prompt, chosen, stop_event=stop, weights=weights).run_all()
        if trace.stop_reason == "stopped":
            raise EngineError(_("the per-click budget ran out before both runs were done: "
                                "nothing compared"))
        return trace

    def probs_of(ids: Sequence[int]) -> torch.Tensor:
        if stop is not None and stop.is_set():
            raise EngineError(_("the per-click budget ran out before both runs were done: "
                                "nothing compared"))
        return next_token_probs(lm, ids)

    base_run = run_all()
    ids = base_run.prompt_token_ids
    base = probs_of(ids)
    with ablated(lm, a, ids):
        probs = probs_of(ids)
        run = run_all()
    return AblationResult(a, base.cpu(), probs.cpu(), base_run, run)


def head_sweep(lm: LoadedModel, prompt_ids: Sequence[int], layers: Sequence[int] | None = None,
               mean: bool = False, say: Callable[[str, float], None] | None = None,
               stop: Callable[[], bool] | None = None) -> np.ndarray:
    """(L, H) KL(baseline ‖ head ablated) of the next token, one head at a time; rows of layers
    not in `layers` (or not reached before `stop()`) are NaN. One forward per layer: a batch of
    H copies of the prompt, copy h with head h ablated (the same hook as `ablated`, per row)."""
    spec = lm.spec
    chosen = list(range(spec.layers)) if layers is None else list(layers)
    found = np.full((spec.layers, spec.heads), np.nan)
    if stop is not None and stop():  # checked before every forward, the baseline's too
        return found
    base = next_token_probs(lm, prompt_ids).double()  # (V,)
    d, h_count = spec.head_dim, spec.heads
    batch = torch.tensor([list(prompt_ids)] * h_count, device=lm.device)  # (H, S)
    rows = torch.arange(h_count)
    for i, layer in enumerate(chosen):
        if stop is not None and stop():
            break
        if say is not None:
            say(f"Layer {layer}: each of its {h_count} heads off in turn…", i / len(chosen))
        check_ablation(lm, Ablation(layer))
        means = _head_means(lm, layer, prompt_ids).view(h_count, d) if mean else None  # (H, d)

        def one_head_each(_module: Any, args: tuple, means: torch.Tensor | None = means) -> tuple:
            z = args[0].clone().view(h_count, -1, h_count, d)  # (H copies, S, H heads, d)
            z[rows, :, rows] = 0.0 if means is None else means.to(z.dtype)[:, None]
            return (z.view(*args[0].shape), *args[1:])

        o_proj = lm.model.model.layers[layer].self_attn.o_proj
        hook = o_proj.register_forward_pre_hook(one_head_each)
        try:
            with torch.inference_mode():
                logits = lm.model(input_ids=batch, use_cache=False, logits_to_keep=1).logits
        finally:
            hook.remove()
        q = torch.softmax(logits[:, -1].double(), -1)  # (H, V)
        found[layer] = (base * (base.clamp_min(1e-300).log() - q.clamp_min(1e-300).log())
                        ).sum(-1).cpu().numpy()
    return found
