"""The server's start-up work (ui/startup.py, started by scripts/streamlit_app.py): the model a
first visitor gets is loaded and warmed before any session can have it, in one load that a
session asking meanwhile waits on; the server does not wait for it; and what the scripts import is
imported."""

from __future__ import annotations

import importlib.util
import re
import sys
import threading
import time

import engine.models
from engine.models import ModelStore
from ui import shared, startup
from ui.turns import FairLock

ROOT = startup.ROOT


def test_start_up_loads_and_warms_the_model_before_any_session(native_lm, monkeypatch):
    release, loads, warmed, got = threading.Event(), [], [], []

    def loader(source: str, dtype: str):
        loads.append((source, dtype))
        release.wait(60)
        return native_lm

    real_warm_up = engine.models.warm_up

    def warm_up(entry):
        warmed.append((shared.LOCK.locked(), "native" in entry.extras))  # in the model turn
        trace = real_warm_up(entry)
        warmed.append(trace)
        return trace

    store = ModelStore(1 << 30, loader=loader, native_tokens=128)
    monkeypatch.setattr(shared, "MODELS", store)
    monkeypatch.setattr(shared, "LOCK", FairLock())
    monkeypatch.setattr(engine.models, "warm_up", warm_up)
    monkeypatch.setattr(startup, "import_scripts_modules", lambda: [])
    monkeypatch.setattr(startup, "freeze_what_stays", lambda: 0)  # this process's GC as it was
    lines = []
    thread = threading.Thread(target=startup.start_up, args=(lines.append,))
    thread.start()
    while not loads:  # the start-up's load is under way: a session asks now
        thread.join(0.01)
    session = threading.Thread(target=lambda: got.append(store.get("default", "float32")))
    session.start()
    release.set()
    thread.join(120)
    session.join(120)
    assert loads == [("default", "float32")]  # one load: the session waited on the start-up's
    entry = store.peek("default", "fp32")
    assert got == [entry] and entry.lm is native_lm
    assert warmed[0] == (True, False)  # the warm-up run held the model turn and built the decoder
    trace = warmed[1]
    assert trace.decoder.name == "native" and 1 <= len(trace.steps) <= engine.models.WARM_TOKENS
    assert entry.extras["native"] is not None and not shared.LOCK.locked()
    assert shared.LOCK.typical_hold_s is not None  # the turn's history has the warm-up's time
    assert any("model default/fp32 loaded in" in line for line in lines), lines


def test_a_failed_start_up_is_one_line_and_the_sessions_load_says_why(monkeypatch):
    def broken(source: str, dtype: str):
        from engine import ModelLoadError
        raise ModelLoadError("the default model file is missing")

    store = ModelStore(1 << 30, loader=broken)
    monkeypatch.setattr(shared, "MODELS", store)
    monkeypatch.setattr(startup, "import_scripts_modules", lambda: [])
    monkeypatch.setattr(startup, "freeze_what_stays", lambda: 0)
    lines = []
    startup.start_up(lines.append)
    assert [line for line in lines if "model" in line] == [
        "start-up: could not prepare the model: ModelLoadError: the default model file is missing"]
    assert store.keys == []  # nothing half-loaded left: a visitor's own load tries again


