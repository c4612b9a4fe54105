"""Example traces shipped with the app (`assets/examples/`): recorded by the engine from the
default model, so every page has a real run to show the moment it opens — on a cold hosted Space,
or when the model fails in front of a class — with no model loaded.

`assets/examples/examples.json` lists each example's prompt and settings; `record_examples`
(CLI: `python -m engine examples`) records them all again. Hidden states are left out and long
runs record a few layers' attention, to keep each file small (MAX_EXAMPLE_BYTES).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..assets import asset
from ..errors import EngineError
from ..settings import GenerationSettings
from .trace import Trace

EXAMPLES_DIR = asset("examples")
MAX_EXAMPLE_BYTES = 2 << 20


@dataclass(frozen=True, slots=True)
class Example:
    name: str
    title: str
    prompt: str
    settings: GenerationSettings

    @property
    def path(self) -> Path:
        return EXAMPLES_DIR / f"{self.name}.npz"


def _example(entry: dict[str, Any]) -> Example:
    layers = entry.get("attention_layers")
    settings = GenerationSettings(
        max_new_tokens=int(entry["max_new_tokens"]), temperature=float(entry["temperature"]),
        top_p=float(entry.get("top_p", 1.0)), seed=int(entry["seed"]), record_hidden=False,
        attention_layers=tuple(layers) if layers is not None else None)
    return Example(str(entry["name"]), str(entry["title"]), str(entry["prompt"]), settings)


def examples(folder: Path = EXAMPLES_DIR) -> tuple[Example, ...]:
    """The listed examples, in the manifest's order (whether or not their files exist yet)."""
    return tuple(_example(e) for e in json.loads((folder / "examples.json").read_text()))


def record_example(lm: Any, example: Example) -> Trace:
    from ..runner import generate_trace

    return generate_trace(lm, example.prompt, example.settings)


def record_examples(lm: Any, folder: Path = EXAMPLES_DIR) -> list[tuple[Example, int]]:
    """Record every example into `folder`, replacing the shipped files (that is this command's
    purpose; each is written atomically); (example, file bytes) for each. A file over
    MAX_EXAMPLE_BYTES is an error: the manifest must record fewer layers or tokens."""
    from ..outfile import OutFile
    from .tracefile import trace_to_bytes

    written = []
    for example in examples(folder):
        data = trace_to_bytes(record_example(lm, example))
        if len(data) > MAX_EXAMPLE_BYTES:
            raise EngineError(f"example {example.name} is {len(data):,} bytes, over "
                             f"{MAX_EXAMPLE_BYTES:,}: record fewer attention layers or tokens")
        OutFile(folder / f"{example.name}.npz", force=True).write(data)  # re-recorded whole
        written.append((example, len(data)))
    return written
