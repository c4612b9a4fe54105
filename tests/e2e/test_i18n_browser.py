"""The app in Chinese in Chromium: the Chinese example opened by a link in each variant, its words
drawn in the variant's Noto CJK font (the fonts Chromium really used, read through the DevTools
protocol), in the page text and in a chart; the sidebar's switch changes the language without
losing the run, the address keeps it across a reload, and presentation mode keeps it."""

from __future__ import annotations

import re

import pytest

from i18n import _, using

from .browser import wait_for_app

FONT = {"zh-Hant": "Noto Sans CJK TC", "zh-Hans": "Noto Sans CJK SC"}


def words(lang: str, message: str) -> str:
    with using(lang):
        return _(message)


def fonts_used(page, selector: str) -> dict[str, int]:
    """Glyphs per font family that Chromium drew the first element matching `selector` with."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1, "pierce": True})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    assert node, selector
    fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    return {f["familyName"]: f["glyphCount"] for f in fonts}


def open_chinese_example(page, url: str, lang: str, extra: str = "") -> None:
    page.goto(f"{url}/?example=zh-hant-qa&lang={lang}{extra}")
    wait_for_app(page)
    page.locator(".ie-chips .ie-gen").first.wait_for(timeout=60_000)
    wait_for_app(page)
    page.wait_for_timeout(1000)  # plotly draws after the script run has ended


@pytest.mark.parametrize("lang", ["zh-Hant", "zh-Hans"])
def test_chinese_pages_are_drawn_in_the_variants_cjk_font(browser, url, lang):
    page = browser.new_page(viewport={"width": 1920, "height": 1080})
    open_chinese_example(page, url, lang)
    title = words(lang, "Generate")
    assert page.locator("h1").first.inner_text().strip() == title
    nav = page.get_by_test_id("stSidebarNav").inner_text()
    assert words(lang, "Prefill vs decode") in nav and "Prefill vs decode" not in nav
    used = fonts_used(page, "h1")
    assert used.get(FONT[lang], 0) >= 2, used  # the title's Chinese characters
    # a chart's axis title in Chinese, drawn by the same font (the chart names it in its stack)
    axis = page.locator(".main-svg text.ytitle, .main-svg text.xtitle").filter(
        has_text=re.compile(r"[\u4e00-\u9fff]")).first
    axis.wait_for()
    family = axis.evaluate("e => getComputedStyle(e).fontFamily")
    assert FONT[lang] in family, family
    page.close()


def test_switching_keeps_the_run_and_the_address_keeps_the_language(browser, url):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    open_chinese_example(page, url, "zh-Hant")
    chips = page.locator(".ie-chips .ie-gen").count()
    assert chips > 0
    page.get_by_test_id("stSidebar").get_by_text("简体中文", exact=True).click()
    page.get_by_role("heading", name=words("zh-Hans", "Generate")).first.wait_for()
    wait_for_app(page)
    page.wait_for_url(re.compile(r"lang=zh-Hans"), timeout=30_000)  # the run's end writes it
    assert page.locator(".ie-chips .ie-gen").count() == chips  # the same run, not run again
    page.reload()
    wait_for_app(page)
    page.get_by_role("heading", name=words("zh-Hans", "Generate")).first.wait_for()
    assert page.locator(".ie-chips .ie-gen").count() == chips  # the session came back with it
    page.get_by_test_id("stSidebar").get_by_text("English", exact=True).click()
    page.get_by_role("heading", name="Generate").first.wait_for()
    wait_for_app(page)
    page.close()


def test_presentation_mode_keeps_the_language(browser, url):
    page = browser.new_page(viewport={"width": 1920, "height": 1080})
    open_chinese_example(page, url, "zh-Hant", "&present=1")
    assert not page.get_by_test_id("stSidebar").is_visible()
    row = page.locator(".st-key-present_nav")
    assert words("zh-Hant", "Prefill vs decode") in row.inner_text()
    assert fonts_used(page, "h1").get(FONT["zh-Hant"], 0) >= 2
    assert "lang=zh-Hant" in page.url and "present=1" in page.url
    page.close()


def test_the_browsers_language_picks_the_first_visit(browser, url):
    """A browser that asks for Traditional Chinese (Accept-Language: zh-TW) gets it with no
    ?lang=, and the address then names it."""
    context = browser.new_context(locale="zh-TW", viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.goto(url)
    wait_for_app(page)
    page.get_by_role("heading", name=words("zh-Hant", "Generate")).first.wait_for()
    wait_for_app(page)
    assert "lang=zh-Hant" in page.url
    context.close()
