"""One browser tab of the explorer, driven over HTTP as the page drives it (for ``bench/class_load.py``).

The page is Gradio's: it fetches ``/config`` (components with their values, and the dependencies: which event of which
component runs which function on which inputs, and which run after which), then, for each user event, posts the
inputs' current values to ``/gradio_api/queue/join`` with the dependency's ``fn_index`` and reads the answers from its
session's event stream (``/gradio_api/queue/data``); when one finishes it applies the outputs to its values and runs
the dependencies chained after it (``.then`` always, ``.success`` / ``.failure`` by the outcome). :class:`Page` does
exactly that for the dependencies that run on the server (``backend_fn``); the page's own JavaScript steps (``js``
only) send nothing and are skipped. It also holds the heartbeat stream the page holds
(``/gradio_api/heartbeat/<session>``) and uploads files as the page does (``/gradio_api/upload``).

Each :class:`Page` uses the ``httpx.Client`` it is given: its cookies and headers (``X-Forwarded-For``) are the
visitor's. These are the page's private events (``api_visibility="private"``), which ``gradio_client`` refuses to
call; the server answers them as it answers the page.
"""

from __future__ import annotations

import contextlib
import json
import mimetypes
import re
import secrets
import threading
import time
from dataclasses import dataclass, field

import httpx

__all__ = ["Chain", "Page", "Refused"]

API = "gradio_api"
WAIT_S = 600  # longest wait for one event's answer before the step counts as refused (a lost answer)


class Refused(Exception):
    """The server refused a request: an HTTP error status (queue full: 503), or an event that ended in an error."""


@dataclass
class Step:
    """One dependency run: its function's name, when its answer came (``time.perf_counter``), and the refusal if
    any (the join refused, an error message, or no answer in time)."""

    name: str
    end: float
    refused: str = ""
    taken: bool = True  # the server queued it (False: the join itself was refused, e.g. "Queue is full")
    gave_up: bool = False  # no answer came in time: the visitor stopped waiting

    @property
    def fn(self) -> str:
        """The handler's name: Gradio numbers a function wired more than once (on_table_3 is on_table)."""
        return re.sub(r"_\d+$", "", self.name)


@dataclass
class Chain:
    """What one user event ran on the server: its steps in order, from ``start`` (``time.perf_counter``)."""

    start: float
    steps: list[Step] = field(default_factory=list)
    end: float = 0.0

    @property
    def refused(self) -> str:
        """The first refusal among the steps ("" when none)."""
        return next((step.refused for step in self.steps if step.refused), "")

    @property
    def gave_up(self) -> bool:
        return any(step.gave_up for step in self.steps)

    def until(self, fn: str) -> float | None:
        """Seconds from the chain's start to the answer of its first step running the handler ``fn`` (the step
        that shows the user's answer), or None when no such step ran or it was refused."""
        step = next((step for step in self.steps if step.fn == fn), None)
        return None if step is None or step.refused else step.end - self.start


