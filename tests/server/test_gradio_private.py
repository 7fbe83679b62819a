"""Each part of Gradio outside its public API that the server's modules, ``app_server.py`` and ``app_api.py`` touch
(their ``GRADIO_PRIVATE``) is still there, in the form they use. A Gradio upgrade that removes or changes one fails
here, naming it and who uses it, before a guard quietly stops guarding; ``requirements.txt`` pins Gradio to the minor
versions these tests passed on."""

from __future__ import annotations

import inspect
import re

import gradio as gr
import pytest
from gradio import component_meta, processing_utils, route_utils, utils
from gradio.data_classes import PredictBodyInternal
from gradio.queueing import Event, EventQueue, Queue
from starlette.requests import Request

import app_api
import app_server
from server import controls, fairness, guards, visitors, wiring
from tests.loops import run_coroutine

USERS = (guards, controls, wiring, fairness, visitors, app_server, app_api)


@pytest.fixture(scope="module")
def parts() -> dict[str, object]:
    """One object of each kind a ``GRADIO_PRIVATE`` entry names (``"Kind.attribute"``), as the app has them: a queued
    app with an event of a concurrency group, and one event and request for it, and a handler's request."""
    with gr.Blocks() as demo:
        box = gr.Number(elem_id="box")
        box.change(lambda value: value, box, box, concurrency_id="group", concurrency_limit=1)
    demo.queue()
    fn = next(iter(demo.fns.values()))
    return {"Blocks": demo, "Queue": demo._queue, "EventQueue": EventQueue("group", 1), "BlockFunction": fn,
            "Event": Event("session", fn, None, None), "Block": box,
            "PredictBodyInternal": PredictBodyInternal(data=[1], fn_index=fn._id, session_hash="session"),
            "Request": gr.Request(request=Request({"type": "http", "headers": [], "state": {"who": "t:1"}})),
            "component_meta": component_meta, "processing_utils": processing_utils, "utils": utils,
            "route_utils": route_utils}


@pytest.mark.parametrize(("user", "name"), [(user, name) for user in USERS for name in user.GRADIO_PRIVATE],
                         ids=lambda value: getattr(value, "__name__", value))
def test_each_private_part_of_gradio_that_is_used_is_there(parts, user, name):
    kind, attribute = name.rsplit(".", 1)
    assert hasattr(parts[kind], attribute), (
        f"Gradio {gr.__version__} has no {name}, which {user.__name__} uses ({user.GRADIO_PRIVATE[name]}): adapt "
        f"{user.__name__} to the new Gradio before widening the pin in requirements.txt")


def test_the_private_parts_have_the_form_the_guards_use(parts):
    """What the guards call and read, beyond the names: the queue's ``push`` is a coroutine of (body, request,
    username) answering (queued, message, status) (Admission wraps it), its groups a dict of waiting lists and its
    running jobs a list; an event knows its session, handler, request and group; a request body its handler's
    index, session and values; the cache copy takes (file, folder); a template class is shown as its base; a
    handler's request reads the state of the Starlette request it wraps."""
    queue = parts["Queue"]
    assert isinstance(queue, Queue) and inspect.iscoroutinefunction(queue.push)
    assert list(inspect.signature(queue.push).parameters) == ["body", "request", "username"]
    refused = run_coroutine(queue.push(PredictBodyInternal(data=[], fn_index=None), None, None))
    assert refused == (False, "No function index provided.", "error")  # the answer /queue/join turns into a 400
    assert isinstance(queue.event_queue_per_concurrency_id, dict) and isinstance(queue.active_jobs, list)
    assert isinstance(queue.event_ids_to_events, dict) and isinstance(queue.process_time_per_fn, dict)
    assert list(inspect.signature(queue.process_events).parameters) == ["events", "batch", "begin_time", "fn"]
    assert inspect.iscoroutinefunction(queue.process_events)
    assert parts["EventQueue"].queue == []
    event, fn = parts["Event"], parts["BlockFunction"]
    assert (event.session_hash, event.fn, event.concurrency_id) == ("session", fn, "group")
    assert fn.name == "<lambda>" and isinstance(fn._id, int)
    body = parts["PredictBodyInternal"]
    assert (body.fn_index, body.session_hash, body.data) == (fn._id, "session", [1])
    assert list(inspect.signature(processing_utils.save_file_to_cache).parameters) == ["file_path", "cache_dir"]
    assert route_utils.API_PREFIX == "/gradio_api"
    assert guards.waiting_events(parts["Blocks"], "group") == [] == guards.queued_events(parts["Blocks"], "group")
    assert controls.CheckedNumber(render=False).get_block_name() == "number"
    assert controls.CheckedSlider(render=False).get_block_name() == "slider"
    assert parts["Request"].state.who == "t:1"


def test_gradio_is_pinned_to_the_minor_versions_these_tests_passed_on():
    """requirements.txt and the app extra (pyproject.toml) give Gradio one range, bounded above, which holds the
    installed version (the one these tests ran on)."""
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet

    from tests.small_models import REPO_ROOT

    pins = [re.findall(r"gradio\[mcp\]([^\"#\s]+)", (REPO_ROOT / name).read_text())
            for name in ("requirements.txt", "pyproject.toml")]
    assert len(pins[0]) == len(pins[1]) == 1 and pins[0] == pins[1], pins
    specifier = SpecifierSet(pins[0][0])
    assert any(spec.operator == "<" for spec in specifier) and version("gradio") in specifier


def test_gradios_cache_is_in_the_work_dir_from_the_moment_gradio_is_imported(tmp_path):
    """app.py imports app_limits, which sets GRADIO_TEMP_DIR, before Gradio, whose MCP module reads it at import (an
    image sent to an MCP tool went to $TMPDIR/gradio, outside the counted work dir)."""
    import os
    import subprocess
    import sys

    from tests.small_models import REPO_ROOT

    env = {name: value for name, value in os.environ.items() if name != "GRADIO_TEMP_DIR"} | {"TMPDIR": str(tmp_path)}
    shown = subprocess.run([sys.executable, "-c", "import app, gradio.mcp; print(app.limits.RUN_DIR_NAME, "
                            "gradio.mcp.DEFAULT_TEMP_DIR)"],
                           cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True).stdout.split()[-2:]
    assert shown[0].startswith("run-") and shown[1] == str(tmp_path / "convnn-explorer" / shown[0] / "gradio")
