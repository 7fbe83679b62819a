"""The request size limit in front of the app (server/requests.py)."""

from __future__ import annotations

import asyncio
import errno
import functools

from analysis import Workspace
from server import requests
from server.requests import RequestSizeLimit
from server.visitors import VISITOR_COOKIE, Visitors
from tests.loops import run_coroutine


def respond(middleware: RequestSizeLimit, headers: dict[bytes, bytes], path: str = "/gradio_api/upload",
            client: str = "10.0.0.1", status: int = 200, error: Exception | None = None, mint_burst: int = 0
            ) -> list[dict]:
    """What ``middleware`` sends for a POST to ``path`` with ``headers`` from ``client`` (the app behind it answers
    ``status``, or raises ``error``, and reads nothing), behind :class:`server.Visitors` as served: with no token,
    the request's visitor is a new one while ``mint_burst`` allows, else ``"a:<client>"`` (by default)."""
    sent = []

    async def app(scope, receive, send):
        if error is not None:
            raise error
        await send({"type": "http.response.start", "status": status, "headers": []})

    async def receive():
        raise AssertionError("the body was read")

    async def send(message):
        sent.append(message)

    middleware.app = app
    scope = {"type": "http", "method": "POST", "path": path, "headers": list(headers.items()), "client": (client, 5000)}
    run_coroutine(Visitors(middleware, mint_burst=mint_burst, mint_per_hour=0)(scope, receive, send))
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
    workspace = Workspace(tmp_path / "work", max_bytes=1000, max_age_s=60, share_bytes=5000)
    limit = RequestSizeLimit(None, max_bytes=10_000, workspace=workspace, upload_paths=["/gradio_api/upload"])
    assert respond(limit, {b"content-length": b"1000"}, status=400)[0]["status"] == 400
    assert workspace.used_bytes() == 0  # a failed one is charged what arrived of it (nothing, here)
    assert respond(limit, {b"content-length": b"1000"})[0]["status"] == 200
    assert workspace.used_bytes() == 1000  # a stored one's stays counted
    workspace.sweep()  # … until a sweep counts what Gradio stored (nothing, here)
    refused = respond(limit, {b"content-length": b"1001"}, client="10.0.0.2")
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
    workspace = Workspace(tmp_path / "work", max_bytes=3000, max_age_s=60)
    limit = RequestSizeLimit(None, max_bytes=10_000, workspace=workspace, upload_paths=["/gradio_api/upload"])
    assert _upload(limit, 1000, [(0.0, 400), (0.05, 600)]) == [400, 600, 200]  # a body that arrives: stored
    assert _upload(limit, 1000, [(0.0, 400)]) == [400, "left", 408]  # then silence: dropped after 0.5 s
    assert _upload(limit, 1000, [(0.4, 1)] * 5) == [1, 1, 1, "left", 408]  # a byte every 0.4 s: dropped at 1.5 s
    assert workspace.used_bytes() == 1000 + 400 + 3  # the dropped ones are charged what arrived (Gradio keeps it)
    workspace.sweep()  # (nothing on disk here)
    workspace.reserve(1500)()  # the dropped uploads' room was let go (what arrived stays charged to the visitor)


def test_an_upload_past_its_visitors_share_is_refused_and_another_visitors_is_not(tmp_path):
    """One anonymous client filled the shared 2 GB bound in ≈ 2 s (5 × 95 MiB); then everyone's uploads got 507."""
    workspace = Workspace(tmp_path / "work", max_bytes=10_000, max_age_s=60, share_bytes=1000)
    limit = RequestSizeLimit(None, max_bytes=10_000, workspace=workspace, upload_paths=["/gradio_api/upload"])
    assert respond(limit, {b"content-length": b"900"}, client="10.0.0.66")[0]["status"] == 200
    refused = respond(limit, {b"content-length": b"101"}, client="10.0.0.66")
    assert refused[0]["status"] == 507 and refused[1]["body"].decode().startswith(
        "each visitor may keep at most 0.0 MB of uploads and exports on the server, and you hold 0.0 MB now")
    assert respond(limit, {b"content-length": b"1000"}, client="10.0.0.7")[0]["status"] == 200
    assert workspace.visitor_bytes("a:10.0.0.66") == 900 and workspace.visitor_bytes("a:10.0.0.7") == 1000


