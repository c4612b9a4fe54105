"""A stream of requests: prompts, output lengths and arrival times."""

from __future__ import annotations

import math
import random
from typing import Any, Sequence

from ..errors import InputError
from ..forward import prepare_prompt
from .record import RequestSpec

ARRIVALS = ("all", "poisson")
MAX_RATE_PER_S = 1000.0


def arrival_times(n: int, arrival: str, rate_per_s: float, seed: int) -> list[float]:
    """ms after the stream starts: all at 0, or a Poisson process (exponential gaps with mean
    1000 / rate ms, the first request at 0), reproducible from `seed`."""
    if arrival not in ARRIVALS:
        raise InputError(f"unknown arrival pattern {arrival!r} (choose {', '.join(ARRIVALS)})")
    if arrival == "all":
        return [0.0] * n
    if not (0 < rate_per_s <= MAX_RATE_PER_S) or math.isnan(rate_per_s):
        raise InputError(f"the request rate must be above 0 and at most {MAX_RATE_PER_S:g} per second")
    rng = random.Random(seed)
    times, now = [], 0.0
    for i in range(n):
        if i:
            now += rng.expovariate(rate_per_s) * 1000
        times.append(now)
    return times


def make_requests(tokenizer: Any, prompts: Sequence[str], max_new_tokens: int | Sequence[int],
                  arrival: str = "all", rate_per_s: float = 2.0, seed: int = 0,
                  chat_template: bool = True) -> tuple[RequestSpec, ...]:
    if not prompts:
        raise InputError("a stream needs at least one request")
    lengths = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(lengths) != len(prompts):
        raise InputError("give one output length per prompt (or one for all)")
    if any(n < 1 for n in lengths):
        raise InputError("every request must be allowed at least one new token")
    times = arrival_times(len(prompts), arrival, rate_per_s, seed)
    specs = []
    for prompt, n, at in zip(prompts, lengths, times):
        if not prompt.strip():
            raise InputError("a prompt is empty")
        ids = prepare_prompt(tokenizer, prompt, chat_template)
        specs.append(RequestSpec(prompt, tuple(ids), int(n), at))
    return tuple(specs)
