"""vLLM with prompt-lookup speculative decoding (its "ngram" method, this app's settings: 4 drafts
from a 3-to-1-token match), on its own port (started in the background after the session's main
server, or for this module, by scripts/vllm_start.sh as `make vllm-start` does): the server's
acceptance counters, multi-token chunks on the client, and the same split the local engine shows
(tests/test_speculative.py) — drafts pay when the answer copies the prompt, not in free writing;
then a stop of the real server by a signal to its starter.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from engine.remote.compare import chat_text
from engine.remote.loadtest import LoadTest
from engine.remote.record import LoadConfig
from engine.remote.server import healthy, is_installed
from engine.remote.summary import server_stats
from engine.serving.speculative import FREE_PROMPT, REWRITE_PROMPT
from tests import vllm_session
from tests.test_vllm_start import group_members, running, wait_for

pytestmark = [pytest.mark.vllm]


@dataclass(frozen=True)
class Speculative:
    base_url: str
    starter_pid: int  # scripts/vllm_start.sh, what `make vllm-start` runs


@pytest.fixture(scope="module")
def spec() -> Iterator[Speculative]:
    """The session's background speculative server (tests/vllm_session.py), or one started for
    this module; either way started by the real starter script, and stopped by the module's last
    test."""
    problem = vllm_session.wait_for_background_start(vllm_session.SPEC_STATUS_ENV)
    if problem:
        pytest.fail(problem)
    if os.environ.get(vllm_session.SPEC_STATUS_ENV):
        pid = int(Path(os.environ[vllm_session.SPEC_STARTER_ENV]).read_text())
        yield Speculative(os.environ[vllm_session.SPEC_URL_ENV], pid)
        return
    assert is_installed(), "vLLM is not installed: run `make vllm` (make test does)"
    with vllm_session.start_speculative() as starter:
        yield Speculative(starter.base_url, starter.process.pid)


def _one(url: str, prompt: str, tokenizer) -> object:
    config = LoadConfig(url, "", (prompt,), 1, 96, 1)
    return LoadTest(config, lambda p: chat_text(tokenizer, p)).run_all()


def test_acceptance_is_exposed_and_follows_the_prompt(spec, default_tokenizer):
    rewrite = _one(spec.base_url, REWRITE_PROMPT, default_tokenizer)
    free = _one(spec.base_url, FREE_PROMPT, default_tokenizer)
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


def test_sigterm_to_its_starter_stops_the_real_server(spec):
    """Last in this module: `kill` (SIGTERM) to `make vllm-start`'s process stops the real vLLM —
    its API server's whole process group, engine core included — and frees the port
    (tests/test_vllm_start.py covers Ctrl-C, SIGHUP and a stop during start-up with a stand-in)."""
    (server,) = [p for p in psutil.Process(spec.starter_pid).children()
                 if "vllm.entrypoints" in " ".join(p.cmdline())]  # vLLM's API server
    group = os.getpgid(server.pid)
    assert group == server.pid and len(group_members(group)) >= 2  # the API server and its core
    os.kill(spec.starter_pid, signal.SIGTERM)
    wait_for(lambda: not running(spec.starter_pid) and not group_members(group),
             "the starter and vLLM's process group are gone")
    assert not healthy(spec.base_url)
