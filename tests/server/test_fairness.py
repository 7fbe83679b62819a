"""Fair turns between visitors in an event group (server.FairTurns): one visitor's many requests do not delay
another's first, a visitor's waiting places are bounded, and what a run took is charged to its visitor."""

from __future__ import annotations

import json

import gradio as gr
import pytest
from gradio.data_classes import PredictBodyInternal
from starlette.requests import Request

from server import FairTurns, QueueDoor, Visitors, visitor
from tests.loops import run_coroutine


def request_from(address: str, minted: bool = False) -> Request:
    """A join request from ``address`` as :class:`server.Visitors` placed it: with no token minted, its visitor is
    ``"a:<address>"``; ``minted``: a new visitor with a token of its own (a client without cookies)."""
    scopes = []

    async def app(scope, receive, send):
        scopes.append(scope)

    scope = {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "headers": [], "query_string": b"",
             "client": (address, 5000)}
    async def send(message):
        pass
    run_coroutine(Visitors(app, mint_burst=int(minted), mint_per_hour=0)(scope, None, send))
    return Request(scopes[0])


@pytest.fixture
def turns():
    """An app whose one event runs one at a time, its queue not started (what is pushed stays waiting), with
    fair turns of at most 10 waiting events a visitor and 15 an address."""
    with gr.Blocks() as demo:
        box = gr.Number(elem_id="box")
        box.change(lambda value: value, box, box, concurrency_id="group", concurrency_limit=1)
        cancel = gr.Button(elem_id="cancel").click(lambda: None, None, None, concurrency_id="group")
    demo.queue(max_size=100)
    fn = next(iter(demo.fns.values()))
    turns = FairTurns(demo, max_waiting=10, max_waiting_at_address=15, always=[cancel])

    def push(address: str, label: int, minted: bool = False, fn_index=fn._id):
        data = [label] if fn_index == fn._id else []
        body = PredictBodyInternal(data=data, fn_index=fn_index, session_hash=f"{address}-{label}")
        return run_coroutine(demo._queue.push(body, request_from(address, minted), None))
    push.box, push.cancel = fn._id, cancel["id"]
    return turns, push, demo._queue


def waiting(queue) -> list[tuple[str, int]]:
    events = queue.event_queue_per_concurrency_id["group"].queue
    return [(event.request.client[0], event.data.data[0]) for event in events if event.data.data]


def test_a_visitor_s_first_request_waits_behind_one_turn_of_each_other_visitor(turns):
    turns, push, queue = turns
    for label in range(10):
        assert push("10.0.0.1", label)[0]
    assert push("10.0.0.2", 0)[0] and push("10.0.0.3", 0)[0]
    order = waiting(queue)
    # estimated costs are equal (no run measured yet): A's first, then B's and C's first, then A's others in turn
    assert order[:4] == [("10.0.0.1", 0), ("10.0.0.2", 0), ("10.0.0.3", 0), ("10.0.0.1", 1)]
    assert [label for address, label in order if address == "10.0.0.1"] == list(range(10))  # a visitor's own order
    refused = push("10.0.0.1", 10)  # A's 11th waiting request
    assert refused == (False, "You have 10 requests waiting already: they are answered first. Ask again once they "
                              "are.", "error")
    assert push("10.0.0.2", 1)[0]  # B has room


def test_a_visitor_is_charged_what_its_runs_took(turns):
    turns, push, queue = turns
    assert push("10.0.0.1", 0)[0] and push("10.0.0.2", 0)[0]
    first = queue.event_queue_per_concurrency_id["group"].queue.pop(0)  # A's first starts …
    clock = iter([100.0, 105.0])  # … and runs 5 s, 4.9 s beyond its estimate of 0.1 s
    turns.clock = lambda: next(clock)

    async def run(*args):
        return None
    turns._process = run
    run_coroutine(turns.process_events([first], False, 0.0, first.fn))
    assert turns.finish["group"][("a", "10.0.0.1")] == pytest.approx(5.0)  # its start 0 + 0.1 + 4.9, its address's
    assert turns.finish["group"][("v", "10.0.0.1", "a:10.0.0.1")] == pytest.approx(5.0)  # and its own
    for label in (1, 2, 3):
        assert push("10.0.0.1", label)[0]
    for label in (1, 2, 3):
        assert push("10.0.0.2", label)[0]
    # B's four runs (0.1 s each, estimated) come before A's next: A has had 5 s of the group
    assert waiting(queue) == [("10.0.0.2", 0), ("10.0.0.2", 1), ("10.0.0.2", 2), ("10.0.0.2", 3),
                              ("10.0.0.1", 1), ("10.0.0.1", 2), ("10.0.0.1", 3)]


def test_visitors_minted_at_one_address_share_its_places(turns):
    """A client without cookies gets a new token, a new visitor, per request: its places are bounded by its
    address's, while another address still gets in."""
    turns, push, queue = turns
    assert all(push("10.0.0.9", label, minted=True)[0] for label in range(15))  # 15 visitors, one address
    assert len({visitor(event.request) for event in queue.event_queue_per_concurrency_id["group"].queue}) == 15
    assert push("10.0.0.9", 15, minted=True) == (False, "15 requests from your network are waiting already: they "
                                                        "are answered first. Ask again in a moment.", "error")
    assert push("10.0.0.10", 0)[0]


