"""A shared server's quotas and budgets as visitors meet them (issue 42), in real Chromium on a
hosted server of this module's own (1 MB of room for uploads), each visitor one browser with its
own X-Forwarded-For as a Space's proxy writes it.

- A visitor's own published links last (point 3): one visitor publishes three runs, then opens
  six more example sessions — past the eight records one visitor keeps for reloads — and another
  visitor opens all three links.
- The uploads' room answers in the app's words (point 4): a trace file the server has no room
  for gets the app's sentence, not Streamlit's "AxiosError: Request failed with status code 400".
- A click holds the model for its budget only (point 2): a visitor opens a trace file whose
  prompt text was lengthened behind its few prompt tokens and asks What if which heads matter
  (the text re-tokenized to ~1,800 tokens held a hosted model 89 s); another visitor's "Hi"
  then finishes within the budget.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from playwright.sync_api import expect

from .browser import go_to, open_app, start_generation, wait_for_app
from .turns_load import hosted_server, warmed_up

EXAMPLES = ("qa", "story", "multilingual", "sampled", "zh-hant-qa", "zh-hans-story")
UPLOADER = '[data-testid="stFileUploaderDropzoneInput"]'


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    log = tmp_path_factory.mktemp("hosted") / "server.log"
    with hosted_server(log, env={"INFERENCE_EXPLORER_UPLOADS_MB": "1"}) as (url, _proc):
        warmed_up(log)
        yield url


def visitor(browser, address: str):
    return browser.new_context(viewport={"width": 1440, "height": 900},
                               extra_http_headers={"X-Forwarded-For": address}).new_page()


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


def test_a_visitors_published_links_outlast_their_later_browsing(browser, hosted):
    sender = visitor(browser, "10.42.0.1")
    links = []
    for name in EXAMPLES[:3]:
        opened(sender, f"{hosted}/attention?example={name}")
        links.append(published_link(sender))
    for name in (*EXAMPLES, *EXAMPLES)[:6]:  # six more sessions of the same visitor
        opened(sender, f"{hosted}/attention?example={name}")
    receiver = visitor(browser, "10.42.0.2")
    for link in links:
        opened(receiver, link)
        expect(receiver.get_by_text("Opened the run shared with this link")).to_have_count(1)
        assert receiver.locator('[data-testid="stException"]').count() == 0


def test_an_upload_the_server_has_no_room_for_is_told_in_the_apps_words(browser, hosted,
                                                                        tmp_path):
    trace = tmp_path / "run.npz"
    trace.write_bytes(b"PK" + bytes(2 << 20))  # 2 MB, over the server's 1 MB of room
    page = open_app(browser, hosted)
    page.locator(UPLOADER).set_input_files(str(trace))
    page.get_by_text("The server holds as many uploaded files as it can right now").wait_for(
        timeout=60_000)
    wait_for_app(page)
    assert page.get_by_text("AxiosError").count() == 0
    assert page.locator('[data-testid="stException"]').count() == 0


def test_a_changed_trace_holds_no_one_elses_turn(browser, hosted, tmp_path):
    from engine.files import read_trace_file
    from engine.records.examples import examples
    from engine.records.tracefile import trace_to_bytes

    small = read_trace_file(next(e for e in examples() if e.name == "sampled").path).trace
    changed = tmp_path / "changed.npz"
    changed.write_bytes(trace_to_bytes(replace(small, prompt="many words " * 600)))
    attacker = visitor(browser, "10.42.0.3")
    attacker.goto(hosted)
    wait_for_app(attacker)
    attacker.locator(UPLOADER).set_input_files(str(changed))
    wait_for_app(attacker)
    go_to(attacker, "What if")
    attacker.get_by_role("tab", name="Switch heads off").click()
    wait_for_app(attacker)
    attacker.get_by_role("button", name="Which heads matter?").click()
    other = visitor(browser, "10.42.0.4")
    other.goto(hosted)
    wait_for_app(other)
    start = time.monotonic()
    start_generation(other, "Hi")
    other.get_by_text("stopped because").wait_for(timeout=180_000)
    waited = time.monotonic() - start
    print(f"\nanother visitor's Hi finished {waited:.1f} s after its press")
    # measured on a 2-core VM: 27.6 s before (the sweep ran ~1,800 tokens of text past its
    # budget), 2.7 s after (refused on opening); a click's budget (15 s) is the line
    assert waited < 15, waited
    wait_for_app(attacker)
    assert attacker.locator('[data-testid="stException"]').count() == 0
