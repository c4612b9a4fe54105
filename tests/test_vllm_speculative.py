"""vLLM with prompt-lookup speculative decoding (its "ngram" method, this app's settings: 4 drafts
from a 3-to-1-token match), started for this module on its own port and stopped after it: the
server's acceptance counters, multi-token chunks on the client, and the same split the local
engine shows (tests/test_speculative.py) — drafts pay when the answer copies the prompt, not in
free writing.
"""

from __future__ import annotations

import pytest

from engine.remote.compare import chat_text
from engine.remote.loadtest import LoadTest
from engine.remote.record import LoadConfig
from engine.remote.server import DEFAULT_PORT, is_installed, start_server
from engine.remote.summary import server_stats
from engine.serving.speculative import FREE_PROMPT, REWRITE_PROMPT

pytestmark = [pytest.mark.vllm]


@pytest.fixture(scope="module")
def spec_url():
    assert is_installed(), "vLLM is not installed: run `make vllm` (make test does)"
    with start_server(DEFAULT_PORT + 2, eager=True, speculative=True) as server:
        yield server.base_url


def _one(url: str, prompt: str, tokenizer) -> object:
    config = LoadConfig(url, "", (prompt,), 1, 96, 1)
    return LoadTest(config, lambda p: chat_text(tokenizer, p)).run_all()


def test_acceptance_is_exposed_and_follows_the_prompt(spec_url, default_tokenizer):
    rewrite = _one(spec_url, REWRITE_PROMPT, default_tokenizer)
    free = _one(spec_url, FREE_PROMPT, default_tokenizer)
    for run in (rewrite, free):
        assert run.error is None and run.requests[0].finish in ("length", "stop")
        stats = server_stats(run)
        assert stats is not None and stats.spec_drafts > 0
        # the server generated exactly the tokens the client counted, chunks of several included
        first, last = run.samples[0], run.samples[-1]
        assert last.generation_tokens - first.generation_tokens == run.output_tokens
        r = run.requests[0]
        assert sum(r.chunk_tokens) == len(r.token_ids) == r.output_tokens
    assert server_stats(rewrite).acceptance > 0.6 > 0.3 > server_stats(free).acceptance
    # accepted drafts arrive together: fewer chunks than tokens on the rewrite sample
    assert len(rewrite.requests[0].chunk_ms) < 0.6 * rewrite.output_tokens
    assert max(rewrite.requests[0].chunk_tokens) > 1
