"""Fixtures shared by the browser tests: one Chromium and one `streamlit run` server per module
(a module that needs another server, such as the Space's entrypoint, defines its own)."""

from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from .browser import launch_chromium, streamlit_server


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with streamlit_server(tmp_path_factory.mktemp("server") / "streamlit.log") as address:
        yield address


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as pw:
        chromium = launch_chromium(pw)
        yield chromium
        chromium.close()
