"""How much one request may bring: an ASGI middleware in front of the app (:class:`RequestSizeLimit`).

It refuses a request body larger than a limit from its declared length, before any of it is read or stored: a
server's per-file upload limit does not bound a request of many files. On the upload routes it also holds the
body's length in the workspace's byte bound (:class:`analysis.Workspace`) while the request runs, and refuses the
request (507) when the bound has no room for it; once stored, what the upload added on disk stays charged, read from
the paths the route answers (Gradio's ``/upload`` answers the JSON list of the files it stored). A page load whose
link is longer than the explorer's links can be is sent to the page without it. Plain ASGI: no Gradio attribute is
read here.
"""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Callable, Iterable
from urllib.parse import urlencode

from analysis import LINK_TOO_LONG, MAX_LINK_BYTES, Workspace

from .visitors import address, visitor

__all__ = ["MAX_URL_BYTES", "UPLOAD_IDLE_S", "UPLOAD_MIN_BYTES_PER_S", "RequestSizeLimit"]

MAX_URL_BYTES = 16 * 1024  # a request's path and query string, at most (a page's link: analysis.MAX_LINK_BYTES;
#                            Gradio's own routes far less; past 64 KB Gradio's request handling raised
#                            httpx.InvalidURL: a bare 500; uvicorn reads at most 16 KB of a request's head)

UPLOAD_IDLE_S = 20.0  # an upload whose body stops arriving for this long is dropped, and its room let go
UPLOAD_MIN_BYTES_PER_S = 128 * 1024  # … and one slower than this on average, after UPLOAD_IDLE_S of grace


class RequestSizeLimit:
    """ASGI middleware: a request whose path and query string are longer than :data:`MAX_URL_BYTES` is answered 414
    with a short page, before the application sees it; a request whose body is larger than ``max_bytes`` is
    answered 413 from its declared ``Content-Length``, and one with a body of undeclared length (chunked) 411,
    before any of the body is read.

    A GET of one of ``page_paths`` whose query string (the page's link) is longer than
    :data:`analysis.MAX_LINK_BYTES` is answered 303, to the same page with only :data:`analysis.LINK_TOO_LONG` (its
    length) in its query string, whose note says the link was too long to read: the page sends its query string
    again with each request it makes (Gradio's client re-encodes it, a comma as ``%2C``, and the browser sends the
    page's address as the Referer), and those requests, refused past :data:`MAX_URL_BYTES` or uvicorn's 16 KB, left
    the page with a bare error.

    A request to one of ``upload_paths`` first holds its body's length in ``workspace``'s byte bound, in its
    visitor's share and in its address's ceiling (:meth:`Workspace.reserve`, :func:`server.visitor`,
    :func:`server.address`: :class:`server.Visitors` must run before this) until it is answered, and is answered
    507 with the workspace's message when one has no room for it: uploads beyond them are refused before they are
    stored. An upload answered 200 stays charged to its visitor (Gradio keeps the files) by what it added on disk:
    the files its answer names (a JSON list of paths), each once, so a file Gradio already held (identical contents
    are kept once) adds nothing; an answer that names none is charged its declared length, and an upload that fails
    is charged the bytes that arrived (Gradio's cache keeps a part not named ``files`` and a body cut off).
    One that meets a full disk is answered 507 with a message. Its body must then keep
    arriving: after :data:`UPLOAD_IDLE_S` without a byte, or past ``UPLOAD_IDLE_S + length /``
    :data:`UPLOAD_MIN_BYTES_PER_S` in all, the application is told the client left (``http.disconnect``) and the
    room is let go, so connections that declare a large body and send none cannot hold the bound for everyone.

    Args:
        app: the ASGI application it wraps.
        max_bytes (int): the largest body a request may carry, in bytes.
        workspace (Workspace, optional): whose byte bound the uploads count against. Default: None (no check)
        upload_paths (Iterable[str]): the request paths that store their body (Gradio's ``/gradio_api/upload``).
            Default: none
        page_paths (Iterable[str]): the request paths that serve the page (Gradio's ``/``). Default: none
    """

    def __init__(self, app: Callable, max_bytes: int, workspace: Workspace | None = None,
                 upload_paths: Iterable[str] = (), page_paths: Iterable[str] = ()) -> None:
        self.app = app
        self.max_bytes = int(max_bytes)
        self.workspace = workspace
        self.upload_paths = frozenset(upload_paths)
        self.page_paths = frozenset(page_paths)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        release = None
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            length = headers.get(b"content-length")
            refusal = None
            query_bytes = len(scope.get("query_string", b""))
            url_bytes = len(scope.get("raw_path") or scope["path"].encode()) + query_bytes
            if url_bytes > MAX_URL_BYTES:
                refusal = 414, (f"this address is too long ({url_bytes:,} bytes; the server reads at most "
                                f"{MAX_URL_BYTES:,}): a link to the explorer is far shorter, so check where it came "
                                "from")
            elif scope["method"] == "GET" and scope["path"] in self.page_paths and query_bytes > MAX_LINK_BYTES:
                refusal = 303, (f"this link is too long to read ({query_bytes:,} bytes; a link to the explorer is at "
                                f"most {MAX_LINK_BYTES:,}): the page opens without it"), [
                    (b"location", f"?{urlencode({LINK_TOO_LONG: query_bytes})}".encode())]
            elif length is None and b"transfer-encoding" in headers:
                refusal = 411, "a request body must declare its length (Content-Length)"
            elif length is not None and (not length.isdigit() or int(length) > self.max_bytes):
                refusal = 413, (f"one request may carry at most {self.max_bytes / 2**20:g} MB ({self.max_bytes} "
                                f"bytes); this one declares {length.decode(errors='replace')} bytes")
            elif length is not None and self.workspace is not None and scope["path"] in self.upload_paths:
                try:
                    release = await asyncio.to_thread(self.workspace.reserve, int(length), visitor(scope),
                                                    address(scope))
                except ValueError as err:
                    refusal = 507, str(err)
            if refusal is not None:
                await _answer(send, *refusal)
                return
        if release is None:
            await self.app(scope, receive, send)
            return
        arrival, started, answer = _Arrival(receive, int(length)), [], []

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                started.append(message["status"])
            elif message["type"] == "http.response.body":
                answer.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, arrival.receive, sending)
        except Exception as err:
            if started:
                raise
            if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
                await _answer(send, 507, "the server's disk is full: the upload was not stored; try again later")
            elif arrival.dropped:
                await _answer(send, 408, f"the upload's body stopped arriving (nothing for {UPLOAD_IDLE_S:g} s, or "
                                         f"slower than {UPLOAD_MIN_BYTES_PER_S // 1024} KB/s): send it again")
            else:
                raise
        finally:
            # Charged in every case: what arrived may stay in Gradio's cache (a part not named "files", a body
            # cut off): a 200 the files it names (else its declared length), any other answer the bytes that arrived.
            stored = started[:1] == [200]
            release(True, _stored_files(b"".join(answer)) if stored else None, None if stored else arrival.received)


