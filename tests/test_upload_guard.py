"""ui/upload_guard.py on Streamlit's real uploaded-file manager: a replayed upload under a
made-up id is refused, a session keeps its two newest uploads, all uploads together stay under
the cap, and the server's launcher installs the guard."""

from __future__ import annotations

import uuid

import pytest
from starlette.exceptions import HTTPException
from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
from streamlit.runtime.uploaded_file_manager import UploadedFileRec

from ui import upload_guard
from ui.upload_guard import FILES_PER_SESSION, guard

MB = 1 << 20


@pytest.fixture
def manager():
    class Guarded(MemoryUploadedFileManager):  # the guard patches this class, not Streamlit's
        pass

    guard(Guarded, lambda: 10 * MB)
    return Guarded("/_stcore/upload_file")


def upload(manager, session: str, file_id: str, size: int) -> None:
    manager.add_file(session, UploadedFileRec(file_id, "run.npz", "application/zip", b"x" * size))


def asked(manager, session: str) -> str:
    """The id the front end gets when a visitor picks a file in an uploader."""
    (info,) = manager.get_upload_urls(session, ["run.npz"])
    return info.file_id


def test_a_made_up_file_id_is_refused_and_holds_nothing(manager):
    for _ in range(10):  # the replayed requests of the finding (10 × 45 MB), made-up ids
        with pytest.raises(HTTPException) as err:
            upload(manager, "s1", str(uuid.uuid4()), MB)
        assert err.value.status_code == 400 and "not asked for" in err.value.detail
    assert manager._total_bytes == 0
    file_id = asked(manager, "s1")
    upload(manager, "s1", file_id, MB)
    with pytest.raises(HTTPException):
        upload(manager, "s1", file_id, MB)  # an id is good for one upload
    with pytest.raises(HTTPException):
        upload(manager, "s2", asked(manager, "s1"), MB)  # and for its own session only


def test_a_session_keeps_its_newest_uploads_and_all_stay_under_the_cap(manager):
    ids = [asked(manager, "s1") for _ in range(4)]
    for file_id in ids:
        upload(manager, "s1", file_id, 2 * MB)
    assert list(manager.file_storage["s1"]) == ids[-FILES_PER_SESSION:]
    upload(manager, "s2", asked(manager, "s2"), 4 * MB)
    upload(manager, "s3", asked(manager, "s3"), 2 * MB)  # 4 + 4 + 2 = 10 MB: at the cap
    # a visitor's own file the server has no room for: not an HTTP error (Streamlit's uploader
    # would show "AxiosError: Request failed with status code 400"), an empty placeholder and
    # the app's sentence for the page
    late = asked(manager, "s4")
    upload(manager, "s4", late, MB)
    (held,) = manager.get_files("s4", [late])
    assert held.data == b"" and manager._total_bytes == 10 * MB
    assert "as many uploaded files as it can" in upload_guard._REFUSED[("s4", late)]
    manager.remove_session_files("s4")
    assert ("s4", late) not in upload_guard._REFUSED
    manager.remove_session_files("s2")
    upload(manager, "s4", asked(manager, "s4"), MB)
    assert manager._total_bytes == 7 * MB


def test_the_launcher_guards_streamlits_manager():
    """scripts/streamlit_app.py's main, up to starting the server (in a process of its own: the
    guard patches Streamlit's class for the whole process)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; import scripts.streamlit_app as app; from unittest import mock\n"
            "from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager"
            " as M\n"
            "with mock.patch('streamlit.web.cli.main', lambda: 0), "
            "mock.patch('ui.startup.start_in_background', lambda **k: None):\n"
            "    try: app.main()\n"
            "    except SystemExit: pass\n"
            "print(getattr(M, 'upload_guard', False))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "True", done.stderr[-2000:]
