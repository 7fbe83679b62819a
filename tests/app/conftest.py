"""Fixtures of the app tests: handlers on the small checkpoints, one in-process server for the session, and a toy
selection rule."""

from __future__ import annotations

import os
import socket

import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import app
import app_server
from convnn.selection import SELECTION_RULES, Neighbors, SelectionRule, register_rule
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


def first_keys(q, k, grid, options) -> Neighbors:
    """A toy rule: every query's neighbours are the map's first K tokens, in order, each scoring 0."""
    batch, heads, tokens = q.shape[:3]
    idx = torch.arange(options.num_neighbors).expand(batch, heads, tokens, options.num_neighbors)
    return Neighbors(topk_idx=idx, topk_scores=torch.zeros(idx.shape, dtype=q.dtype))


@pytest.fixture
def toy_rule():
    """The toy rule :func:`first_keys` registered as "first" for one test, as docs/architecture.md says a rule is."""
    rule = register_rule(SelectionRule("first", "first keys (toy)", first_keys))
    yield rule
    del SELECTION_RULES[rule.name]