def test_uploads_past_their_addresss_ceiling_are_refused_and_another_addresss_are_not(tmp_path):
    """A share per visitor token alone: one address minting tokens would have a share per token. The visitors at
    one address have a ceiling together, well above one share."""
    workspace = Workspace(tmp_path / "work", max_bytes=10_000, max_age_s=60, share_bytes=1000, address_bytes=2500)
    limit = RequestSizeLimit(None, max_bytes=10_000, workspace=workspace, upload_paths=["/gradio_api/upload"])
    upload = functools.partial(respond, limit, client="10.0.0.66", mint_burst=1)  # each a new visitor (token)
    assert [upload({b"content-length": str(size).encode()})[0]["status"] for size in (1000, 1000, 500)] == [200] * 3
    refused = upload({b"content-length": b"1"})
    assert refused[0]["status"] == 507 and refused[1]["body"].decode().startswith(
        "the visitors at one network address may keep at most 0.0 MB of uploads and exports on the server together, "
        "and yours hold 0.0 MB now")
    assert respond(limit, {b"content-length": b"1000"}, client="10.0.0.7", mint_burst=1)[0]["status"] == 200
    assert workspace.used_bytes() == 3500


def test_an_upload_that_meets_a_full_disk_is_a_message_and_holds_nothing(tmp_path):
    """Disk full was a bare 500."""
    workspace = Workspace(tmp_path / "work", max_bytes=10_000, max_age_s=60)
    limit = RequestSizeLimit(None, max_bytes=10_000, workspace=workspace, upload_paths=["/gradio_api/upload"])
    full = respond(limit, {b"content-length": b"900"}, error=OSError(errno.ENOSPC, "No space left on device"))
    assert full[0]["status"] == 507
    assert full[1]["body"] == b"the server's disk is full: the upload was not stored; try again later"
    assert workspace.used_bytes() == 0 and workspace.visitor_bytes("a:10.0.0.1") == 0


