"""A headless Chromium page on the served app, for the browser tests (Debian's /usr/bin/chromium, no download)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-quic", "--no-first-run"]
DESKTOP = {"viewport": {"width": 1280, "height": 800}}
QUIET_S = 0.5  # the page counts as loaded once no queue request has been in flight for this long
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 3, "is_mobile": True, "has_touch": True}


def settle(page, timeout_s: float = 60) -> None:
    """Wait until no queue request of ``page`` (a :func:`browser_page`) has been in flight for :data:`QUIET_S`:
    every event chain started so far has delivered its results."""
    start = quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < QUIET_S and time.monotonic() - start < timeout_s:
        page.wait_for_timeout(50)
        if page.convnn_pending:
            quiet_since = time.monotonic()


@contextlib.contextmanager
def browser_page(url: str, context: dict | None = None):
    """A page on ``url`` once the explorer has drawn its first table and the page's first load is done (skips
    without /usr/bin/chromium).

    Args:
        url (str): the app.
        context (dict, optional): Playwright ``new_context`` arguments (viewport, touch…). Default: :data:`DESKTOP`
    """
    if not CHROMIUM.exists():
        pytest.skip("needs /usr/bin/chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            page = browser.new_context(**(context or DESKTOP)).new_page()
            page.convnn_pending = set()  # the queue's requests in flight (a chain streams its results on one)
            page.on("request", lambda r: "/queue/" in r.url and page.convnn_pending.add(r))
            page.on("requestfinished", lambda r: page.convnn_pending.discard(r))
            page.on("requestfailed", lambda r: page.convnn_pending.discard(r))
            page.goto(url)
            page.wait_for_selector(".cx[data-drawn]", timeout=60_000)
            settle(page)  # the rest of the first load's views arrive too
            yield page
        finally:
            browser.close()
