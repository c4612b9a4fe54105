"""`streamlit run app.py [options]`, with Streamlit's legacy pages-folder mode switched off.

app.py routes with `st.navigation`, and its pages happen to live in a folder named `pages/`.
Streamlit 1.x treats such a folder as its old multipage layout until some session has run
`st.navigation`: the first visitor after a start who lands on a deep link (`/attention?...`, or
a reload on a sub-page) would get that page's file run on its own, without app.py's sidebar,
session restore or model, and every raw module in `pages/` listed as a page. Clearing the
class-level flag before the server creates its first session makes every run go through app.py.

A background thread does the start-up work (ui/startup.py): loading and warming the model the
first visitor gets, into the same process-wide model store the sessions use, then the pages'
imports. It begins once the server listens (its imports would otherwise compete with the
server's own start for the interpreter); a visitor who comes meanwhile waits for the same work,
never for a second copy of it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from streamlit.runtime.pages_manager import PagesManager
from streamlit.web import cli

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app.py"
LISTEN_WAIT_S = 60.0  # the start-up work begins then even if the server has not said it listens


def server_listening(poll_s: float = 0.05, longest_s: float = LISTEN_WAIT_S) -> bool:
    """Wait until Streamlit's runtime has started (its server listens: the runtime starts right
    after); False if it had not within `longest_s`."""
    from streamlit.runtime import Runtime
    from streamlit.runtime.runtime import RuntimeState

    deadline = time.monotonic() + longest_s
    while time.monotonic() < deadline:
        if Runtime.exists() and Runtime.instance().state != RuntimeState.INITIAL:
            return True
        time.sleep(poll_s)
    return False


def main() -> None:
    PagesManager.uses_pages_directory = False
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the app's folder, as Streamlit adds it for app.py
    from ui import link_page, upload_guard
    from ui.startup import start_in_background

    link_page.install()  # run links ask for the chart code in the page's HTML
    upload_guard.install()  # uploads only for the app's own uploaders, within caps
    start_in_background(first=server_listening)
    sys.argv = ["streamlit", "run", str(APP), *sys.argv[1:]]
    sys.exit(cli.main())


if __name__ == "__main__":
    main()