def test_an_address_too_long_gets_a_short_page_before_gradio_sees_it():
    """A URL over 64 KB was a bare 500: httpx.InvalidURL ("URL too long") from Gradio's request handling."""
    import gradio as gr
    from starlette.middleware import Middleware

    with gr.Blocks() as demo:
        gr.Markdown("a page")
    app = gr.routes.App.create_app(demo, app_kwargs={"middleware": [Middleware(RequestSizeLimit, max_bytes=2**20)]})
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    def get(query: bytes, path: str = "/") -> tuple[int, bytes]:
        sent.clear()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": query,
                 "headers": [(b"host", b"127.0.0.1:7860")], "client": ("127.0.0.1", 5000),
                 "server": ("127.0.0.1", 7860)}
        run_coroutine(app(scope, receive, send))
        return sent[0]["status"], b"".join(message.get("body", b"") for message in sent[1:])

    status, page = get(b"a=1&" * 20_000)  # 80 KB
    assert status == 414
    assert page.decode() == ("this address is too long (80,001 bytes; the server reads at most 16,384): a link to "
                             "the explorer is far shorter, so check where it came from")
    assert get(b"model=cnn-l0&row=3", "/config")[0] == 200  # (the page itself needs a launched server)
    assert get(b"a=1&" * (requests.MAX_URL_BYTES // 4 - 2), "/config")[0] == 200  # at the bound: read


def test_an_upload_is_charged_what_it_adds_on_disk_and_a_file_gradio_holds_already_adds_nothing(tmp_path, monkeypatch):
    """Gradio keeps identical files once (a folder named by their hash), but each upload was charged its declared
    length: one visitor filled the 2 GB count with 178 MB on disk by uploading the same file again, and then every
    visitor's upload was refused."""
    import gradio as gr
    from starlette.middleware import Middleware
    from starlette.testclient import TestClient

    cache = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(cache))  # where Gradio's upload route stores (read as the app is made)
    workspace = Workspace(tmp_path / "work", max_bytes=10_000, max_age_s=60, counted=[cache], share_bytes=3000)
    with gr.Blocks() as demo:
        gr.File()
    demo.max_file_size = None  # what launch() sets
    app = gr.routes.App.create_app(demo, app_kwargs={"middleware": [
        Middleware(Visitors, mint_burst=10, mint_per_hour=10),
        Middleware(RequestSizeLimit, max_bytes=2**20, workspace=workspace, upload_paths=["/gradio_api/upload"])]})
    browsers = {name: TestClient(app, client=(name, 5000)) for name in ("10.0.0.66", "10.0.0.7")}  # own cookies

    def upload(browser: str, contents: bytes) -> tuple[int, str]:
        answer = browsers[browser].post("/gradio_api/upload", files={"files": ("photo.png", contents)})
        return answer.status_code, answer.text

    def charged(browser: str) -> int:  # the bytes charged to the visitor of the browser's token
        return workspace.visitor_bytes("t:" + browsers[browser].cookies[VISITOR_COOKIE].split(".")[0])

    for _ in range(5):  # 5 × ≈ 1,170 bytes declared: past the share of 3,000 if each were charged
        assert upload("10.0.0.66", b"x" * 1000)[0] == 200
    assert charged("10.0.0.66") == 1000 and workspace.used_bytes() == 1000
    assert upload("10.0.0.7", b"x" * 1000)[0] == 200  # another visitor's copy of it: on disk once, nothing added
    assert charged("10.0.0.7") == 0 and workspace.used_bytes() == 1000
    assert upload("10.0.0.66", b"y" * 1000)[0] == 200  # other contents: stored beside it
    assert charged("10.0.0.66") == 2000 and workspace.used_bytes() == 2000
    assert len(list(cache.glob("*/photo.png"))) == 2
    status, text = upload("10.0.0.66", b"z" * 1000)  # 1,171 declared > the 1,000 left of the share: refused unread
    assert status == 507 and text.startswith("each visitor may keep at most 0.0 MB of uploads and exports")
    assert len(list(cache.glob("*/photo.png"))) == 2
    workspace.sweep()  # the walk finds what was counted
    assert workspace.used_bytes() == 2000 and charged("10.0.0.66") == 2000
    # A part not named "files": Gradio answers [] but keeps what arrived in its cache; charged its declared length
    answer = browsers["10.0.0.7"].post("/gradio_api/upload", files={"notfiles": ("x", b"w" * 1000)})
    assert (answer.status_code, answer.json()) == (200, [])
    assert charged("10.0.0.7") == int(answer.request.headers["content-length"]) > 1000  # all of it arrived


def test_a_page_load_with_a_link_too_long_to_read_is_sent_to_the_page_without_it():
    """The page sends its link again with each request it makes, re-encoded by Gradio's client (URLSearchParams: a
    comma as %2C): a link of 15 KB passed the address bound, then every one of the page's requests was refused."""
    from urllib.parse import parse_qsl, urlencode

    from analysis import MAX_LINK_BYTES

    limit = RequestSizeLimit(None, max_bytes=2**20, page_paths=["/"])
    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    def get(path: str, query: bytes) -> tuple[int, dict]:
        sent.clear()
        limit.app = app
        scope = {"type": "http", "method": "GET", "path": path, "query_string": query, "headers": []}
        run_coroutine(limit(scope, None, send))
        return sent[0]["status"], dict(sent[0]["headers"])

    link = b"compare=" + b",".join([b"cnn-l0"] * 2200)  # 15,407 bytes
    status, headers = get("/", link)
    assert status == 303 and headers[b"location"] == b"?link_too_long=15407"
    assert get("/gradio_api/queue/join", link)[0] == 200  # not a page load: read as before (under 16 KB)
    longest = b"compare=" + b"," * (MAX_LINK_BYTES - 8)  # the longest link read, at its most re-encoded
    assert get("/", longest)[0] == 200
    resent = "/gradio_api/queue/join?" + urlencode(parse_qsl(longest.decode()))  # what the page sends with it
    assert len(resent) == 6_151 < requests.MAX_URL_BYTES // 2  # room for the Referer in uvicorn's 16 KB head