def streamlit_app():
    spec = importlib.util.spec_from_file_location("streamlit_app", ROOT / "scripts" / "streamlit_app.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_server_starts_first_and_the_start_up_work_once_it_listens(monkeypatch):
    script = streamlit_app()
    listening, order = threading.Event(), []
    monkeypatch.setattr(script, "server_listening", lambda: listening.wait(30))
    monkeypatch.setattr(startup, "start_up", lambda: order.append("start-up work"))

    def serve():
        order.append("server starts")
        listening.set()
        return 0

    monkeypatch.setattr(script.cli, "main", serve)
    monkeypatch.setattr(sys, "argv", ["streamlit_app.py", "--server.port", "1"])
    try:
        script.main()
    except SystemExit as done:
        assert done.code == 0
    assert sys.argv == ["streamlit", "run", str(ROOT / "app.py"), "--server.port", "1"]
    for thread in threading.enumerate():
        if thread.name == "start-up":
            thread.join(30)
    assert order == ["server starts", "start-up work"]


def test_waiting_for_the_server_reads_streamlit_s_runtime(monkeypatch):
    from streamlit.runtime import Runtime
    from streamlit.runtime.runtime import RuntimeState

    script = streamlit_app()
    states = iter([None, RuntimeState.INITIAL, RuntimeState.NO_SESSIONS_CONNECTED])
    now = {"state": None}

    def exists():
        now["state"] = next(states)
        return now["state"] is not None

    monkeypatch.setattr(Runtime, "exists", staticmethod(exists))
    monkeypatch.setattr(Runtime, "instance", staticmethod(lambda: type("R", (), now)()))
    assert script.server_listening(poll_s=0.001) is True
    monkeypatch.setattr(Runtime, "exists", staticmethod(lambda: False))
    assert script.server_listening(poll_s=0.001, longest_s=0.01) is False


def test_the_scripts_imports_are_imported_at_start_up():
    names = startup.script_imports()
    for name in ("streamlit", "engine", "ui.shared", "ui.links", "charts", "charts.live",
                 "ui.sections.lens"):
        assert name in names, name
    startup.import_scripts_modules()
    missing = [n for n in names if n not in sys.modules
               and not hasattr(sys.modules[n.rpartition(".")[0]], n.rpartition(".")[2])]
    assert missing == []


def test_a_script_run_imports_nothing_while_the_start_up_work_runs(monkeypatch):
    """app.py's first lines draw the starting page while the start-up thread works (two threads
    importing the same modules can hand one a half-made module) and go on once it is over; not
    at all without a start-up thread. The page says what the work does, and since when."""
    for name in ("_STARTED", "_OVER"):
        monkeypatch.setattr(startup, name, threading.Event())
    monkeypatch.setattr(startup, "_PHASE", ["code"])
    assert not startup.starting()  # none started
    phases, release = [], threading.Event()

    def start_up():
        phases.append(startup.progress()[0])
        startup._PHASE[0] = "model"
        release.wait(10)

    monkeypatch.setattr(startup, "start_up", start_up)
    thread = startup.start_in_background()
    assert startup.starting()
    deadline = time.monotonic() + 5
    while startup.progress()[0] != "model" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert startup.starting() and 0 <= startup.progress()[1] < 5
    release.set()
    thread.join(5)
    assert not startup.starting() and phases == ["code"]
    app = (ROOT / "app.py").read_text()
    assert app.index("if starting():") < app.index("import streamlit") < app.index("from engine")
    starting = (ROOT / "ui" / "starting.py").read_text()
    imported = re.findall(r"^(?:from|import) ([\w.]+)", starting, re.M)
    assert set(imported) <= {"__future__", "time", "collections.abc", "urllib.parse", "streamlit",
                             "i18n", "ui.config", "ui.keys"}, imported


def test_the_start_up_imports_before_it_loads_the_model(monkeypatch):
    order = []
    monkeypatch.setattr(startup, "_PHASE", ["code"])
    monkeypatch.setattr(startup, "import_scripts_modules",
                        lambda: order.append(("imports", startup._PHASE[0])))
    monkeypatch.setattr(startup, "warm_default_model",
                        lambda say: order.append(("model", startup._PHASE[0])))
    monkeypatch.setattr(startup, "freeze_what_stays", lambda: order.append("freeze") or 0)
    startup.start_up(lambda line: None)
    assert order == [("imports", "code"), ("model", "model"), "freeze"]


def test_what_the_start_up_made_is_left_out_of_every_later_collection():
    """Streamlit collects garbage after every script run: walking the start-up's objects (torch,
    transformers, the model) each time held the interpreter for a large fraction of a second;
    frozen, they are not walked again, and garbage made later is still freed."""
    import gc
    import weakref

    kept = [[i] for i in range(1000)]  # long-lived objects, as the modules and the model
    try:
        assert startup.freeze_what_stays() >= len(kept)
        walked = {id(o) for g in range(3) for o in gc.get_objects(generation=g)}
        assert id(kept) not in walked and id(kept[0]) not in walked  # no collection walks them

        class Node:
            pass

        cycle = Node()
        cycle.me = cycle  # garbage in a cycle, made after the freeze
        gone = weakref.ref(cycle)
        del cycle
        gc.collect(2)
        assert gone() is None  # still freed
    finally:
        gc.unfreeze()
    assert id(kept) in {id(o) for o in gc.get_objects()}
