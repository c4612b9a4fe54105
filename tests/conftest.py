"""Shared fixtures: the real default model (parity tests) and a tiny random model (speed); the
test tiers.

Tiers are pytest markers (registered in pyproject.toml) applied here by path and fixture, so a
test file does not repeat them: tests/e2e/ → `browser`, the `lm` fixture → `real_model`. A test
that loads the real model some other way (the app, the CLI) or compiles says so itself
(`pytestmark = pytest.mark.real_model`, `@pytest.mark.compile`). The fast tier:
    pytest -m "not browser and not real_model and not compile and not vllm and not big_model"
`make test` runs it first, then the rest but `big_model` (`make bench` runs those), on
pytest-xdist workers (tests/xdist_units.py).
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

from typing import TYPE_CHECKING  # noqa: E402

import pytest  # noqa: E402

from tests import vllm_session, xdist_units  # noqa: E402

if TYPE_CHECKING:  # torch and the engine load in the fixtures: xdist's controller runs no test
    import numpy as np

    from engine.loader import LoadedModel

E2E = Path(__file__).resolve().parent / "e2e"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--vllm-in-background", action="store_true",
                     help="start the vLLM server as the session starts, in the background, so "
                          "its start overlaps other tests (make test); `vllm` tests wait for it")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # a pytest-xdist worker: it inherits what its controller set up
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 0:
        # Each worker's torch (and the servers it starts) gets its share of the cores: OpenMP
        # threads beyond them spin-wait for a core and burn the time the other workers need.
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
        xdist_units.name_the_file()
        config.pluginmanager.register(xdist_units.Scheduling(), "xdist_units")
    if config.getoption("vllm_in_background"):
        vllm_session.start_in_background()


def pytest_unconfigure(config: pytest.Config) -> None:
    vllm_session.stop_started()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.browser)
        if "lm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real_model)
    if os.environ.get(xdist_units.UNITS_ENV) and hasattr(config, "workerinput"):
        xdist_units.order_and_record(items)


@pytest.fixture(scope="session", autouse=True)
def one_user_on_loopback() -> None:
    """AppTest binds no address, and Streamlit's unset address means every interface: a shared
    server (ui/guard.py). The suite is one user on loopback, as `make run` is, unless a test says
    otherwise with `bind`. (Streamlit reads STREAMLIT_SERVER_ADDRESS only on its command line.)"""
    from streamlit import config as st_config

    st_config.set_option("server.address", "127.0.0.1")


@pytest.fixture
def bind(monkeypatch) -> Iterator:
    """`bind(address)` sets Streamlit's `server.address` as `ADDRESS=… make run` would (put back
    afterwards), in local mode with none of ui/guard.py's operator flags."""
    from streamlit import config as st_config

    for name in ("INFERENCE_EXPLORER_TRUST_NETWORK", "INFERENCE_EXPLORER_ALLOWED_URLS",
                 "INFERENCE_EXPLORER_MODEL_DIRS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("INFERENCE_EXPLORER_HOSTED", "0")
    before = st_config.get_option("server.address")
    yield lambda address: st_config.set_option("server.address", address)
    st_config.set_option("server.address", before)


@pytest.fixture(scope="session")
def vllm_url() -> Iterator[str]:
    """The base URL of a real vLLM server (CPU build, the default model in float32): the one
    INFERENCE_EXPLORER_VLLM_URL names (or that --vllm-in-background started), or one already
    answering on the default port, or one this session starts from `make vllm`'s venv and stops
    at the end. Not installed is a failure, not a skip: `make test` installs it."""
    from engine.remote.server import DEFAULT_PORT, healthy, is_installed

    problem = vllm_session.wait_for_background_start()
    if problem:
        pytest.fail(problem)
    url = vllm_session.default_url()
    if os.environ.get(vllm_session.URL_ENV) and not healthy(url):
        pytest.fail(f"{vllm_session.URL_ENV}={url} does not answer")
    if healthy(url):
        os.environ[vllm_session.URL_ENV] = url
        yield url
        return
    assert is_installed(), "vLLM is not installed: run `make vllm` (make test does)"
    server = vllm_session.start_and_warm(DEFAULT_PORT)
    os.environ[vllm_session.URL_ENV] = server.base_url
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
def engine_cli() -> Iterator:
    """`engine_cli(*args)`: `python -m engine ARGS` run as a real process, like subprocess.run
    with captured text output, forked from one interpreter that imported the engine once
    (tests/engine_cli.py). Importing the CLI prints nothing, as a real process's output would
    show."""
    from tests.engine_cli import EngineCli

    cli = EngineCli()
    try:
        assert cli.import_output == "", cli.import_output
        yield cli.run
    finally:
        cli.close()


@pytest.fixture(scope="session")
def lm() -> LoadedModel:
    """SmolLM2-135M-Instruct, the app's real default model (converted once, then cached): the
    app's own model store's entry, so a process that also runs the app (AppTest) loads it once."""
    from ui.shared import MODELS

    return MODELS.get("default", "fp32").lm


@pytest.fixture
def cli_uses_lm(lm, monkeypatch) -> None:
    """An in-process CLI call that loads the default float32 model gets the session's `lm`
    (loaded once per process) instead of loading it again; any other model still loads."""
    import engine.loader

    real = engine.loader.load_model

    def load_model(source=None, device=None, dtype=None, progress=None):
        if source in (None, "", "default") and device in (None, "cpu") and dtype in (None, "float32"):
            return lm
        return real(source, device, dtype, progress)

    monkeypatch.setattr(engine.loader, "load_model", load_model)


@pytest.fixture(scope="session")
def default_tokenizer():
    """The default model's tokenizer alone, read from the converted cache (no weights loaded), so
    the tiny model stays in the fast tier; converts the model once if there is no cache yet."""
    from transformers import AutoTokenizer

    from engine.loader import _default_cache_dir, default_gguf_path, is_complete_cache

    folder = _default_cache_dir(default_gguf_path())
    if not is_complete_cache(folder):
        from engine.loader import load_model

        return load_model().tokenizer
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="session")
def tiny_lm(default_tokenizer) -> LoadedModel:
    """A 2-layer random-weight Llama (4 query heads, 2 KV heads) with the real tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.loader import LoadedModel
    from engine.spec import spec_from_model

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
    import torch

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
    import torch

    model = copy.deepcopy(tiny_lm.model)
    generator = torch.Generator().manual_seed(0)
    for name, weight in model.named_parameters():
        if name.endswith("norm.weight"):
            weight.copy_(0.5 + torch.rand(weight.shape, generator=generator))
    return replace(tiny_lm, model=model)
