"""Fixtures of the app tests: handlers on the small checkpoints, and one in-process server for the session."""

from __future__ import annotations

import os
import socket

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import app
import app_server
from tests import small_models
from tests.app import browser

checkpoint_dir = small_models.checkpoint_dir  # shared fixtures
example_image = small_models.example_image
chromium = browser.chromium


@pytest.fixture(scope="session")
def explorer(checkpoint_dir) -> app.Explorer:
    return app.Explorer(checkpoint_dir, device="cpu")


@pytest.fixture(scope="session")
def app_url(explorer):
    """The app served in this process on a free port (prevent_thread_lock); closed after the session."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo = app.build_demo(explorer)
    _, url, _ = app_server.launch(demo, port, prevent_thread_lock=True, workspace=explorer.workspace)
    yield url
    demo.close()
