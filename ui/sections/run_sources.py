"""The Generate page's sections around a run: the shipped example runs, the replay of the run
or of a trace file (its uploader), and the run's two downloads."""

from __future__ import annotations

import streamlit as st

from engine import Trace
from i18n import N_, _
from ui.batching import server_busy
from ui.config import config
from ui.keys import FILES_ASKED, REPLAY_SPEED, UPLOAD
from ui.replay import REPLAY_MAX_S, ask_replay
from ui.run_files import files_made, report_file_bytes, trace_file_bytes
from ui.state import app_state
from ui.text import message
from ui.traces import open_example, open_trace_file, shipped_examples
from ui.upload_guard import upload_bytes

REPLAY_SPEEDS = {"0.5×": 0.5, "1×": 1.0, "2×": 2.0, "instant": None}  # the options' values
REPLAY_SPEED_NAMES = {"instant": N_("instant")}  # the options drawn otherwise than their value


def opened(error: str | None) -> None:
    """A trace file (an upload, a shipped example) opened: replay it, or say under the uploader
    in one message what is wrong with it. (Opening it is ui/traces.py's: a share link opens an
    example too.)"""
    if error is None:
        ask_replay("trace")
    app_state().page.upload_error = error


def load_upload() -> None:
    upload = st.session_state.get(UPLOAD)
    if upload is None:
        app_state().page.upload_error = None
        return
    opened(open_trace_file(lambda: upload_bytes(upload, config().limits.upload_mb),
                           upload.name[:120]))


def examples_section(first_visit: bool) -> None:
    """Runs recorded from the default model and shipped with the app: every page works on them
    at once, with no model loaded (a cold hosted demo, or a model that fails in class)."""
    shipped = shipped_examples()
    if not shipped:
        return
    with st.expander(_("Open an example run — recorded from the default model, no model needed"),
                     expanded=first_visit, icon=":material/science:"):
        for col, example in zip(st.columns(len(shipped)), shipped):
            col.button(_(example.title), key=f"example_{example.name}",
                       on_click=lambda name: opened(open_example(name)),
                       args=(example.name,), width="stretch",
                       help=_("Prompt: {prompt}").format(prompt=example.prompt))


def download(trace: Trace) -> None:
    """The run's two files. On a shared server (hosted, or while other visitors' runs decode)
    a button makes them on demand: the report's figures and the compressed trace cost the
    server's cores most of a second per visitor, at the moment a class's runs all end
    (measured: 20 visitors' pages took 18 s after the last token, mostly making these)."""
    on_demand = config().hosted or server_busy()
    if on_demand and not files_made(trace) and not st.session_state.get(FILES_ASKED):
        st.button(_("Prepare the downloads (trace file and report)"), key=FILES_ASKED,
                  help=_("The server's cores are shared with other visitors, so the files are "
                         "made when you ask for them."))
        return
    row = st.container(horizontal=True)
    row.download_button(_("Download trace"), data=trace_file_bytes(trace), on_click="ignore",
                        file_name="inference-explorer.trace.npz", mime="application/octet-stream",
                        key="download_trace",
                        help=_("The whole run (tokens, timings, attention, KV sizes) as one file, "
                               "with the experiment results computed on it: opened again, every "
                               "page shows them without rerunning anything."))
    row.download_button(_("Download report (HTML)"), data=report_file_bytes(trace),
                        on_click="ignore", file_name="inference-explorer-report.html",
                        mime="text/html", key="download_report",
                        help=_("One self-contained page for handouts: settings, numbers, token "
                               "chips and interactive charts; opens offline in any browser."))


def replay_section(trace: Trace | None) -> None:
    """Replay the current trace, or a trace file, at a chosen speed (no model needed)."""
    row = st.container(horizontal=True, vertical_alignment="bottom")
    row.segmented_control(_("Replay speed"), list(REPLAY_SPEEDS), default="1×", required=True,
                          key=REPLAY_SPEED,
                          format_func=lambda speed: (_(REPLAY_SPEED_NAMES[speed])
                                                     if speed in REPLAY_SPEED_NAMES else speed),
                          help=_("Relative to the recorded pace, for the current trace and for an "
                                 "uploaded file; a replay lasts at most {max_s} s whatever the "
                                 "file says.").format(max_s=f"{REPLAY_MAX_S:.0f}"))
    if trace is not None and trace.steps and row.button(_("Replay current trace"),
                                                        icon=":material/replay:",
                                                        key="replay_current"):
        ask_replay("trace")
        st.rerun()
    error = app_state().page.upload_error
    with st.expander(_("Replay a trace file"), expanded=trace is None or error is not None):
        st.file_uploader(_("Trace file (.npz)"), type=["npz"], key=UPLOAD, on_change=load_upload,
                         max_upload_size=config().limits.upload_mb,
                         help=_("A file from “Download trace”: it replays at the speed above, "
                                "no model needed."))
        if error is not None:
            st.error(message(error))
