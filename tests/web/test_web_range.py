"""The results page's Range dropdown applies the picked range at once, in Chromium, under the app's own
Content-Security-Policy (which blocks inline handlers: the dropdown once did nothing), and the page still
works without script through its "Show" button."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from flask import Flask
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait
from web_helpers import PASSWORD, USERNAME, live_server


def since_of(url: str) -> list[str] | None:
    return parse_qs(urlparse(url).query).get("since")


def log_in(browser: Any, base: str) -> None:
    browser.get(base + "/login")
    browser.find_element(By.ID, "username").send_keys(USERNAME)
    browser.find_element(By.ID, "password").send_keys(PASSWORD)
    browser.find_element(By.ID, "login").click()
    WebDriverWait(browser, 20).until(lambda d: "/login" not in d.current_url)


def test_picking_a_range_reloads_the_results_with_it(app: Flask, browser: Any) -> None:
    with live_server(app) as base:
        log_in(browser, base)
        browser.get(f"{base}/traces/anything/results?since=15m")
        assert Select(browser.find_element(By.ID, "range")).first_selected_option.text == "15m"
        # With script the dropdown applies itself: the button is for pages without script.
        assert not browser.find_element(By.ID, "range-show").is_displayed()

        Select(browser.find_element(By.ID, "range")).select_by_visible_text("1h")
        WebDriverWait(browser, 20).until(lambda d: since_of(d.current_url) == ["1h"])
        WebDriverWait(browser, 20).until(
            lambda d: Select(d.find_element(By.ID, "range")).first_selected_option.text == "1h"
        )
        violations = [
            entry["message"]
            for entry in browser.get_log("browser")
            if "Content Security Policy" in entry["message"]
        ]
        assert violations == []


def test_no_template_has_an_inline_handler() -> None:
    """script-src 'self' blocks every inline on...= handler: none may be written in a template."""
    templates = Path(__file__).resolve().parents[2] / "web" / "templates"
    inline = [
        f"{path.name}: {match.group(0)}"
        for path in sorted(templates.rglob("*.html"))
        for match in re.finditer(r"\son[a-z]+\s*=", path.read_text())
    ]
    assert inline == []
