"""How `pytest -n N --dist loadscope` (make test) shares the suite among pytest-xdist workers.

A unit of work is a whole module, so its module fixtures (a browser module's page, a module's
measured results) are set up once, and its tests run in file order; and every `vllm` test is in
one unit, on one worker, as they read the one shared server's counters before and after their
load (two loads at once would count each other's tokens). Units go out in the order the workers
collected them, and the workers put the longest first: the `vllm` unit (it waits for the server),
then the browser modules, torch.compile, the real model, and the fast tier last, where its many
small modules fill the gaps at the end.

The workers know the markers, the controller (which hands out the units) only the test ids: each
worker writes the ids of the `vllm` tests to a file the controller named in the environment.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

UNITS_ENV = "INFERENCE_EXPLORER_XDIST_UNITS"
VLLM_UNIT = "vllm"
ORDER = (VLLM_UNIT, "browser", "compile", "real_model")  # then everything else


def name_the_file() -> None:
    """In the controller, before the workers start (they inherit the environment)."""
    os.environ[UNITS_ENV] = str(Path(tempfile.mkdtemp(prefix="xdist-units-")) / "vllm.json")


def order_and_record(items: list[pytest.Item]) -> None:
    """In a worker: the longest units first (a stable sort: modules keep their tests' order),
    and the `vllm` tests' ids written for the controller."""
    def rank(item: pytest.Item) -> int:
        return next((k for k, mark in enumerate(ORDER) if item.get_closest_marker(mark)),
                    len(ORDER))

    items.sort(key=rank)
    path = Path(os.environ[UNITS_ENV])
    ids = [item.nodeid for item in items if item.get_closest_marker(VLLM_UNIT)]
    part = path.with_name(f"{path.name}.{os.environ.get('PYTEST_XDIST_WORKER', 'w')}")
    part.write_text(json.dumps(ids))
    os.replace(part, path)  # whole or not at all: every worker writes the same list


class Scheduling:
    """The plugin the controller registers: pytest-xdist asks it for the scheduler."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log):
        if config.getvalue("dist") != "loadscope":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class ModuleUnits(LoadScopeScheduling):
            _vllm: set[str] | None = None

            def _split_scope(self, nodeid: str) -> str:
                if self._vllm is None:
                    path = Path(os.environ[UNITS_ENV])
                    self._vllm = set(json.loads(path.read_text())) if path.is_file() else set()
                return VLLM_UNIT if nodeid in self._vllm else nodeid.split("::", 1)[0]

        config.option.loadscopereorder = False  # the workers' order, not the largest count first
        return ModuleUnits(config, log)