class _EventStream:
    """A session's event stream, read by one thread while events are in flight (as the page reads it): answers are
    kept by event id until their waiter takes them; the stream is reopened while any event is still unanswered."""

    def __init__(self, http: httpx.Client, url: str, session_hash: str) -> None:
        self.http, self.url, self.session_hash = http, url, session_hash
        self.answers: dict[str, dict] = {}
        self.abandoned: set[str] = set()  # events whose waiter gave up: their late answer is dropped
        self.in_flight = 0  # joins posted or unanswered; the reader stops only at 0
        self.reading = False
        self.cond = threading.Condition()

    def join(self, body: dict) -> str:
        """Post ``body`` to the queue; its event id. Raises :class:`Refused` on an HTTP error (queue full: 503)."""
        with self.cond:
            self.in_flight += 1
            if not self.reading:
                self.reading = True
                threading.Thread(target=self._read, daemon=True).start()
        try:
            answer = self.http.post(f"{self.url}{API}/queue/join", json=body)
        except httpx.HTTPError as err:
            self._done()
            raise Refused(f"join: {type(err).__name__}: {err}") from err
        if answer.status_code != 200:
            self._done()
            raise Refused(f"{answer.status_code}: {_detail(answer)}")
        return answer.json()["event_id"]

    def wait(self, event_id: str, timeout: float = WAIT_S) -> dict:
        """The ``process_completed`` message of ``event_id``. Raises ``TimeoutError`` when none came in time."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while event_id not in self.answers:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.in_flight -= 1
                    self.abandoned.add(event_id)
                    raise TimeoutError(f"no answer within {timeout:.0f} s")
                self.cond.wait(left)
            return self.answers.pop(event_id)

    def _done(self) -> None:
        with self.cond:
            self.in_flight -= 1

    def _read(self) -> None:
        # No read timeout: closing the stream while an event is in flight makes the server drop the session's events
        # (it sends a heartbeat every few seconds anyway); a lost answer ends in wait()'s timeout.
        while True:
            with contextlib.suppress(httpx.HTTPError):
                with self.http.stream("GET", f"{self.url}{API}/queue/data", params={"session_hash": self.session_hash},
                                      timeout=httpx.Timeout(30, read=None)) as stream:
                    if stream.status_code == 200:
                        for line in stream.iter_lines():
                            if line.startswith("data:") and self._deliver(json.loads(line[5:])):
                                break
            with self.cond:
                if self.in_flight <= 0:
                    self.reading = False
                    return
            time.sleep(0.05)  # a join not yet queued (404), or a stream closed with events still coming

    def _deliver(self, message: dict) -> bool:
        """Keep a completed event's message for its waiter; True when the server closed the stream."""
        kind = message.get("msg")
        if kind == "process_completed" or (kind == "unexpected_error" and message.get("event_id")):
            with self.cond:
                if message["event_id"] in self.abandoned:
                    self.abandoned.discard(message["event_id"])
                else:
                    self.answers[message["event_id"]] = message
                    self.in_flight -= 1
                self.cond.notify_all()
        return kind == "close_stream"


def _detail(answer: httpx.Response) -> str:
    try:
        return str(answer.json().get("detail", answer.text))[:300]
    except ValueError:
        return answer.text[:300]


