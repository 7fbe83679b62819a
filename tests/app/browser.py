"""A headless Chromium page on the served app, for the browser tests (Debian's /usr/bin/chromium, no download):
one browser per test process (:func:`chromium`), a fresh context (cookies, storage, cache) for every page."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.parse
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-quic", "--no-first-run"]
DESKTOP = {"viewport": {"width": 1280, "height": 800}}
QUIET_S = 0.5  # a page counts as settled once no queue request has been in flight for this long
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 3, "is_mobile": True, "has_touch": True}


def expect_chain(page, event: str, elem_id: str | None = None) -> int:
    """The id of the last step of the event chain that ``elem_id``'s ``event`` starts (``demo.load`` for
    ``event="load"``; ``.then`` steps followed to the end, from the app's ``/config``), for :func:`settle` to wait
    for; forgets the steps answered so far. The client sends each step only once the one before has delivered, so a
    pause between two can outlast :data:`QUIET_S` on a loaded machine (in CI the last three steps of the page's load
    came after a test had started)."""
    config = page.convnn_config
    owner = next(c["id"] for c in config["components"] if c["props"].get("elem_id") == elem_id) if elem_id else None
    step = next(d["id"] for d in config["dependencies"]
                if any(e == event and (owner is None or c == owner) for c, e in d["targets"]))
    then = {d["trigger_after"]: d["id"] for d in config["dependencies"] if d["targets"] == [[None, "then"]]}
    while step in then:
        step = then[step]
    page.convnn_joins.clear()
    return step


def settle(page, until: int | None = None, timeout_s: float = 60) -> None:
    """Wait until the queue has answered the join of step ``until`` (:func:`expect_chain`), if given, and no queue
    request of ``page`` (a :func:`browser_page`) has been in flight for :data:`QUIET_S` since: every event chain
    started so far has delivered its results."""
    start = time.monotonic()
    while until is not None and until not in page.convnn_joins:
        assert time.monotonic() - start < timeout_s, f"step {until} of an event chain was not sent in {timeout_s} s"
        page.wait_for_timeout(50)
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < QUIET_S and time.monotonic() - start < timeout_s:
        page.wait_for_timeout(50)
        if page.convnn_pending:
            quiet_since = time.monotonic()


def joined(request) -> int | None:
    """The dependency id a finished queue/join request asked for (None for any other request)."""
    return json.loads(request.post_data)["fn_index"] if "/queue/join" in request.url else None


@pytest.fixture(scope="session")
def chromium():
    """Headless Chromium, started once per test process (skips without /usr/bin/chromium)."""
    if not CHROMIUM.exists():
        pytest.skip("needs /usr/bin/chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def browser_page(chromium, url: str, context: dict | None = None, ready: str = ".cx[data-drawn]"):
    """A page on ``url``, in a new context of the :func:`chromium` browser, once ``ready`` is in it (by default:
    the explorer has drawn its first table) and the page's first load is done.

    Args:
        chromium: the :func:`chromium` fixture.
        url (str): the app.
        context (dict, optional): Playwright ``new_context`` arguments (viewport, touch…). Default: :data:`DESKTOP`
        ready (str): a selector of what the page shows once open. Default: the explorer drawn
    """
    browser_context = chromium.new_context(**(context or DESKTOP))
    try:
        page = browser_context.new_page()
        page.convnn_pending = set()  # the queue's requests in flight (a chain streams its results on one)
        page.convnn_joins = set()  # the dependencies whose queue/join has been answered
        page.on("request", lambda r: "/queue/" in r.url and page.convnn_pending.add(r))
        page.on("requestfinished", lambda r: (page.convnn_pending.discard(r), page.convnn_joins.add(joined(r))))
        page.on("requestfailed", lambda r: page.convnn_pending.discard(r))
        parts = urllib.parse.urlsplit(url)
        page.convnn_config = page.request.get(urllib.parse.urlunsplit(
            (*parts[:2], parts.path.rstrip("/") + "/config", "", ""))).json()
        loads = any(event == "load" for step in page.convnn_config["dependencies"] for _, event in step["targets"])
        load = expect_chain(page, "load") if loads else None
        page.goto(url)
        page.wait_for_selector(ready, timeout=60_000)
        settle(page, load)  # the rest of the first load's views arrive too
        yield page
    finally:
        browser_context.close()
