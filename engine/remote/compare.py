"""The same load on the local instrumented engine, beside a serving engine's: same prompts (the
same chat template), same output limits, same arrivals, max batch = the load's concurrency — and
whether the greedy tokens agree. Two implementations round differently, so a token where they
part must be a near-tie of the local model (its top-2 logit gap small), never ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..serving.record import RequestSpec, ServingConfig, ServingRun
from ..timing.metrics import percentile
from .record import LoadConfig, LoadRun

NEAR_TIE = 0.05  # logits: float32 engines with different kernels differ by ~1e-4 here


def chat_text(tokenizer: Any, prompt: str) -> str:
    """The text a chat-templated prompt becomes (what the local engine tokenizes), for servers
    that take text: the server must tokenize it into the same ids (checked where it says)."""
    if not getattr(tokenizer, "chat_template", None):
        return prompt
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                         add_generation_prompt=True, tokenize=False)


def default_tokenizer() -> Any:
    """The default model's tokenizer alone, from the converted cache (no weights loaded)."""
    from transformers import AutoTokenizer

    from ..loader import _default_cache_dir, default_gguf_path, is_complete_cache, load_model

    folder = _default_cache_dir(default_gguf_path())
    if not is_complete_cache(folder):
        return load_model().tokenizer
    return AutoTokenizer.from_pretrained(folder)


def local_requests(tokenizer: Any, config: LoadConfig) -> tuple[RequestSpec, ...]:
    from ..serving.requests import make_requests

    prompts = [config.prompts[i % len(config.prompts)] for i in range(config.requests)]
    return make_requests(tokenizer, prompts, config.max_new_tokens,
                         "all" if config.rate is None else "poisson", config.rate or 1.0,
                         config.seed, chat_template=config.chat_template)


def local_config(config: LoadConfig, requests: tuple[RequestSpec, ...],
                 block_size: int = 16) -> ServingConfig:
    """Continuous batching, max batch = concurrency, a pool that holds every request at once."""
    need = sum(-(-(len(r.prompt_token_ids) + r.max_new_tokens) // block_size) for r in requests)
    return ServingConfig("continuous", min(256, config.concurrency), block_size,
                         max(need, 16), True)


def run_local(lm: Any, config: LoadConfig) -> ServingRun:
    from ..serving.engine import serve

    requests = local_requests(lm.tokenizer, config)
    return serve(lm, requests, local_config(config, requests))


@dataclass(frozen=True, slots=True)
class Agreement:
    """Request `id`: `same_prompt` (None: the server did not return prompt ids), `equal` output
    tokens (None: the server returned no token ids), `first_diff` where they part and the local
    model's top-2 logit `gap` there (None when equal)."""

    id: int
    same_prompt: bool | None
    equal: bool | None
    first_diff: int | None
    gap: float | None

    @property
    def explained(self) -> bool:
        return self.equal is not False or (self.gap is not None and self.gap < NEAR_TIE)


def top2_gap(lm: Any, ids: list[int]) -> float:
    import torch

    with torch.inference_mode():
        logits = lm.model(input_ids=torch.tensor([ids], device=lm.device)).logits[0, -1]  # (V,)
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def agreement(lm: Any, local: ServingRun, remote: LoadRun) -> list[Agreement]:
    """Per request: do the local engine and the server agree on the prompt ids and greedy
    tokens? A remote run stopped by a length limit agrees up to the shorter of the two."""
    out = []
    for mine, theirs in zip(local.requests, remote.requests):
        prompt = list(mine.spec.prompt_token_ids)
        same_prompt = list(theirs.prompt_token_ids) == prompt if theirs.prompt_token_ids else None
        if not theirs.token_ids:
            out.append(Agreement(mine.id, same_prompt, None, None, None))
            continue
        a, b = list(mine.token_ids), list(theirs.token_ids)
        n = min(len(a), len(b))
        first = next((i for i in range(n) if a[i] != b[i]), None)
        complete = theirs.finish in ("length", "stop") and mine.finish in ("length", "eos")
        if first is None and complete and len(a) != len(b):
            first = n  # one stopped at EOS where the other went on
        if first is None:
            out.append(Agreement(mine.id, same_prompt, True, None, None))
        else:
            out.append(Agreement(mine.id, same_prompt, False, first,
                                 top2_gap(lm, prompt + a[:first])))
    return out


@dataclass(frozen=True, slots=True)
class SideBySide:
    """One row per engine of the comparison table, with the shared definitions, over completed
    requests: TTFT and end-to-end from the moment a request got its slot (sent, on the client;
    admitted, on the local engine), so the concurrency limit's wait counts on neither side."""

    engine: str
    output_tokens: int
    throughput_tok_s: float
    ttft_p50: float | None
    ttft_p90: float | None
    itl_p50: float | None
    itl_p90: float | None
    e2e_p50: float | None


def side_by_side(local: ServingRun | None, remote: LoadRun, remote_name: str) -> list[SideBySide]:
    rows = [_remote_row(remote, remote_name)]
    if local is not None:
        # From admission, as the client's times run from sending: a request the concurrency
        # limit holds back waits before it is sent there, and in the waiting queue here.
        done = [r for r in local.requests if r.finish in ("eos", "length") and r.token_ms
                and r.admitted_ms is not None]
        ttft = [r.token_ms[0] - r.admitted_ms for r in done]
        itl = [g for r in done for g in r.itl_ms]
        e2e = [r.token_ms[-1] - r.admitted_ms for r in done]
        rows.append(SideBySide("this app's engine", local.output_tokens, local.throughput_tok_s,
                               percentile(ttft, 50), percentile(ttft, 90), percentile(itl, 50),
                               percentile(itl, 90), percentile(e2e, 50)))
    return rows


def _remote_row(run: LoadRun, name: str) -> SideBySide:
    done = [r for r in run.requests if r.finish in ("length", "stop") and r.chunk_ms]
    ttft = [r.ttft_ms for r in done]
    itl = [g for r in done for g in r.itl_ms]
    e2e = [r.e2e_ms for r in done]
    return SideBySide(name, run.output_tokens, run.throughput_tok_s, percentile(ttft, 50),
                      percentile(ttft, 90), percentile(itl, 50), percentile(itl, 90),
                      percentile(e2e, 50))
