"""A headless Chromium page on the served app, for the browser tests (Debian's /usr/bin/chromium, no download):
one browser per test process (:func:`chromium`), a fresh context (cookies, storage, cache) for every page."""

from __future__ import annotations

import contextlib
import time
import urllib.parse
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-quic", "--no-first-run"]
DESKTOP = {"viewport": {"width": 1280, "height": 800}}
QUIET_S = 0.5  # a page counts as settled once none of its queue events has been open for this long
PHONE = {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 3, "is_mobile": True, "has_touch": True}
# The page's queue events, as Gradio's client sends and receives them (through window.fetch): ``joined`` (the
# dependencies whose /queue/join has been answered), ``joining`` (joins not answered yet), ``open`` (events joined
# whose result has not arrived on /queue/data) and ``early`` (results that arrived before their join's answer).
QUEUE_EVENTS_JS = r"""
(() => {
  const queue = window.convnnQueue = {joined: new Set(), joining: 0, open: new Set(), early: new Set()};
  const pageFetch = window.fetch;

  async function readResults(body) {  // the /queue/data stream: `data: {...}` messages, a blank line after each
    const reader = body.getReader(), decoder = new TextDecoder();
    let text = "";
    try {
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
        const messages = (text + decoder.decode(chunk.value, {stream: true})).split("\n\n");
        text = messages.pop();
        for (const message of messages.map(m => JSON.parse(m.replace(/^data: /, "")))) {
          const id = message.msg === "process_completed" && message.event_id;
          if (id && !queue.open.delete(id)) queue.early.add(id);
        }
      }
    } catch (error) {}  // the client aborts the stream once it has every result it waits for
  }

  window.fetch = async function (input, init) {
    const url = input instanceof Request ? input.url : String(input);
    if (!url.includes("/queue/join")) {
      const response = await pageFetch.call(this, input, init);
      if (url.includes("/queue/data")) readResults(response.clone().body);
      return response;
    }
    queue.joining += 1;
    try {
      const response = await pageFetch.call(this, input, init);
      const id = (await response.clone().json().catch(() => ({}))).event_id;
      if (id && !queue.early.delete(id)) queue.open.add(id);
      queue.joined.add(JSON.parse(init.body).fn_index);
      return response;
    } finally {
      queue.joining -= 1;
    }
  };
})();
"""


def expect_chain(page, event: str, elem_id: str | None = None) -> int:
    """The id of the last step of the event chain that ``elem_id``'s ``event`` starts (a tab's ``id`` names it too;
    ``demo.load`` for ``event="load"``; ``.then`` steps followed to the end, from the app's ``/config``), for
    :func:`settle` to wait for; forgets the steps answered so far. The client sends each step only once the one
    before has delivered, so a pause between two can outlast :data:`QUIET_S` on a loaded machine (in CI the last
    three steps of the page's load came after a test had started)."""
    config = page.convnn_config
    names = {c["id"]: (c["props"].get("elem_id"), c["type"] == "tabitem" and c["props"].get("id"))
             for c in config["components"]}
    owner = next(key for key, name in names.items() if elem_id in name) if elem_id else None
    step = next(d["id"] for d in config["dependencies"]
                if any(e == event and (owner is None or c == owner) for c, e in d["targets"]))
    then = {d["trigger_after"]: d["id"] for d in config["dependencies"] if d["targets"] == [[None, "then"]]}
    while step in then:
        step = then[step]
    page.evaluate("window.convnnQueue?.joined.clear()")  # none yet before the page opens
    return step


def settle(page, until: int | None = None, timeout_s: float = 60) -> None:
    """Wait until the queue has answered the join of step ``until`` (:func:`expect_chain`), if given, and no queue
    event of ``page`` (a :func:`browser_page`) has been open (its join unanswered, or its result not delivered) for
    :data:`QUIET_S` since: every event chain started so far has delivered its results. Events, not requests: when an
    event's result arrives before the answer to its join, Gradio's client opens its results stream again, and that
    stream stays open with nothing to deliver. An event the page holds back (always_last: a change made while the one
    before is answered) is not open until the page sends it: wait for what it draws first.

    Raises:
        AssertionError: not settled in ``timeout_s``.
    """
    start = time.monotonic()
    while until is not None and not page.evaluate("step => convnnQueue.joined.has(step)", until):
        assert time.monotonic() - start < timeout_s, f"step {until} of an event chain was not sent in {timeout_s} s"
        page.wait_for_timeout(50)
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < QUIET_S:
        page.wait_for_timeout(50)
        if open_events := page.evaluate("convnnQueue.joining + convnnQueue.open.size"):
            assert time.monotonic() - start < timeout_s, f"{open_events} queue events of the page open at {timeout_s} s"
            quiet_since = time.monotonic()


class HeldJoins:
    """The queue joins a page sends, held back from the server from now on (a step's request on its way, made to last
    while a test does something else), until :meth:`stop` lets later ones through and :meth:`release` the held ones
    too; :meth:`close` ends the holding."""

    def __init__(self, page):
        self.page, self.held, self.stopped = page, [], False
        page.route("**/queue/join*", self._route)

    def _route(self, route) -> None:
        if self.stopped:
            route.continue_()
        else:
            self.held.append(route)

    def wait(self, what: str, timeout_s: float = 30) -> None:
        """Return once a join is held; ``what``: the request the failure names if none is sent in ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.held:
            assert time.monotonic() < deadline, f"{what} was not sent in {timeout_s} s"
            self.page.wait_for_timeout(10)

    def stop(self) -> None:
        self.stopped = True

    def release(self) -> None:
        self.stop()
        for route in self.held:
            route.continue_()

    def close(self) -> None:
        self.page.unroute("**/queue/join*")


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
        page.add_init_script(QUEUE_EVENTS_JS)
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
