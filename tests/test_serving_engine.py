"""The batched serving engine on the real default model, against independent references:
`model.generate` for every request's tokens, a transformers forward for the K/V in every block."""

import dataclasses
import threading

import pytest
import torch
from transformers import DynamicCache

from engine.errors import InputError
from engine.serving.engine import ServingEngine, serve
from engine.serving.record import RequestSpec, ServingConfig
from engine.serving.requests import make_requests
from engine.serving.servingfile import load_serving, serving_to_bytes

PROMPTS = ["Write a short story about a lighthouse keeper.",
           "Explain in detail how a bicycle works.",
           "Why do we have seasons on Earth?",
           "Describe your ideal weekend, step by step, with reasons for each choice you make.",
           "What is recursion?",
           "Give me advice for learning to play the piano as an adult with little free time."]
NEW_TOKENS = [32, 36, 40, 34, 38, 33]
NEAR_TIE = 1e-3


@pytest.fixture(scope="module")
def stream(lm):
    return make_requests(lm.tokenizer, PROMPTS, NEW_TOKENS)


@pytest.fixture(scope="module")
def references(lm, stream):
    """Each prompt alone, greedy, by transformers' own generate."""
    out = []
    for spec in stream:
        ids = torch.tensor([spec.prompt_token_ids])
        full = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=spec.max_new_tokens)
        out.append(full[0, ids.shape[1]:].tolist())
    return out


def top2_gap(lm, ids: list[int]) -> float:
    with torch.inference_mode():
        logits = lm.model(input_ids=torch.tensor([ids])).logits[0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1])


def near_tie_flip(lm, spec: RequestSpec, got: list[int], want: list[int]) -> str | None:
    """None for equal tokens; where they differ, the reference's choice there must be a near-tie
    (top-2 logit gap < 1e-3), which batched float math may flip — returned to be shown."""
    if got == want:
        return None
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    gap = top2_gap(lm, list(spec.prompt_token_ids) + want[:first])
    assert gap < NEAR_TIE, f"token {first} differs and the top-2 gap there is {gap:.2e}"
    return f"a near-tie flipped at token {first} (top-2 gap {gap:.1e})"


def assert_same_or_near_tie(lm, pairs: list[tuple[RequestSpec, list[int], list[int]]]) -> None:
    """Every request checked; near-tie flips (if any) reported together at the end."""
    flips = [f for spec, got, want in pairs if (f := near_tie_flip(lm, spec, got, want))]
    if flips:
        pytest.skip("; ".join(flips))


CONFIGS = {
    "continuous, sharing, block 8": ServingConfig("continuous", 8, 8, 256, True),
    "static, no sharing, block 16": ServingConfig("static", 4, 16, 256, False),
    "continuous, small pool (preempts)": ServingConfig("continuous", 6, 8, 24, True),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_request_gets_the_tokens_it_would_get_alone(lm, stream, references, name):
    run = serve(lm, stream, CONFIGS[name])
    assert sum(len(r.token_ids) >= 32 for r in run.requests) >= 4  # long enough to mean something
    if name.startswith("static"):
        assert max(s.batch_size for s in run.steps) == 4
    if "sharing" in name and "no sharing" not in name:
        assert all(r.cached_tokens > 0 for r in run.requests[1:])  # the chat template's system turn
    if "preempts" in name:
        assert sum(r.preemptions for r in run.requests) > 0
    assert all(record.finish in ("eos", "length") for record in run.requests)
    assert_same_or_near_tie(lm, [(r.spec, list(r.token_ids), want)
                                 for r, want in zip(run.requests, references)])


def reference_kv(lm, tokens: list[int]) -> DynamicCache:
    cache = DynamicCache(config=lm.model.config)
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([tokens]), cache=cache, use_cache=True)
    return cache


