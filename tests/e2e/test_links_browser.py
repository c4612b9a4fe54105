"""Share links in real Chromium at 1920×1080: a link to the Attention page with an example and a
layer and head opens with the selectors on them; the page's own "Share this view" gives a link
with the page's path and the selection (never the session token), which opens the same view in
another browser; a published run opens in another browser context as recorded, on the sender's
selection; the address keeps the view through a reload and Back. A link as the first visit after a
server's start: tests/e2e/test_space.py."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from playwright.sync_api import expect

from .browser import wait_for_app

SHOTS = Path(os.environ.get("LINK_SHOTS", "/tmp/links-shots"))


def chosen(page, label: str) -> str:
    return page.get_by_role("combobox", name=label, exact=True).input_value()


def open_link(browser, link: str, width: int = 1920, height: int = 1080):
    page = browser.new_context(viewport={"width": width, "height": height}).new_page()
    page.goto(link)
    wait_for_app(page)
    page.get_by_role("heading", name="Attention").first.wait_for(timeout=60_000)
    wait_for_app(page)
    return page


def shared_link(page) -> str:
    """The link in the sidebar's "Share this view"."""
    page.get_by_test_id("stSidebar").get_by_text("Share this view").click()
    code = page.get_by_test_id("stSidebar").locator("[data-testid='stCode'] code").first
    code.wait_for(timeout=30_000)
    return code.inner_text().strip()


def test_a_link_opens_the_example_on_attention_with_its_layer_and_head(url, browser):
    page = open_link(browser, f"{url}/attention?example=qa&layer=3&head=2")
    assert page.locator('[data-testid="stException"]').count() == 0
    assert (chosen(page, "Layer"), chosen(page, "Head")) == ("3", "2")
    expect(page.get_by_text("Opened the example “Short Q&A” from a link")).to_have_count(1)
    address = parse_qs(urlsplit(page.url).query)
    # the link's values applied: the address holds this session's token and the view
    assert address.keys() == {"s", "layer", "head"}, page.url
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SHOTS / "link-opened-1920.png")

    # the page's own share link: the page's path, the example and the selection, never `s`
    page.get_by_role("combobox", name="Head", exact=True).click()
    page.get_by_role("option", name="5", exact=True).click()
    # the choice's rerun writes it into the address: idle before that rerun is not its end
    page.wait_for_url(re.compile(r"[?&]head=5(&|$)"), timeout=60_000)
    wait_for_app(page)
    link = shared_link(page)
    page.screenshot(path=SHOTS / "share-open-1920.png")
    parts = urlsplit(link)
    params = {k: v[0] for k, v in parse_qs(parts.query).items()}
    assert f"{parts.scheme}://{parts.netloc}" == url and parts.path == "/attention"
    assert params == {"example": "qa", "layer": "3", "head": "5"}  # default settings left out
    assert "s" not in params and address["s"][0] not in link

    other = open_link(browser, link, 1440, 900)
    assert (chosen(other, "Layer"), chosen(other, "Head")) == ("3", "5")
    assert other.locator('[data-testid="stException"]').count() == 0
    other.screenshot(path=SHOTS / "link-opened-1440.png")
    shared_link(other)
    other.screenshot(path=SHOTS / "share-open-1440.png")


def test_bad_values_in_a_link_are_one_line_each_never_a_traceback(url, browser):
    page = open_link(browser, f"{url}/attention?example=nope&layer=99&head=x&temperature=7")
    assert page.locator('[data-testid="stException"]').count() == 0
    warnings = page.get_by_test_id("stAlertContentWarning")
    expect(warnings).to_have_count(3)  # retries until the page's deltas have all arrived
    page.get_by_text("No trace yet").first.wait_for(timeout=10_000)
    page.screenshot(path=SHOTS / "link-bad-1920.png")


def pick(page, label: str, option: str) -> None:
    page.get_by_role("combobox", name=label, exact=True).click()
    page.get_by_role("option", name=option, exact=True).click()
    wait_for_app(page)


def test_a_published_run_opens_elsewhere_as_recorded_on_the_same_selection(url, browser):
    sender = open_link(browser, f"{url}/attention?example=qa&layer=3&step=5")
    pick(sender, "Head", "2")
    sidebar = sender.get_by_test_id("stSidebar")
    sidebar.get_by_text("Share this view").click()
    sidebar.get_by_role("button", name="Publish a link to this run").click()
    wait_for_app(sender)
    expect(sidebar.get_by_text("Published at")).to_have_count(1)
    link = sidebar.locator("[data-testid='stCode'] code").first.inner_text().strip()
    params = {k: v[0] for k, v in parse_qs(urlsplit(link).query).items()}
    assert params.keys() == {"view", "example", "layer", "head", "step"}, link
    assert (params["layer"], params["head"], params["step"]) == ("3", "2", "5")
    sender.screenshot(path=SHOTS / "published-sender-1920.png")

    receiver = open_link(browser, link)  # a browser context of its own: another visitor
    expect(receiver.get_by_text("Opened the run shared with this link")).to_have_count(1)
    # The server's page for the link asks for the chart code itself (ui/link_page.py), before
    # the app's script draws the first chart.
    early = receiver.evaluate("[...document.querySelectorAll('head script[type=module]:not([src])')]"
                              ".map((s) => s.textContent).join()")
    assert "/PlotlyChart." in early, early
    assert (chosen(receiver, "Layer"), chosen(receiver, "Head")) == ("3", "2")
    assert receiver.locator('[data-testid="stException"]').count() == 0
    address = {k: v[0] for k, v in parse_qs(urlsplit(receiver.url).query).items()}
    assert address.keys() == {"s", "layer", "head", "step"}, receiver.url
    receiver.screenshot(path=SHOTS / "published-receiver-1920.png")


def test_the_address_keeps_the_view_through_a_reload_and_back(url, browser):
    page = open_link(browser, f"{url}/attention?example=qa&layer=3&head=2")
    page.reload()
    wait_for_app(page)
    page.get_by_role("heading", name="Attention").first.wait_for(timeout=60_000)
    assert (chosen(page, "Layer"), chosen(page, "Head")) == ("3", "2")
    page.goto(page.url.replace("/attention", "/story"))  # the same address on Step by step
    page.get_by_role("heading", name="Inference, step by step").wait_for(timeout=60_000)
    wait_for_app(page)
    # each click's own stage, not just "idle": right after a click the page can still read idle
    # before its rerun starts, and a second click then lands on the same stage (a CI run did)
    for stage in (2, 3):
        page.get_by_role("button", name="Next →").click()
        expect(page.get_by_text(f"Stage {stage} of")).to_have_count(1, timeout=60_000)
        wait_for_app(page)
    expect(page).to_have_url(re.compile(r"stage=3"))  # written as the run ends
    assert "layer=3" in page.url and "head=2" in page.url
    page.go_back()  # each change of view is one entry of the history
    expect(page.get_by_text("Stage 2 of")).to_have_count(1, timeout=60_000)
    expect(page).to_have_url(re.compile(r"stage=2"))
    page.reload()
    page.get_by_role("heading", name="Inference, step by step").wait_for(timeout=60_000)
    wait_for_app(page)
    expect(page.get_by_text("Stage 2 of")).to_have_count(1, timeout=60_000)
    page.screenshot(path=SHOTS / "address-reload-1920.png")