def _stored_files(answer: bytes) -> list[str] | None:
    """The paths an upload's answer names (a JSON list of strings), or None if it names none that way."""
    try:
        files = json.loads(answer)
    except ValueError:
        return None
    return files if isinstance(files, list) and all(isinstance(path, str) for path in files) else None


async def _answer(send: Callable, status: int, text: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """Answer an HTTP request with ``status``, the plain ``text`` and ``headers``, and close the connection."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": text.encode()})


class _Arrival:
    """``receive`` of a request body of ``length`` bytes that must keep arriving (:class:`RequestSizeLimit`): a
    wait past its deadlines returns ``http.disconnect`` instead of a body chunk, and ``dropped`` says so. Once the
    body is in, ``receive`` as it was. ``received``: the body bytes handed on."""

    def __init__(self, receive: Callable, length: int) -> None:
        self._receive = receive
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time() + UPLOAD_IDLE_S + length / UPLOAD_MIN_BYTES_PER_S
        self._in = False
        self.dropped = False
        self.received = 0  # body bytes handed on so far

    async def receive(self) -> dict:
        if self._in:
            return self._count(await self._receive())
        if self.dropped:
            return {"type": "http.disconnect"}
        wait = max(0.0, min(UPLOAD_IDLE_S, self._deadline - self._loop.time()))
        try:
            message = await asyncio.wait_for(self._receive(), wait)
        except TimeoutError:
            self.dropped = True
            return {"type": "http.disconnect"}
        self._in = message["type"] != "http.request" or not message.get("more_body", False)
        return self._count(message)

    def _count(self, message: dict) -> dict:
        self.received += len(message.get("body", b"")) if message["type"] == "http.request" else 0
        return message
