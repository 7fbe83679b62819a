"""Fair turns between visitors inside each event group of Gradio's queue (:class:`FairTurns`), and a bound on the
places one visitor holds in it.

Gradio's queue serves each concurrency group first come, first served: one visitor's ten heavy requests delayed
everyone's next one by all ten. Here each group's waiting events are kept in the order of start-time fair queueing:
an event gets a start tag ``S = max(V, F[visitor])`` when it joins, where ``V`` is the smallest tag still waiting
(the group's virtual time) and ``F[visitor]`` the visitor's finish tag, which then grows by the event's estimated
cost (Gradio's measured mean time of that handler) and, once it has run, by what its run cost beyond that estimate.
A visitor's first request thus waits behind at most one turn of each other visitor, whatever they queued, and a
visitor whose requests run long (a heavy uploaded model) gets fewer turns for the same time. Turns go to network
addresses first, the same way, and an address's turns to its visitors: a client that mints a token per request
(a new visitor each time, :class:`server.Visitors`) takes one address's turns, not one turn per token.

It reads and wraps parts of Gradio's queue outside its public API, listed in :data:`GRADIO_PRIVATE`
(``tests/server/test_gradio_private.py`` checks each on the installed Gradio).
"""

from __future__ import annotations

import json
import time
import weakref

import gradio as gr

from .visitors import address, visitor

__all__ = ["DOOR_S", "GRADIO_PRIVATE", "FairTurns", "QueueDoor"]

GRADIO_PRIVATE = {
    "Queue.push": "async push(body, request, username) → (queued, event id or message, status); FairTurns wraps it",
    "Queue.process_events": "async process_events(events, batch, begin_time, fn): runs started events; FairTurns "
                            "wraps it to charge each run's time",
    "Queue.event_ids_to_events": "event id → Event, for events queued or running",
    "Queue.event_queue_per_concurrency_id": "concurrency id → EventQueue: each group's waiting events",
    "Queue.process_time_per_fn": "BlockFunction → ProcessTime: each handler's measured mean time (avg_time, s)",
    "EventQueue.queue": "a group's waiting events; the queue starts the first one when the group has room",
    "Event.request": "the request that joined the queue (whose visitor it is)",
    "Event.concurrency_id": "the concurrency group an event runs in",
    "Event.fn": "the BlockFunction an event runs",
    "Event._id": "an event's id",
}

DEFAULT_COST_S = 0.1  # a handler's estimated time before Gradio has measured any run of it
DOOR_BODY_BYTES = 4096  # QueueDoor reads a refused visitor's join only up to this, for its handler (a Cancel's: ≈ 200)
DOOR_S = 1.0  # a visitor or address refused for its waiting events is refused at the door this long, or until one
#               of its events starts (QueueDoor)
_TURNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # app → its FairTurns


