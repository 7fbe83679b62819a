"""The request size limit in front of the app (server/requests.py)."""

from __future__ import annotations

import asyncio

from analysis import Workspace
from server import requests
from server.requests import RequestSizeLimit
from tests.loops import run_coroutine


def respond(middleware: RequestSizeLimit, headers: dict[bytes, bytes], path: str = "/gradio_api/upload"
            ) -> list[dict]:
    """What ``middleware`` sends for a POST to ``path`` with ``headers`` (the app behind it answers 200 and reads
    nothing)."""
    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        raise AssertionError("the body was read")

    async def send(message):
        sent.append(message)

    middleware.app = app
    scope = {"type": "http", "method": "POST", "path": path, "headers": list(headers.items())}
    run_coroutine(middleware(scope, receive, send))
    return sent


def test_a_request_body_over_the_limit_is_refused_from_its_declared_length():
    limit = RequestSizeLimit(None, max_bytes=3 * 2**20)
    assert respond(limit, {b"content-length": str(3 * 2**20).encode()})[0]["status"] == 200
    refused = respond(limit, {b"content-length": str(3 * 2**20 + 1).encode()})
    assert refused[0]["status"] == 413
    assert refused[1]["body"] == b"one request may carry at most 3 MB (3145728 bytes); this one declares 3145729 bytes"
    assert respond(limit, {b"transfer-encoding": b"chunked"})[0]["status"] == 411  # no length: none to check
    assert respond(limit, {b"content-length": b"-5"})[0]["status"] == 413
    assert respond(limit, {})[0]["status"] == 200  # no body (a GET)


def test_an_upload_past_the_workspace_bound_is_refused_before_it_is_read(tmp_path):
    workspace = Workspace(tmp_path / "work", max_bytes=1000, max_age_s=60)
    limit = RequestSizeLimit(None, max_bytes=10_000, workspace=workspace, upload_paths=["/gradio_api/upload"])
    assert respond(limit, {b"content-length": b"1000"})[0]["status"] == 200
    assert respond(limit, {b"content-length": b"1000"})[0]["status"] == 200  # its room was let go once answered
    refused = respond(limit, {b"content-length": b"1001"})
    assert refused[0]["status"] == 507
    assert refused[1]["body"].decode().startswith("the server keeps at most 0.0 MB of uploads and exports and holds")
    assert respond(limit, {b"content-length": b"1001"}, path="/gradio_api/queue/join")[0]["status"] == 200


def _upload(limit: RequestSizeLimit, length: int, chunks: list[tuple[float, int]]) -> list:
    """What the app behind ``limit`` sees of an upload declaring ``length`` bytes whose body comes as
    ``chunks`` ((seconds before it, bytes) each, then nothing): its body messages' sizes, then 'left' if told the
    client left (it raises then, as Starlette does), then the status the client is answered."""
    seen = []

    async def app(scope, receive, send):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                seen.append("left")
                raise RuntimeError("the client left")  # as Starlette's request.stream() raises ClientDisconnect
            seen.append(len(message["body"]))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})

    pending, sent = list(chunks), [0]

    async def receive():
        if not pending:
            await asyncio.sleep(3600)  # a client that declared more and sends nothing
        wait, size = pending.pop(0)
        await asyncio.sleep(wait)
        sent[0] += size
        return {"type": "http.request", "body": b"x" * size, "more_body": sent[0] < length}

    async def send(message):
        if message["type"] == "http.response.start":
            seen.append(message["status"])

    limit.app = app
    scope = {"type": "http", "method": "POST", "path": "/gradio_api/upload",
             "headers": [(b"content-length", str(length).encode())]}
    run_coroutine(limit(scope, receive, send))
    return seen


def test_an_upload_whose_body_stops_arriving_is_dropped_and_its_room_let_go(tmp_path, monkeypatch):
    """22 connections declaring 110 MB each and sending no byte held the 2 GB bound: every other upload got 507."""
    monkeypatch.setattr(requests, "UPLOAD_IDLE_S", 0.5)
    monkeypatch.setattr(requests, "UPLOAD_MIN_BYTES_PER_S", 1000)  # 1000 bytes: 0.5 + 1 s in all
    workspace = Workspace(tmp_path / "work", max_bytes=1000, max_age_s=60)
    limit = RequestSizeLimit(None, max_bytes=10_000, workspace=workspace, upload_paths=["/gradio_api/upload"])
    assert _upload(limit, 1000, [(0.0, 400), (0.05, 600)]) == [400, 600, 200]  # a body that arrives: answered
    assert _upload(limit, 1000, [(0.0, 400)]) == [400, "left", 408]  # then silence: dropped after 0.5 s
    assert _upload(limit, 1000, [(0.4, 1)] * 5) == [1, 1, 1, "left", 408]  # a byte every 0.4 s: dropped at 1.5 s
    workspace.reserve(1000)()  # the dropped uploads' room was let go: all of it is free again
