"""Uploads only for files the app's own uploader asked for, and a bounded number of bytes held.

Streamlit's upload endpoint (`PUT /_stcore/upload_file/<session>/<file id>`) takes any file id
for a live session, and its file manager keeps every file until the session ends: replaying that
request with made-up ids held hundreds of megabytes per visitor. Here the manager (the one class
every upload goes through) accepts a file only under an id it issued to that session when the
front end asked where to upload a file a visitor picked (`get_upload_urls`), and only once; a
session keeps its two newest uploads; all sessions' uploads together stay under
`AppConfig.uploads_mb`. An upload under an id never issued is an HTTP 400 (a crafted request: the
front end never makes one). An upload the server has no room for is a visitor's own file, so the
visitor is told why in the app's words: Streamlit's uploader shows any refused upload as
"AxiosError: Request failed with status code 400", never the answer's text, so the upload is
accepted as an empty placeholder and `refusal(upload)` gives the page the sentence to show.

`install()` patches Streamlit's MemoryUploadedFileManager (scripts/streamlit_app.py calls it
before the server starts); it fails loudly if a Streamlit upgrade has renamed those methods.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from i18n import DEFAULT, _, using

FILES_PER_SESSION = 2  # two uploaders in use at once at most (Compare runs: a trace file for B)
ISSUED_PER_SESSION = 8  # ids handed out and not yet used, per session (older ones lapse)
REFUSED_KEPT = 4096  # placeholders' sentences remembered, all sessions together (oldest lapse)
_REFUSED: OrderedDict[tuple[str, str], str] = OrderedDict()  # (session, file id) → sentence
_REFUSED_LOCK = threading.Lock()
METHODS = ("get_upload_urls", "add_file", "remove_session_files", "remove_file")


def refuse(detail: str) -> Exception:
    from starlette.exceptions import HTTPException

    return HTTPException(status_code=400, detail=detail)


def session_language(session_id: str) -> str:
    """The language of the session an upload belongs to: uploads arrive in the server's own
    thread, outside any script run, so the session's state says it (English when it cannot)."""
    try:
        from streamlit.runtime import Runtime

        from ui.keys import LANG

        info = Runtime.instance()._session_mgr.get_session_info(session_id)
        return (info.session.session_state.get(LANG) if info is not None else None) or DEFAULT
    except Exception:  # no runtime (tests), or Streamlit changed: English  # noqa: BLE001
        return DEFAULT


def guard(manager: type, max_total_bytes: Callable[[], int]) -> None:
    """Patch `manager` (Streamlit's MemoryUploadedFileManager or a subclass) in place."""
    if manager.__dict__.get("upload_guard", False):  # this class itself, not a base, is guarded
        return
    missing = [m for m in METHODS if not callable(getattr(manager, m, None))]
    if missing:
        raise RuntimeError(f"Streamlit's uploaded-file manager changed ({', '.join(missing)}): "
                           "ui/upload_guard.py needs updating for this Streamlit version")
    issue, add, forget = manager.get_upload_urls, manager.add_file, manager.remove_session_files
    issued: dict[str, OrderedDict[str, None]] = {}
    lock = threading.Lock()

    def get_upload_urls(self: Any, session_id: str, file_names: Sequence[str]) -> list[Any]:
        infos = issue(self, session_id, list(file_names)[:ISSUED_PER_SESSION])
        with lock:
            ids = issued.setdefault(session_id, OrderedDict())
            for info in infos:
                ids[info.file_id] = None
            while len(ids) > ISSUED_PER_SESSION:
                ids.popitem(last=False)
        return infos

    def add_file(self: Any, session_id: str, file: Any) -> None:
        with lock:
            ids = issued.get(session_id)
            if ids is None or file.file_id not in ids:
                with using(session_language(session_id)):
                    detail = _("This upload was not asked for by one of the app's file "
                               "uploaders.")
                raise refuse(detail)
            del ids[file.file_id]
        held = list(self.file_storage.get(session_id, {}))
        for old in held[:max(len(held) - FILES_PER_SESSION + 1, 0)]:
            self.remove_file(session_id, old)  # the session's oldest uploads make room
        if self._total_bytes + len(file.data) > max_total_bytes():
            with using(session_language(session_id)):
                detail = _("The server holds as many uploaded files as it can right now; try "
                           "again in a few minutes.")
            with _REFUSED_LOCK:
                _REFUSED[(session_id, file.file_id)] = detail
                while len(_REFUSED) > REFUSED_KEPT:
                    _REFUSED.popitem(last=False)
            file = type(file)(file.file_id, file.name, file.type, b"")  # the placeholder
        add(self, session_id, file)

    def remove_session_files(self: Any, session_id: str) -> None:
        with lock:
            issued.pop(session_id, None)
        with _REFUSED_LOCK:
            for key in [k for k in _REFUSED if k[0] == session_id]:
                del _REFUSED[key]
        forget(self, session_id)

    manager.get_upload_urls = get_upload_urls
    manager.add_file = add_file
    manager.remove_session_files = remove_session_files
    manager.upload_guard = True


def upload_bytes(upload: Any, max_mb: int) -> bytes:
    """An uploaded file's bytes, for a page's reader: InputError (one line) when the server kept
    only its placeholder (`refusal`) or it is over `max_mb`."""
    from engine.errors import InputError

    refused = refusal(upload)
    if refused is not None:
        raise InputError(refused)
    if upload.size > max_mb << 20:
        raise InputError(_("the file is over {mb} MB").format(mb=max_mb))
    return upload.getvalue()


def refusal(upload: Any) -> str | None:
    """Why the server did not keep this upload (an UploadedFile of the running session), in
    the session's language; None when it holds the file."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None:
        return None
    with _REFUSED_LOCK:
        return _REFUSED.get((ctx.session_id, upload.file_id))


def install() -> None:
    """Guard the uploads of this process's Streamlit server (its configured caps)."""
    from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager

    from ui.config import config

    guard(MemoryUploadedFileManager, lambda: config().uploads_mb << 20)