class FairTurns:
    """Start-time fair queueing of each group's waiting events between visitors (module docstring), and at most
    ``max_waiting`` events waiting per visitor and ``max_waiting_at_address`` per network address (whose visitors a
    client can mint: :class:`server.Visitors`), over all groups: a request past either is refused before it is
    queued (with a message the page shows), so that one client cannot fill the queue's places.

    Args:
        demo (gr.Blocks): the app, after ``demo.queue()``; its queue's ``push`` and ``process_events`` are wrapped.
        max_waiting (int): events one visitor may have waiting (not yet running), all groups together.
        max_waiting_at_address (int): events the visitors at one address may have waiting together.
        always (Iterable): event listeners (the ``Dependency`` an event's ``.click(…)`` or ``gr.on(…)``
            returns) whose events are never refused, here nor at the door (:class:`QueueDoor`): a Cancel and the
            drops of a slow run — a moment's work, and what a visitor whose places are full needs most (its Cancel
            refused, a cancelled run would keep its slow place to its end). They still count among the waiting
            events.
    """

    def __init__(self, demo: gr.Blocks, max_waiting: int, max_waiting_at_address: int, always=()) -> None:
        self.queue, self.max_waiting, self.max_waiting_at_address = demo._queue, max_waiting, max_waiting_at_address
        self.always = frozenset(listener["id"] for listener in always)  # fn_index of the handlers never refused
        self.finish: dict[str, dict[tuple, float]] = {}  # group → ("a", address) or ("v", address, visitor) → tag
        self.tags: dict[str, tuple[str, str, float, float, float]] = {}  # event id → (visitor, address, its
        #                                        address's start tag, its start tag among that address's visitors, cost)
        self.clock = time.monotonic  # what a run's time is measured with, s
        self.closed: dict[tuple[str, str], tuple[float, str]] = {}  # ("v", visitor) or ("a", address) refused →
        #                                                             (until, monotonic s; the refusal's message)
        self._push, self._process = self.queue.push, self.queue.process_events
        self.queue.push, self.queue.process_events = self.push, self.process_events
        _TURNS[demo] = self

    @staticmethod
    def of(demo: gr.Blocks) -> FairTurns | None:
        """The fair turns made for ``demo``, if any."""
        return _TURNS.get(demo)

    def at_door(self, who: str, where: str) -> str | None:
        """The message refusing a queue join of visitor ``who`` at address ``where`` before it is read: that visitor
        or address was refused for its waiting events less than :data:`DOOR_S` ago and none of its events has
        started since; else None."""
        now = time.monotonic()
        for key in (("v", who), ("a", where)):
            until, message = self.closed.get(key, (0.0, ""))
            if until > now:
                return message
            self.closed.pop(key, None)
        return None

    def waiting(self, who: str, where: str) -> tuple[int, int]:
        """Events waiting in the queue (not started), all groups together: visitor ``who``'s, and those of the
        visitors at address ``where``."""
        requests = [event.request for group in self.queue.event_queue_per_concurrency_id.values()
                    for event in group.queue]
        return (sum(visitor(request) == who for request in requests),
                sum(address(request) == where for request in requests))

    def estimate(self, fn) -> float:
        """The estimated time of a run of handler ``fn``, s: Gradio's measured mean, :data:`DEFAULT_COST_S` before
        any."""
        measured = self.queue.process_time_per_fn.get(fn)
        return measured.avg_time if measured is not None and measured.avg_time > 0 else DEFAULT_COST_S

    async def push(self, body, request, username):
        """Gradio's ``Queue.push``, refused with a message for a visitor who has ``max_waiting`` events waiting or
        an address whose visitors have ``max_waiting_at_address``; a queued event is then put in its fair place in
        its group (:meth:`place`)."""
        who, where = visitor(request), address(request)
        mine, here = self.waiting(who, where) if body.fn_index not in self.always else (0, 0)
        if who and mine >= self.max_waiting:
            return self._refuse(("v", who), f"You have {self.max_waiting} requests waiting already: they are "
                                            "answered first. Ask again once they are.")
        if where and here >= self.max_waiting_at_address:
            return self._refuse(("a", where), f"{self.max_waiting_at_address} requests from your network are waiting "
                                              "already: they are answered first. Ask again in a moment.")
        queued, answer, status = await self._push(body=body, request=request, username=username)
        event = self.queue.event_ids_to_events.get(answer) if queued else None
        if event is not None:
            self.place(event, who, where)
        return queued, answer, status

    def _refuse(self, key: tuple[str, str], message: str) -> tuple[bool, str, str]:
        """``push``'s refusal with ``message``; ``key``'s next joins are refused at the door (:meth:`at_door`)."""
        self.closed[key] = (time.monotonic() + DOOR_S, message)
        return False, message, "error"

    def place(self, event, who: str, where: str) -> None:
        """Tag ``event`` (just queued, last of its group) for visitor ``who`` at address ``where`` and sort its
        group's waiting events: turns go first to addresses (a start tag per address: tokens minted at one address
        share its turns) and, among an address's events, to its visitors (a start tag per visitor); each address's
        turns are given to its events in the order of their visitors' tags. Stable: equal tags keep their order of
        arrival."""
        self.tags = {key: tag for key, tag in self.tags.items() if key in self.queue.event_ids_to_events}  # gone
        group = event.concurrency_id
        waiting = self.queue.event_queue_per_concurrency_id[group].queue
        if event not in waiting:  # answered from Gradio's cache, or started already
            return
        others = [self.tags[item._id] for item in waiting if item is not event and item._id in self.tags]
        finish = self.finish.setdefault(group, {})
        if not others:  # nothing waits: every visitor is served up to now, the group starts afresh
            finish.clear()
        here = [tag for tag in others if tag[1] == where]
        if not here:  # nothing of this address waits: its visitors start afresh among themselves
            for key in [key for key in finish if key[0] == "v" and key[1] == where]:
                del finish[key]
        cost = self.estimate(event.fn)
        now = min((tag[2] for tag in others), default=0.0)
        start = max(now, finish.get(("a", where), now))
        finish[("a", where)] = start + cost
        now = min((tag[3] for tag in here), default=0.0)
        turn = max(now, finish.get(("v", where, who), now))
        finish[("v", where, who)] = turn + cost
        self.tags[event._id] = (who, where, start, turn, cost)
        order: dict[str, float] = {}  # event id → the address-level tag of the turn it takes
        tagged = [item for item in waiting if item._id in self.tags]
        for at in {self.tags[item._id][1] for item in tagged}:
            mine = [item for item in tagged if self.tags[item._id][1] == at]
            turns = sorted(self.tags[item._id][2] for item in mine)
            for item, slot in zip(sorted(mine, key=lambda item: self.tags[item._id][3]), turns, strict=True):
                order[item._id] = slot
        waiting.sort(key=lambda item: order.get(item._id, 0.0))

    async def process_events(self, events, batch, begin_time, fn):
        """Gradio's ``Queue.process_events``; afterwards each event's visitor and address are charged what its run
        took beyond its estimate (their finish tags move later, or earlier for a run shorter than estimated)."""
        started = self.clock()
        for event in events:  # a place of its visitor's and address's is free: their door opens
            self.closed.pop(("v", visitor(event.request)), None)
            self.closed.pop(("a", address(event.request)), None)
        try:
            return await self._process(events, batch, begin_time, fn)
        finally:
            took = self.clock() - started
            for event in events:
                tag = self.tags.pop(event._id, None)
                finish = self.finish.get(event.concurrency_id, {})
                for key in () if tag is None else (("a", tag[1]), ("v", tag[1], tag[0])):
                    if key in finish:
                        finish[key] += took - tag[4]


