"""Record files on a page: one section that downloads the shown record, replays it, and opens a
file of the same kind (read by its format's reader, never unpickled) as the shown record."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import streamlit as st

from engine.errors import EngineError
from i18n import N_, _
from ui.live import make_room
from ui.memo import file_bytes
from ui.replay import REPLAY_MAX_S, ask_replay
from ui.state import app_state
from ui.text import message
from ui.upload_guard import upload_bytes

T = TypeVar("T")
# the replay button's help, per noun of the shown record (RecordFiles.noun)
REPLAY_HELP = {"run": N_("Draw the run again at its recorded pace (at most {most} s)."),
               "load": N_("Draw the load again at its recorded pace (at most {most} s).")}
REPLAY_ANY = N_("Draw the {noun} again at its recorded pace (at most {most} s).")


def opened_file(label: str, key: str, max_mb: int, load: Callable[[bytes], T]) -> tuple[T, str] | None:
    """A record file the visitor has just uploaded, read by `load`, with its name; None when
    there is none, it was opened already, or it was refused — then with one sentence on the
    page."""
    upload = st.file_uploader(label, type=["json"], key=key, max_upload_size=max_mb)
    opened = app_state().page.opened_files
    if upload is None or opened.get(key) == upload.file_id:
        return None
    opened[key] = upload.file_id
    try:
        record = load(upload_bytes(upload, max_mb))
        make_room(record, _("this file"))
        return record, upload.name[:120]
    except EngineError as err:
        st.error(_("Not opened: {error}").format(error=message(err)))
        return None


@dataclass(frozen=True, slots=True)
class RecordFiles:
    """One kind of record file on its page: its section's title, the replay kind and the noun
    for the shown record ("run", "load"), the download's label, name and help, and the opener's
    label, widget key, size cap and reader."""

    title: str
    kind: str
    noun: str
    download: str
    file_name: str
    help: str
    open_label: str
    upload_key: str
    max_mb: int
    to_bytes: Callable[[Any], bytes]
    load: Callable[[bytes], Any]


def files_section(files: RecordFiles, record: Any, can_replay: bool,
                  show: Callable[[Any, str], None]) -> None:
    """Download the shown record and replay it (`can_replay`); a file opened here is shown
    (`show(record, "file <name>")`) and replayed."""
    st.subheader(_(files.title))
    row = st.container(horizontal=True)
    if record is not None:
        row.download_button(_(files.download), data=file_bytes(f"{files.kind}_file", record,
                                                                files.to_bytes),
                            on_click="ignore", file_name=files.file_name,
                            mime="application/json", help=_(files.help),
                            key=f"{files.kind}_download")
        replay_help = _(REPLAY_HELP.get(files.noun, REPLAY_ANY)).format(
            noun=files.noun, most=f"{REPLAY_MAX_S:.0f}")
        if can_replay and row.button(_("Replay it"), icon=":material/replay:",
                                     key=f"{files.kind}_replay", help=replay_help):
            ask_replay(files.kind)
            st.rerun()
    opened = opened_file(_(files.open_label), files.upload_key, files.max_mb, files.load)
    if opened is not None:
        show(opened[0], _("file {name}").format(name=opened[1]))
        ask_replay(files.kind)
        st.rerun()