def test_each_token_kv_is_in_the_block_its_table_names_and_shared_blocks_agree(lm, stream):
    engine = ServingEngine(lm, stream[:4], ServingConfig("continuous", 4, 8, 64, True))
    steps = iter(engine)
    for _ in range(6):
        next(steps)
    tables = {row.request: row for row in engine.steps[-1].tables}
    assert len(tables) == 4
    holders: dict[int, set[int]] = {}
    for request, row in tables.items():
        tokens = engine.blocks.tables[request].tokens
        assert len(tokens) == row.tokens
        cache = reference_kv(lm, tokens)
        for layer in (0, lm.spec.layers - 1):
            slots = [row.blocks[p // 8] * 8 + p % 8 for p in range(row.tokens)]  # by the record
            keys, values = engine.runner.read_kv(layer, slots)  # (T, KV, D)
            want_k = cache.layers[layer].keys[0].transpose(0, 1)  # (T, KV, D)
            want_v = cache.layers[layer].values[0].transpose(0, 1)
            scale = float(want_k.abs().max())
            assert torch.allclose(keys, want_k, atol=1e-4 * scale), (request, layer)
            assert torch.allclose(values, want_v, atol=1e-4 * float(want_v.abs().max()))
        for block in row.blocks:
            holders.setdefault(block, set()).add(request)
    shared = {b: r for b, r in holders.items() if len(r) > 1}
    assert shared and engine.steps[-1].shared_blocks == len(shared)
    for block, requests in shared.items():  # the same tokens at the same positions in each
        index = {tables[r].blocks.index(block) for r in requests}
        assert len(index) == 1
        i = index.pop()
        pieces = {tuple(engine.blocks.tables[r].tokens[i * 8:(i + 1) * 8]) for r in requests}
        assert len(pieces) == 1


def test_a_prompt_cached_to_its_last_token_copies_that_block_and_still_matches(lm):
    ids = lm.tokenizer("The quick brown fox jumps over the lazy dog and then runs far away "
                       "into the forest")["input_ids"][:16]
    assert len(ids) == 16
    spec = RequestSpec("raw", tuple(ids), 12)
    run = serve(lm, [spec, spec], ServingConfig("continuous", 2, 8, 32, True))
    first = run.steps[0]
    assert first.copied_blocks == 1 and run.requests[1].cached_tokens == 15
    want = lm.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, 16, dtype=torch.long),
                             do_sample=False, max_new_tokens=12)[0, 16:].tolist()
    assert_same_or_near_tie(lm, [(spec, list(r.token_ids), want) for r in run.requests])


def test_freed_blocks_are_reused_by_later_requests(lm, stream):
    run = serve(lm, stream[:4], ServingConfig("continuous", 2, 8, 20, False))
    owners: dict[int, set[int]] = {}
    for step in run.steps:
        for row in step.tables:
            for block in row.blocks:
                owners.setdefault(block, set()).add(row.request)
    assert max(owners) < 20
    assert any(len(r) > 1 for r in owners.values())  # a block served two requests over time
    assert all(r.finish in ("eos", "length") for r in run.requests)


def test_times_are_ordered_and_a_stopped_stream_keeps_its_partial_record(lm, stream):
    stop = threading.Event()
    engine = ServingEngine(lm, stream, ServingConfig("continuous", 3, 8, 128, True), stop)
    for step in engine:
        if step.index == 4:
            stop.set()
    run = engine.record()
    assert run.stopped and len(run.steps) == 5
    finishes = [r.finish for r in run.requests]
    assert finishes.count("stopped") == 3 and finishes.count("waiting") == 3
    for r in run.requests:
        if r.token_ms:
            assert r.queue_ms >= 0 and r.ttft_ms >= r.queue_ms
            assert all(gap > 0 for gap in r.itl_ms)
    assert all(b.start_ms >= a.start_ms + a.ms for a, b in zip(run.steps, run.steps[1:]))
    assert load_serving(serving_to_bytes(run)) == run


def test_bad_streams_get_one_clear_message(lm, stream):
    with pytest.raises(InputError, match="at least one request"):
        ServingEngine(lm, [], ServingConfig())
    with pytest.raises(InputError, match="rate"):
        make_requests(lm.tokenizer, ["a"], 4, arrival="poisson", rate_per_s=1e9)
    huge = RequestSpec("p", stream[0].prompt_token_ids, 200)
    engine = ServingEngine(lm, [huge, stream[4]], ServingConfig(block_size=8, num_blocks=16))
    run = serve(lm, [huge, stream[4]], ServingConfig(block_size=8, num_blocks=16))
    assert "more blocks than the pool" in engine.refusals()[0]
    assert [r.finish for r in run.requests][0] == "refused" and run.requests[1].token_ids
    other = dataclasses.replace(lm, spec=dataclasses.replace(lm.spec, model_type="gpt2"))
    with pytest.raises(InputError, match="Llama-family"):
        ServingEngine(other, stream, ServingConfig())