class QueueDoor:
    """ASGI middleware, inside :class:`server.Visitors`: a queue join (``POST …/queue/join``) of a visitor or address
    that ``turns`` refused a moment ago (:meth:`FairTurns.at_door`) is answered 429 with the same message as JSON
    (``{"detail": …}``, as Gradio's own refusals) before Gradio reads it. A client that keeps sending what is
    refused (a flood of joins: 200 a second in the class bench) then costs the server a header's parsing each, not
    Gradio's route, its body's validation and a scan of the queue, which took the event loop from every visitor.
    Only a join of at most :data:`DOOR_BODY_BYTES` is read, for its handler: one of :attr:`FairTurns.always` (a
    Cancel: no inputs, a few hundred bytes) goes in.

    Args:
        app: the ASGI application it wraps.
        turns (FairTurns): the app's fair turns.
    """

    def __init__(self, app, turns: FairTurns) -> None:
        self.app, self.turns = app, turns

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST" and scope.get("path", "").endswith("/queue/join"):
            message = self.turns.at_door(visitor(scope), address(scope))
            if message is not None and self.turns.always:
                body, receive = await self._small_body(scope, receive)
                if _fn_index(body) in self.turns.always:
                    message = None
            if message is not None:
                await send({"type": "http.response.start", "status": 429,
                            "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                        (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": json.dumps({"detail": message}).encode()})
                return
        await self.app(scope, receive, send)

    @staticmethod
    async def _small_body(scope: dict, receive):
        """(the join's body if its Content-Length says at most :data:`DOOR_BODY_BYTES` and it is that long, else
        b""; a ``receive`` that hands the app the messages read here first, then the rest)."""
        lengths = [value for name, value in scope.get("headers", []) if name == b"content-length"]
        if len(lengths) != 1 or not lengths[0].isdigit() or int(lengths[0]) > DOOR_BODY_BYTES:
            return b"", receive
        read, body = [], b""
        while len(body) <= DOOR_BODY_BYTES:
            message = await receive()
            read.append(message)
            body += message.get("body", b"")
            if message["type"] != "http.request" or not message.get("more_body", False):
                break

        async def replay():
            return read.pop(0) if read else await receive()
        return body if len(body) <= DOOR_BODY_BYTES else b"", replay


def _fn_index(body: bytes) -> int | None:
    """A join body's ``fn_index`` (None: not JSON, or none)."""
    try:
        value = json.loads(body).get("fn_index") if body else None
    except (ValueError, AttributeError, RecursionError):
        return None
    return value if isinstance(value, int) else None