class Page:
    """One tab of the page at ``url``, as a browser holds it: the components' values, a session of its own.

    Args:
        url (str): the app's address, ending in ``/``.
        http (httpx.Client): the visitor's client (its cookies, its headers).
        config (dict): the page's ``/config``.
    """

    def __init__(self, url: str, http: httpx.Client, config: dict) -> None:
        self.url, self.http = url, http
        self.session_hash = secrets.token_hex(6)
        components = config["components"]
        self.values = {item["id"]: item.get("props", {}).get("value") for item in components}
        self.stateful = {item["id"] for item in components if item["type"] == "state"}
        self.ids = {item["props"]["elem_id"]: item["id"] for item in components if item.get("props", {}).get("elem_id")}
        self.ids |= {f"tab:{item['props']['id']}": item["id"] for item in components
                     if item["type"] == "tabitem" and item.get("props", {}).get("id") is not None}
        self.dependencies = [dep for dep in config["dependencies"] if dep["backend_fn"]]
        self.stream = _EventStream(http, url, self.session_hash)
        self.heartbeat: httpx.Response | None = None
        if config.get("connect_heartbeat"):
            threading.Thread(target=self._hold_heartbeat, daemon=True).start()

    @classmethod
    def open(cls, url: str, http: httpx.Client) -> Page:
        """Load the page (its HTML, then its config), as a browser opening ``url`` does; nothing is run yet (the
        page's load event is :meth:`fire` ``(None, "load")``). Raises :class:`Refused` on an HTTP error."""
        for path in ("", "config"):
            answer = http.get(f"{url}{path}")
            if answer.status_code != 200:
                raise Refused(f"GET /{path}: {answer.status_code}: {answer.text[:200]}")
        return cls(url, http, answer.json())

    def close(self) -> None:
        """Leave the page: its heartbeat stream ends (the server then ends the session)."""
        if self.heartbeat is not None:
            with contextlib.suppress(Exception):
                self.heartbeat.close()

    def _hold_heartbeat(self) -> None:
        with contextlib.suppress(httpx.HTTPError, RuntimeError):
            with self.http.stream("GET", f"{self.url}{API}/heartbeat/{self.session_hash}",
                                  timeout=httpx.Timeout(30, read=None)) as stream:
                self.heartbeat = stream
                for _ in stream.iter_bytes():
                    pass

    # -- the page's values --------------------------------------------------------------------------------------------
    def value(self, elem_id: str):
        return self.values[self.ids[elem_id]]

    def set(self, elem_id: str, value) -> None:
        """What typing, picking or clicking in a control does to its value, before its event fires."""
        self.values[self.ids[elem_id]] = value

    def upload(self, elem_id: str, files: list[tuple[str, bytes]], multiple: bool = False) -> None:
        """Upload ``files`` (name, bytes) as the page does, then make them the value of ``elem_id`` (one file, or a
        list with ``multiple``). Raises :class:`Refused` when the server refuses the upload (413, 507, …)."""
        parts = [("files", (name, data, mimetypes.guess_type(name)[0] or "application/octet-stream"))
                 for name, data in files]
        try:
            answer = self.http.post(f"{self.url}{API}/upload", params={"upload_id": secrets.token_hex(5)},
                                    files=parts)
        except httpx.HTTPError as err:
            raise Refused(f"upload: {type(err).__name__}: {err}") from err
        if answer.status_code != 200:
            raise Refused(f"upload {answer.status_code}: {_detail(answer)}")
        data = [{"path": path, "orig_name": name, "size": len(body), "url": f"{self.url}{API}/file={path}",
                 "mime_type": mimetypes.guess_type(name)[0], "meta": {"_type": "gradio.FileData"}}
                for path, (name, body) in zip(answer.json(), files, strict=True)]
        self.set(elem_id, data if multiple else data[0])

    # -- events ---------------------------------------------------------------------------------------------------
    def fire(self, elem_id: str | None, trigger: str, event_data=None, timeout: float = WAIT_S) -> Chain:
        """The user's event ``trigger`` on the component ``elem_id`` (None: the page itself, ``"load"``; a tab:
        ``"tab:<its id>"``): each dependency it triggers, then each chained after those, in order, as the page runs
        them. A refused join ends the chain there (the page shows the error), and so does waiting past ``timeout``
        seconds from the chain's start (the visitor gives up)."""
        target = 0 if elem_id is None else self.ids[elem_id]  # the page's own events (load) target id 0
        chain = Chain(time.perf_counter())
        pending = self._triggered(target, trigger)
        data = event_data
        while pending:
            dep = pending.pop(0)
            before = {index: self.values.get(index) for index in dep["outputs"]}
            step = self._run(dep, target, data, chain.start + timeout - time.perf_counter())
            chain.steps.append(step)
            if not step.taken or step.gave_up:
                break  # the server did not take the event, or the visitor stopped waiting: nothing follows
            data = None
            pending += [after for after in self.dependencies if after["trigger_after"] == dep["id"]
                        and not (after["trigger_only_on_success"] and step.refused)
                        and not (after["trigger_only_on_failure"] and not step.refused)]
            for index, old in before.items():  # an output whose value changed fires its .change, as in the page
                if self.values.get(index) != old:
                    pending += self._triggered(index, "change")
        chain.end = time.perf_counter()
        return chain

    def _triggered(self, target: int, trigger: str) -> list[dict]:
        return [dep for dep in self.dependencies if [target, trigger] in dep["targets"]]

    def call(self, api_name: str, data: list, timeout: float = WAIT_S) -> Step:
        """One call of the documented API's ``/api_name`` in this page's session (its uploads are this session's),
        with ``data`` its inputs in order: what a script sharing the page's session sends."""
        dep = next(dep for dep in self.dependencies if dep.get("api_name") == api_name)
        return self._run(dep, None, None, timeout, data)

    def _run(self, dep: dict, trigger_id: int | None, event_data, timeout: float, data: list | None = None) -> Step:
        if data is None:
            data = [None if index in self.stateful else self.values.get(index) for index in dep["inputs"]]
        body = {"data": data, "event_data": event_data, "fn_index": dep["id"], "trigger_id": trigger_id,
                "session_hash": self.session_hash}
        name = dep.get("api_name") or str(dep["id"])
        try:
            event_id = self.stream.join(body)
        except Refused as err:
            return Step(name, time.perf_counter(), str(err), taken=False)
        try:
            message = self.stream.wait(event_id, max(timeout, 0.0))
        except TimeoutError as err:
            return Step(name, time.perf_counter(), str(err), gave_up=True)
        end = time.perf_counter()
        output = message.get("output") or {}
        if message.get("msg") != "process_completed" or not message.get("success"):
            error = output.get("error") or message.get("message") or "error"
            return Step(name, end, f"error: {str(error)[:300]}")
        for index, value in zip(dep["outputs"], output.get("data") or [], strict=False):
            if isinstance(value, dict) and value.get("__type__") == "update":
                if "value" in value:
                    self.values[index] = value["value"]
            elif index not in self.stateful:
                self.values[index] = value
        return Step(name, end)
