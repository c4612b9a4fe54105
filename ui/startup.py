"""The server's start-up work, done before its first visitor: import what the app's scripts
import, then load and warm the model a first visitor gets (scripts/streamlit_app.py starts it in
a background thread, so the server answers at once).

A visitor who arrives meanwhile gets the starting page (ui/starting.py: Streamlit and the
standard library only, the prompt box included, and which part of the work is under way) and
their script run waits for the work to end (`starting`, at the top of app.py) before it imports
anything: two threads importing the same modules can hand one of them a half-made module
(transformers' lazy names are not safe to import from two threads at once: "cannot import name
'StaticCache' from 'transformers'" on the first visitor's page), and a page drawn before the
model is in would run again when it comes (a share link's selection lost between those runs:
seen on a hosted Space's first visit). The warm-up run takes the model turn like any run.
"""
from __future__ import annotations

import ast
import gc
import importlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARM_UP = "warm-up"  # the start-up run's kind of job in the model turn (ui/turns.py)
START_UP = "start-up"  # its client in the model turn: no visitor's, so it costs none a turn
SCRIPTS = ("app.py", "pages")  # what Streamlit runs for a visit: app.py and the pages it routes to


def script_imports(root: Path = ROOT) -> list[str]:
    """The modules app.py and the pages import at their top level, in order, once each (`from a
    import b` names `a.b` too: Python imports it when `b` is a submodule)."""
    files = [root / SCRIPTS[0], *sorted((root / SCRIPTS[1]).glob("*.py"))]
    names: list[str] = []
    for path in files:
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            names += [n for n in found if n not in names and n != "__future__"]
    return names


def import_scripts_modules(root: Path = ROOT) -> list[str]:
    """Import what the scripts import (the first visit's script run then finds them loaded);
    returns the modules imported."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # as Streamlit puts the main script's folder
    done = []
    for name in script_imports(root):
        parent, _, leaf = name.rpartition(".")
        if parent in sys.modules and hasattr(sys.modules[parent], leaf):
            continue  # imported already, or `from a import b` with b a name defined in a
        importlib.import_module(name)
        done.append(name)
    return done


def warm_default_model(say: Callable[[str], None]) -> None:
    """Load the model a first visitor gets — the default one, with the first weights offered
    (hosted and local alike: float32) — into the app's shared store, then warm it with one short
    run in the model turn. A session asking for the model meanwhile waits on this load (one
    load); one that presses Generate during the warm-up run waits its turn behind it, as behind
    any run."""
    from engine.models import warm_up
    from ui import shared
    from ui.config import config

    weights = config().weights_choices[0]
    start = time.perf_counter()
    entry = shared.MODELS.get("default", weights)
    loaded = time.perf_counter()
    _PHASE[0] = "warm-up"
    with shared.LOCK.turn(kind=WARM_UP, client=START_UP):
        warm_up(entry)
    say(f"start-up: model default/{weights} loaded in {loaded - start:.1f} s, warmed up in "
        f"{time.perf_counter() - loaded:.1f} s")


def start_up(say: Callable[[str], None] | None = None) -> None:
    """What the scripts import (the engine, torch, transformers, the pages' modules), then the
    model; a failure is one line on the server's log (a visitor who then opens the page, or asks
    for the model, meets the same error with its own message, as without this)."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # as app.py sets it, before transformers loads
    try:
        start = time.perf_counter()
        import_scripts_modules()
        say(f"start-up: the pages' modules imported in {time.perf_counter() - start:.1f} s")
    except Exception as err:  # noqa: BLE001 — see the docstring
        say(f"start-up: could not import the pages' modules: {type(err).__name__}: {err}")
    _PHASE[0] = "model"
    try:
        warm_default_model(say)
    except Exception as err:  # noqa: BLE001 — see the docstring
        say(f"start-up: could not prepare the model: {type(err).__name__}: {err}")
    frozen = freeze_what_stays()
    say(f"start-up: {frozen:,} objects left out of garbage collection (they stay)")


def freeze_what_stays() -> int:
    """Move every object alive now — the modules, the model, what the start-up built — out of
    the garbage collector's reach (`gc.freeze`), after one collection; returns how many. They
    live as long as the server. Streamlit collects garbage after every script run
    (`runner.postScriptGC`): walking the hundreds of thousands of objects torch and transformers
    keep made each such collection a large fraction of a second holding the interpreter, so every
    session's every rerun stalled the others and the batch's steps (docs/benchmarks.md, "A class
    at once"). Frozen, they are not walked again; what the runs leave behind is still freed."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


_STARTED = threading.Event()  # a start-up thread was started in this process
_OVER = threading.Event()  # and its work is over
_STARTED_AT = [time.monotonic()]
_PHASE = ["code"]  # what the start-up thread does now: "code", "model" or "warm-up"


def starting() -> bool:
    """True while this process's start-up work runs (a script run waits); False at once when
    there is none."""
    return _STARTED.is_set() and not _OVER.is_set()


def progress() -> tuple[str, float]:
    """(what the start-up work does now — "code", "model", "warm-up" — and seconds since it
    began)."""
    return _PHASE[0], time.monotonic() - _STARTED_AT[0]


def start_in_background(first: Callable[[], None] = lambda: None) -> threading.Thread:
    """`first()` (waiting until the server listens), then `start_up()`, in a daemon thread."""
    def work() -> None:
        try:
            first()
            start_up()
        finally:
            _OVER.set()

    _STARTED_AT[0] = time.monotonic()
    _STARTED.set()

    thread = threading.Thread(target=work, name="start-up", daemon=True)
    thread.start()
    return thread
