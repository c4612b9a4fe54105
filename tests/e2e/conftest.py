"""Fixtures shared by the browser tests: one `streamlit run` server for the whole session (per
pytest-xdist worker) and one Chromium per module.

One server, because starting one (and loading the model into it) is the browser tests' largest
fixed cost. Tests stay independent of each other on it: each module opens its own pages, so each
has its own Streamlit session (and session token); what the server shares across sessions is what
the app shares across visitors (the model store, the model turn). A test that needs a server of
its own (the Space's entrypoint, a first visit right after a start) starts one itself.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from .browser import launch_chromium, streamlit_server


@pytest.fixture(scope="session")
def url(tmp_path_factory):
    with streamlit_server(tmp_path_factory.mktemp("server") / "streamlit.log") as address:
        yield address


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        chromium = launch_chromium(pw)
        yield chromium
        chromium.close()
