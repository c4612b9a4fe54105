"""vLLM with prompt-lookup speculative decoding (its "ngram" method, this app's settings: 4 drafts
from a 3-to-1-token match), on its own port (started in the background after the session's main
server, or for this module): the server's acceptance counters, multi-token chunks on the client,
and the same split the local engine shows (tests/test_speculative.py) — drafts pay when the
answer copies the prompt, not in free writing.
"""

from __future__ import annotations

import os

import pytest

from engine.remote.compare import chat_text
from engine.remote.loadtest import LoadTest
from engine.remote.record import LoadConfig
from engine.remote.server import is_installed
from engine.remote.summary import server_stats
from engine.serving.speculative import FREE_PROMPT, REWRITE_PROMPT
from tests import vllm_session

pytestmark = [pytest.mark.vllm]


@pytest.fixture(scope="module")
def spec_url():
    """The session's background speculative server (tests/vllm_session.py), or one started for
    this module and stopped after it."""
    problem = vllm_session.wait_for_background_start(vllm_session.SPEC_STATUS_ENV)
    if problem:
        pytest.fail(problem)
    if os.environ.get(vllm_session.SPEC_STATUS_ENV):
        yield os.environ[vllm_session.SPEC_URL_ENV]
        return
    assert is_installed(), "vLLM is not installed: run `make vllm` (make test does)"
    with vllm_session.start_speculative() as server:
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
