"""Published runs: "Publish a link to this run" keeps a copy of the session's run (its trace and
the experiment results computed on it) in the published runs' store under a new unguessable id
(ui/sessions.py, ui/shared.py's PUBLISHED), and a link holding the id (`?view=…`) opens that
copy as recorded: the same tokens and timings, no model, no Generate.

Copies both ways, so no session's work reaches another's: publishing stores a deep copy (the
sender's later runs and results never change what the link opens), and opening gives the receiver
a deep copy of its own (nothing the receiver does reaches the published run or the sender). A
published run has its own quota (per visitor, per address, for the server) and stays for the
store's age limit, the time the page states, whatever its publisher browses next. The sender's
download files travel with it (ui/run_files.py), as bytes: immutable, nothing to copy.
"""

from __future__ import annotations

import copy
import time

from engine import Trace
from i18n import _
from ui import shared
from ui.clients import current_client
from ui.config import config
from ui.link_params import Published
from ui.record import keep_example, keep_new_trace, keep_prompt
from ui.run_files import keep_made_files, made_files
from ui.state import app_state, current_experiments, current_trace
from ui.traces import current_example


def kept_for() -> str:
    """How long a published run stays on this server, in words."""
    hours = config().session_ttl_s / 3600
    return _("{hours} hours").format(hours=f"{hours:g}")


def publish() -> None:
    """Publish the session's run (the button's callback). Publishing the same run and results
    again gives the same id; a run still being generated is not published (its button is off)."""
    trace, experiments, links = current_trace(), current_experiments(), app_state().links
    if trace is None or trace.stop_reason == "running":
        return
    done = links.published
    if (done is not None and done.trace is trace and done.experiments is experiments
            and shared.PUBLISHED.published(done.run) is not None):
        return
    record: dict[str, object] = {"trace": copy.deepcopy(trace),
                                 "experiments": copy.deepcopy(experiments)}
    files = made_files(trace, experiments)
    if files:
        record["files"] = files
    example = current_example()
    if example is not None:
        record["example"] = example.name
    run = shared.PUBLISHED.publish(record, current_client())
    links.publish_refused = run is None
    links.published = None if run is None else Published(
        run, trace, experiments, time.strftime("%H:%M UTC", time.gmtime()))


def published_run(trace: Trace | None) -> Published | None:
    """The run this session published, while it is the session's trace and still on the server."""
    done = app_state().links.published
    if done is None or trace is None or done.trace is not trace:
        return None
    return done if shared.PUBLISHED.published(done.run) is not None else None


def open_published(run: str) -> bool:
    """Make a copy of the published run `run` this session's trace and results; False if the
    server no longer has it."""
    record = shared.PUBLISHED.published(run)
    if record is None:
        return False
    trace, experiments = copy.deepcopy(record["trace"]), copy.deepcopy(record["experiments"])
    keep_new_trace(trace, experiments)
    keep_made_files(trace, experiments, record.get("files", {}))
    keep_prompt(trace.prompt)
    if "example" in record:
        keep_example(record["example"], trace)
    return True
