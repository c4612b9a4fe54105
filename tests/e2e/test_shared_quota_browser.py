"""A shared server's quotas as visitors meet them (issue 42), in real Chromium on hosted servers
of their own, each visitor one browser with its own X-Forwarded-For as a Space's proxy writes
it. A visitor's own published links last (point 3): one visitor publishes three runs, then opens
six more example sessions — past the eight records one visitor keeps for reloads — and another
visitor opens all three links. The uploads' cap answers in the app's words (point 4): with the
server's room for uploads full, a visitor's trace file gets the app's sentence, not
Streamlit's "AxiosError: Request failed with status code 400"."""

from __future__ import annotations

from playwright.sync_api import expect

from .browser import open_app, wait_for_app
from .turns_load import hosted_server, warmed_up

EXAMPLES = ("qa", "story", "multilingual", "sampled", "zh-hant-qa", "zh-hans-story")


def visitor(browser, address: str):
    return browser.new_context(viewport={"width": 1440, "height": 900},
                               extra_http_headers={"X-Forwarded-For": address})


def opened(page, url: str) -> None:
    page.goto(url)
    wait_for_app(page)
    page.get_by_role("heading", name="Attention").first.wait_for(timeout=60_000)
    wait_for_app(page)


def published_link(page) -> str:
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_text("Share this view").click()
    sidebar.get_by_role("button", name="Publish a link to this run").click()
    wait_for_app(page)
    expect(sidebar.get_by_text("Published at")).to_have_count(1)
    return sidebar.locator("[data-testid='stCode'] code").first.inner_text().strip()


def test_a_visitors_published_links_outlast_their_later_browsing(browser, tmp_path):
    log = tmp_path / "server.log"
    with hosted_server(log) as (url, _proc):
        warmed_up(log)
        sender = visitor(browser, "10.42.0.1").new_page()
        links = []
        for name in EXAMPLES[:3]:
            opened(sender, f"{url}/attention?example={name}")
            links.append(published_link(sender))
        for name in (*EXAMPLES, *EXAMPLES)[:6]:  # six more sessions of the same visitor
            opened(sender, f"{url}/attention?example={name}")
        receiver = visitor(browser, "10.42.0.2").new_page()
        for link in links:
            opened(receiver, link)
            expect(receiver.get_by_text("Opened the run shared with this link")).to_have_count(1)
            assert receiver.locator('[data-testid="stException"]').count() == 0


def test_an_upload_the_server_has_no_room_for_is_told_in_the_apps_words(browser, tmp_path):
    log = tmp_path / "server.log"
    trace = tmp_path / "run.npz"
    trace.write_bytes(b"PK" + bytes(2 << 20))  # 2 MB, over the 1 MB of room below
    with hosted_server(log, env={"INFERENCE_EXPLORER_UPLOADS_MB": "1"}) as (url, _proc):
        page = open_app(browser, url)
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(trace))
        page.get_by_text("The server holds as many uploaded files as it can right now").wait_for(
            timeout=60_000)
        wait_for_app(page)
        assert page.get_by_text("AxiosError").count() == 0
        assert page.locator('[data-testid="stException"]').count() == 0
