"""Opening a trace file or a shipped example as the session's trace (the Generate page's buttons,
share links) and reading one as a second run (Compare runs): one reader, the app's limits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from engine import EngineError, Trace, TraceFormatError
from engine.files import TraceFile, read_trace_file
from engine.forward import prepare_prompt
from engine.records.examples import Example, examples
from engine.records.tracecheck import check_viewable
from i18n import _
from ui.config import config
from ui.live import make_room
from ui.record import keep_example, keep_new_trace, keep_prompt
from ui.state import app_state, current_trace, loaded_model


def read_viewable(read: Callable[[], bytes | Path]) -> TraceFile:
    """A trace file read within this app's limits: size-capped before parsing, checked, with
    generated tokens, and small enough for the pages to show (raises EngineError)."""
    limits = config().limits
    opened = read_trace_file(read(), limits.trace_mb << 20, limits.file_growth)
    if not opened.trace.steps:
        raise TraceFormatError(_("this trace has no generated tokens to show"))
    check_viewable(opened.trace, limits.trace_tokens)
    check_prompt_text(opened.trace)
    make_room(opened, _("this trace"))
    return opened


def check_prompt_text(trace: Trace) -> None:
    """A trace's prompt text must be what its prompt tokens came from, where the loaded model
    can tell (its own model's tokenizer): pages that run the model again on the run's prompt
    read the text, and a file whose text was lengthened behind a few ids held a shared model
    for 89 s. Raises TraceFormatError in one line."""
    lm = loaded_model()
    if lm is None or lm.spec.name != trace.model.name:
        return
    ids = prepare_prompt(lm.tokenizer, trace.prompt, trace.settings.chat_template)
    if tuple(ids) != trace.prompt_token_ids:
        raise TraceFormatError(_("its prompt text is {n} tokens for this model, but it records "
                                 "{m} prompt tokens: the file was changed").format(
            n=len(ids), m=len(trace.prompt_token_ids)))


def open_trace_file(read: Callable[[], bytes | Path], label: str) -> str | None:
    """Make a trace file (an upload, a shipped example) the session's trace; None, or what is
    wrong with it in one line."""
    try:
        opened = read_viewable(read)
    except EngineError as err:
        return _("{label}: {error}").format(label=label, error=err)
    keep_new_trace(opened.trace, opened.experiments)
    return None


def shipped_examples() -> tuple[Example, ...]:
    """The examples listed in the manifest whose file is present."""
    return tuple(e for e in examples() if e.path.is_file())


def open_example(name: str) -> str | None:
    """Open a shipped example by name (None, or why not), remember which one the trace is, and
    put its prompt in the prompt box: the box shows what the run answered, ready to edit and run
    live. (Called before the page draws: a button's callback, a link opened at the start.)"""
    example = next((e for e in shipped_examples() if e.name == name), None)
    if example is None:
        return _("example {name}: no example of that name ships with this app").format(name=name)
    error = open_trace_file(lambda: example.path, _("example {name}").format(name=name))
    trace = current_trace()
    if error is None and trace is not None:
        keep_example(name, trace)
        keep_prompt(trace.prompt)
    return error


def current_example() -> Example | None:
    """The shipped example the session's trace is, or None (a run of its own, an upload)."""
    trace, opened = current_trace(), app_state().run.example
    if trace is None or opened is None or opened[1] != trace.created_at:
        return None
    return next((e for e in shipped_examples() if e.name == opened[0]), None)