def test_tokens_minted_at_one_address_take_that_address_s_turns(turns):
    """150 tokens minted at one address, one request each, made another address's single request wait behind all
    of them (35 s): turns go to addresses first, then to an address's visitors."""
    turns, push, queue = turns
    assert all(push("10.0.0.9", label, minted=True)[0] for label in range(12))  # 12 visitors at one address
    assert push("10.0.0.2", 0)[0]
    assert waiting(queue)[:3] == [("10.0.0.9", 0), ("10.0.0.2", 0), ("10.0.0.9", 1)]
    # and inside one address, a visitor's many requests do not delay another visitor's first
    for label in range(5):
        assert push("10.0.0.20", label)[0]  # one visitor (no token) at 10.0.0.20 …
    assert push("10.0.0.20", 99, minted=True)[0]  # … and a second visitor there
    mine = [label for address, label in waiting(queue) if address == "10.0.0.20"]
    assert mine[:3] == [0, 99, 1]


def test_a_refused_visitor_is_refused_at_the_door_until_one_of_its_events_starts(turns):
    """A client that keeps sending joins past its waiting places gets the refusal from :class:`server.QueueDoor`
    before Gradio reads them, while other visitors get in; its door opens when one of its events starts."""
    turns, push, queue = turns
    for label in range(10):
        assert push("10.0.0.1", label)[0]
    refused = push("10.0.0.1", 10)
    assert not refused[0]
    hostile = queue.event_queue_per_concurrency_id["group"].queue[0].request
    answers, reads = [], []

    async def app(scope, receive, send):
        answers.append("app")

    async def receive():
        reads.append("body")
        return {"type": "http.request", "body": b"{}"}

    async def send(message):
        answers.append(message)

    door = QueueDoor(app, turns)

    def join(request, path="/gradio_api/queue/join"):
        answers.clear()
        run_coroutine(door({**request.scope, "method": "POST", "path": path}, receive, send))
        return answers

    answer = join(hostile)
    assert answer[0]["status"] == 429 and json.loads(answer[1]["body"]) == {"detail": refused[1]} and not reads
    assert join(hostile, "/gradio_api/upload") == ["app"]  # only joins
    assert join(request_from("10.0.0.2")) == ["app"]  # another visitor gets in
    first = queue.event_queue_per_concurrency_id["group"].queue.pop(0)

    async def run(*args):
        return None
    turns._process = run
    run_coroutine(turns.process_events([first], False, 0.0, first.fn))  # one of its events starts
    assert join(hostile) == ["app"]
    assert push("10.0.0.1", 11)[0] and not push("10.0.0.1", 12)[0]  # its place taken again, and full
    assert turns.at_door("a:10.0.0.1", "10.0.0.1") is not None
    turns.closed = {key: (0.0, message) for key, (until, message) in turns.closed.items()}  # DOOR_S later
    assert turns.at_door("a:10.0.0.1", "10.0.0.1") is None


def test_a_visitor_whose_places_are_full_still_gets_its_cancel_in(turns):
    """The class bench's hostile visitor kept its 16 waiting places full, so its Cancel was refused, here and at the
    door, and its occlusion of a heavy model kept a slow place to its end. A handler named ``always`` (the Cancel,
    the drops of a slow run) is never refused; any other join of that visitor still is, at the door before its body
    is read when the body is longer than a Cancel's."""
    turns, push, queue = turns
    for label in range(10):
        assert push("10.0.0.1", label)[0]
    assert not push("10.0.0.1", 10)[0]  # full: refused, and its door closed
    assert push("10.0.0.1", 11, fn_index=push.cancel)[0]  # its Cancel gets in
    hostile = queue.event_queue_per_concurrency_id["group"].queue[0].request
    answers, bodies = [], []

    async def app(scope, receive, send):
        answers.append("app")
        bodies.append((await receive())["body"])

    async def send(message):
        answers.append(message)

    def join(fn_index, padding=0):
        body = json.dumps({"data": [], "fn_index": fn_index, "session_hash": "s", "pad": "x" * padding}).encode()
        read = []

        async def receive():
            read.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        answers.clear()
        bodies.clear()
        headers = [(b"content-length", str(len(body)).encode())]
        run_coroutine(QueueDoor(app, turns)({**hostile.scope, "method": "POST", "path": "/gradio_api/queue/join",
                                             "headers": headers}, receive, send))
        return answers, bodies, len(read)

    answers, bodies, reads = join(push.cancel)
    assert answers == ["app"] and bodies == [json.dumps({"data": [], "fn_index": push.cancel,
                                                          "session_hash": "s", "pad": ""}).encode()]  # replayed whole
    answers, _, reads = join(push.box)
    assert answers[0]["status"] == 429 and reads == 1  # another handler: refused (a small body is read)
    answers, _, reads = join(push.cancel, padding=5000)
    assert answers[0]["status"] == 429 and reads == 0  # longer than a Cancel's: refused unread
