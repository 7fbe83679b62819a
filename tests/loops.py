"""Running a coroutine from a test, whatever else the pytest worker runs."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def run_coroutine(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run(coroutine)`` in a thread of its own, and its result. Playwright's sync API (the browser tests'
    ``chromium`` fixture, session-wide) keeps an event loop running in the worker's main thread, where
    ``asyncio.run`` refuses to start another: a test that called it there failed whenever a browser test had run
    before it in the same worker.

    Raises:
        Exception: whatever the coroutine raises.
    """
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
