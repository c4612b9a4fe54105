"""Where the files the project ships in assets/ are, for the engine and the report.

A checkout reads its own assets/ folder; an installed wheel carries the files the engine needs at
run time (the texts a weights variant is scored on, the sample prompts, the published model
configs, the report's style sheet) as data files under <prefix>/share/inference-explorer/assets
(pyproject.toml). The example traces stay in the checkout (the app shows them; `python -m engine
examples` records them again there).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1] / "assets"
INSTALLED = Path(sysconfig.get_paths()["data"]) / "share" / "inference-explorer" / "assets"


def asset(*parts: str) -> Path:
    """The path of a shipped file: the checkout's when there is one, else the installed copy."""
    return (CHECKOUT if CHECKOUT.is_dir() else INSTALLED).joinpath(*parts)
