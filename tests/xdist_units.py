"""How `pytest -n N --dist loadscope` (make test) shares the suite among pytest-xdist workers.

A unit of work is a whole module, so its module fixtures (a browser module's page, a module's
measured results) are set up once, and its tests run in file order. Two units cut across modules:
every `vllm` test is in one, on one worker, as they read the one shared server's counters before
and after their load (two loads at once would count each other's tokens); and every test of the
`engine_cli` fixture is in another, so that one worker, not each, starts its forking server (an
import of torch and transformers). Units go out in the order the workers
collected them, and the workers put the longest first (after the few that must start on a fresh
worker): the `vllm` unit (it waits for the server), then the browser modules, torch.compile, the
real model, and the fast tier last, where its many small modules fill the gaps at the end.

The workers know the markers and fixtures, the controller (which hands out the units) only the
test ids: each worker writes the unit of each test of those two units to a file the controller
named in the environment.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

UNITS_ENV = "INFERENCE_EXPLORER_XDIST_UNITS"
VLLM_UNIT = "vllm"
# The tests that run `python -m engine` through the forking server (the `engine_cli` fixture,
# tests/engine_cli.py), from several modules: one unit, so one worker starts that server.
CLI_UNIT = "engine_cli"
ORDER = (VLLM_UNIT, "browser", "compile", "real_model")  # then everything else
# Modules that take longest within their tier (measured), first in it: the last units to go out
# should be short ones. A stale name here costs only balance.
LONG = {"test_quant_quality.py", "test_serving_engine.py", "test_speculative.py", "test_app.py",
        "test_quant_page.py", "test_kvcache.py", "test_examples.py",
        "test_quant_model.py", "test_space.py", "test_browser.py",
        "test_hostile_files.py", "test_structure_imports.py", "test_remote_client_load.py",
        "test_native_lowbit.py", "test_remote_client.py", "test_timing.py", CLI_UNIT,
        "test_generate_page.py", "test_vllm_start.py", "test_snapshots.py", "test_story_page.py",
        "test_links.py", "test_quant_study.py", "test_fair_turns_browser.py", "test_fair_store.py",
        "test_quant_ggml_exact.py", "test_gguf_export.py"}
# Modules that measure the worker process itself (its memory after many runs): they go out
# before anything else, to a worker no other test has run in yet.
FRESH = {"test_app_safety.py"}


def name_the_file() -> None:
    """In the controller, before the workers start (they inherit the environment)."""
    os.environ[UNITS_ENV] = str(Path(tempfile.mkdtemp(prefix="xdist-units-")) / "vllm.json")


def unit(item: pytest.Item) -> str:
    if item.get_closest_marker(VLLM_UNIT):
        return VLLM_UNIT
    if CLI_UNIT in getattr(item, "fixturenames", ()):
        return CLI_UNIT
    return item.nodeid.split("::", 1)[0]


def order_and_record(items: list[pytest.Item]) -> None:
    """In a worker: the longest units first (a stable sort of whole units: a module's tests keep
    their order), and the units of the `vllm` and `engine_cli` tests written for the controller."""
    rank: dict[str, tuple[int, int]] = {}
    for item in items:
        tier = next((k for k, mark in enumerate(ORDER) if item.get_closest_marker(mark)), len(ORDER))
        name = unit(item)
        long = 0 if Path(name).name in LONG else 1
        if Path(name).name in FRESH:
            tier = -1
        rank[name] = min(rank.get(name, (tier, long)), (tier, long))
    items.sort(key=lambda item: rank[unit(item)])
    path = Path(os.environ[UNITS_ENV])
    units = {item.nodeid: unit(item) for item in items if unit(item) in (VLLM_UNIT, CLI_UNIT)}
    part = path.with_name(f"{path.name}.{os.environ.get('PYTEST_XDIST_WORKER', 'w')}")
    part.write_text(json.dumps(units))
    os.replace(part, path)  # whole or not at all: every worker writes the same list


class Scheduling:
    """The plugin the controller registers: pytest-xdist asks it for the scheduler."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log):
        if config.getvalue("dist") != "loadscope":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class ModuleUnits(LoadScopeScheduling):
            _units: dict[str, str] | None = None

            def _split_scope(self, nodeid: str) -> str:
                if self._units is None:
                    path = Path(os.environ[UNITS_ENV])
                    self._units = json.loads(path.read_text()) if path.is_file() else {}
                return self._units.get(nodeid) or nodeid.split("::", 1)[0]

        config.option.loadscopereorder = False  # the workers' order, not the largest count first
        return ModuleUnits(config, log)
