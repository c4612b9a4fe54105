"""Shared fixtures: the real default model (parity tests) and a tiny random model (speed); the
test tiers.

Tiers are pytest markers (registered in pyproject.toml) applied here by path and fixture, so a
test file does not repeat them: tests/e2e/ → `browser`, the `lm` fixture → `real_model`. A test
that loads the real model some other way (the app, the CLI) or compiles says so itself
(`pytestmark = pytest.mark.real_model`, `@pytest.mark.compile`). The fast tier:
    pytest -m "not browser and not real_model and not compile"
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

# The suite runs offline whatever the shell says (the Makefile and the entry points do the same).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from engine.loader import LoadedModel, load_model  # noqa: E402
from engine.spec import spec_from_model  # noqa: E402

E2E = Path(__file__).resolve().parent / "e2e"


VLLM_URL_ENV = "INFERENCE_EXPLORER_VLLM_URL"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.browser)
        if "lm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real_model)


@pytest.fixture(scope="session")
def vllm_url() -> Iterator[str]:
    """The base URL of a real vLLM server (CPU build, the default model in float32): the one
    INFERENCE_EXPLORER_VLLM_URL names, or one already answering on the default port, or one this
    session starts from `make vllm`'s venv (eager: about a minute on two cores) and stops at the
    end. Not installed is a failure, not a skip: `make test` installs it."""
    from engine.remote.server import (
        DEFAULT_PORT,
        SERVED_NAME,
        healthy,
        is_installed,
        start_server,
    )

    url = os.environ.get(VLLM_URL_ENV) or f"http://127.0.0.1:{DEFAULT_PORT}/v1"
    if os.environ.get(VLLM_URL_ENV) and not healthy(url):
        pytest.fail(f"{VLLM_URL_ENV}={url} does not answer")
    if healthy(url):
        os.environ[VLLM_URL_ENV] = url
        yield url
        return
    assert is_installed(), "vLLM is not installed: run `make vllm` (make test does)"
    server = start_server(DEFAULT_PORT, eager=True)
    print(f"\nvLLM started at {server.base_url} in {server.start_s:.0f} s")
    from engine.remote.client import StreamResult, stream_completion

    warm = StreamResult()  # its first request pays one-time costs: not any test's timings
    stream_completion(server.base_url, SERVED_NAME, "Hello", 4, warm, lambda: False)
    assert warm.finish in ("length", "stop"), warm.error
    os.environ[VLLM_URL_ENV] = server.base_url
    try:
        yield server.base_url
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _vllm_for_marked_tests(request: pytest.FixtureRequest) -> None:
    """A test marked `vllm` gets a running server (and INFERENCE_EXPLORER_VLLM_URL set)."""
    if request.node.get_closest_marker("vllm") is not None:
        request.getfixturevalue("vllm_url")


@pytest.fixture(scope="session")
def lm() -> LoadedModel:
    """SmolLM2-135M-Instruct, the app's real default model (converted once, then cached)."""
    return load_model()


@pytest.fixture(scope="session")
def default_tokenizer():
    """The default model's tokenizer alone, read from the converted cache (no weights loaded), so
    the tiny model stays in the fast tier; converts the model once if there is no cache yet."""
    from transformers import AutoTokenizer

    from engine.loader import _default_cache_dir, default_gguf_path, is_complete_cache

    folder = _default_cache_dir(default_gguf_path())
    if not is_complete_cache(folder):
        return load_model().tokenizer
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="session")
def tiny_lm(default_tokenizer) -> LoadedModel:
    """A 2-layer random-weight Llama (4 query heads, 2 KV heads) with the real tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(default_tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, attn_implementation="sdpa")
    model = LlamaForCausalLM(config).eval()
    model.requires_grad_(False)
    model.generation_config.eos_token_id = 2
    return LoadedModel(model, default_tokenizer, spec_from_model(model, "tiny-random-llama"), "tiny",
                       torch.device("cpu"), 0.0, False)


def eager_attentions(lm: LoadedModel, ids: list[int]) -> np.ndarray:
    """(L, H, S, S): transformers' eager attention with output_attentions over the whole sequence,
    the independent reference for every recorded weight. The model is set back to sdpa."""
    model = lm.model
    model.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([ids]), output_attentions=True)
    finally:
        model.set_attn_implementation("sdpa")
    return torch.stack([a[0] for a in out.attentions]).float().numpy()


@pytest.fixture(scope="module")
def native_lm(tiny_lm):
    """The tiny model with random norm weights (a fresh model's are all ones, so a norm read from
    the wrong place, or the wrong norm, would go unnoticed): the native step's test model."""
    model = copy.deepcopy(tiny_lm.model)
    generator = torch.Generator().manual_seed(0)
    for name, weight in model.named_parameters():
        if name.endswith("norm.weight"):
            weight.copy_(0.5 + torch.rand(weight.shape, generator=generator))
    return replace(tiny_lm, model=model)
