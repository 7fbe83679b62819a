"""The server's guards in front of the handlers: what the queue admits (:class:`Admission`) and how the slow views
compute (:class:`SlowRuns`), whatever the client sends.

Gradio offers no hook for either, so they read and wrap parts of its queue that are not its public API, listed in
:data:`GRADIO_PRIVATE` right below the imports (``tests/server/test_gradio_private.py`` checks each on the installed
Gradio; ``requirements.txt`` pins Gradio to the minor versions it passed on).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import itertools
import threading
import weakref
from collections import Counter
from collections.abc import Callable

import gradio as gr

import analysis as an

from .visitors import address, visitor

__all__ = ["GRADIO_PRIVATE", "Admission", "RunDropped", "SlowRuns", "check_dropped", "names_a_web_address",
           "waiting_events"]

GRADIO_PRIVATE = {
    "Blocks._queue": "the app's queue (gradio.queueing.Queue), made by demo.queue()",
    "Queue.push": "async push(body, request, username) → (queued, message, status): every /queue/join and /call "
                  "passes it before its event is queued; Admission wraps it",
    "Queue.event_queue_per_concurrency_id": "concurrency id → EventQueue: each group's waiting events",
    "Queue.active_jobs": "the running events: a list of None or a list of Event",
    "EventQueue.queue": "a group's waiting events, oldest first",
    "Event.session_hash": "the session an event belongs to (its own id for a call without one)",
    "Event.fn": "the BlockFunction an event runs (its name is the handler's)",
    "Event.request": "the request that joined the queue (a dropped run's, remembered; its visitor)",
    "Event.concurrency_id": "the concurrency group an event runs in",
    "BlockFunction._id": "an event handler's index: the fn_index of a request",
    "PredictBodyInternal.fn_index": "which handler a request asks for",
    "PredictBodyInternal.data": "a request's input values",
}


def names_a_web_address(data) -> bool:
    """Whether an event's input values hold a file given by a web address (a ``"path"`` that is an http(s) URL),
    which Gradio would fetch, unbounded, before the handler runs; uploaded files have server paths. Walks nested
    lists and dicts without recursion (any depth the request size allows)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            path = item.get("path")
            if isinstance(path, str) and path.strip().lower().startswith(("http://", "https://")):
                return True
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


_DROPPED = object()  # how a dropped run ends (SlowRuns)
_STOP: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("slow_run_stop", default=None)


class RunDropped(Exception):
    """Raised by :func:`check_dropped` inside a slow run's computation that was dropped: it ends there."""


def check_dropped() -> None:
    """Raise :class:`RunDropped` if the slow run computing in this thread (:meth:`SlowRuns.wrap`) was dropped; a
    no-op elsewhere. In the served app it runs at every module call of a visitor's forward pass and while a pass
    waits for a place (:class:`server.ComputeShares`) or for its model's lock (:class:`analysis.ModelLock`); views
    also call it between their own steps (an attribution after each batch, the equivalence demo between demos). So
    a dropped run stops at the next one instead of computing to its end.

    Raises:
        RunDropped: the run was dropped.
    """
    stop = _STOP.get()
    if stop is not None and stop.is_set():
        raise RunDropped


class _Run:
    """One started run of a slow view: ``end`` (its outcome: ``(result, error)`` or ``_DROPPED``) and ``stop`` (set
    when it is dropped: :func:`check_dropped` reads it in the computation's thread)."""

    def __init__(self, end: asyncio.Future) -> None:
        self.end, self.stop = end, threading.Event()


def waiting_events(demo: gr.Blocks, group: str) -> list:
    """The events of the concurrency group ``group`` waiting in ``demo``'s queue (not started yet), oldest first."""
    waiting = demo._queue.event_queue_per_concurrency_id.get(group)
    return list(waiting.queue) if waiting else []


def running_events(demo: gr.Blocks, group: str) -> list:
    """The events of the concurrency group ``group`` that ``demo``'s queue has started and not ended."""
    return [event for job in demo._queue.active_jobs if job for event in job if event.concurrency_id == group]


def queued_events(demo: gr.Blocks, group: str) -> list:
    """The events of the concurrency group ``group`` in ``demo``'s queue, waiting or started."""
    return [*waiting_events(demo, group), *running_events(demo, group)]


def _owner(request) -> tuple[str, str | None]:
    """Whose a slow run is: the visitor of ``request`` (a ``gr.Request``, or the Starlette request of an event in
    Gradio's queue: :func:`server.visitor`) and its session."""
    return visitor(request), getattr(request, "session_hash", None)


class SlowRuns:
    """The slow views' computations: at most ``limit`` at a time over all sessions; a session's run of a view can be
    dropped (the Cancel button, or a change of what the view reads), by that session of the same visitor only
    (:func:`server.visitor`: a session id alone, which a client names at will, drops nothing of another visitor's).

    A handler made by :meth:`wrap` is a coroutine that waits, holding no thread, for a free place, then computes in a
    thread of its own. A free place goes to the waiting run whose network address holds the fewest places, so a run
    that computes for minutes (an occlusion of a heavy uploaded model, given the cores only when nobody else wants
    them: :class:`server.ComputeShares`) holds one place, not the slow views. A dropped run's event ends at once,
    and its computation stops at its next step (a thread cannot be stopped from outside: :func:`check_dropped` runs
    at its next module call, or while it waits for a compute place or a model's lock); it keeps its place until
    then, so that dropped runs never compute beyond the limit (each holds memory). A visitor computes one slow run
    at a time, however often it starts and drops them: its next run also waits for its own dropped computation to
    stop. Its threads are not daemons: the interpreter waits for a computation at exit instead of cutting it off
    inside torch (a daemon thread stopped there aborted the process, "terminate called without an active
    exception").

    :meth:`drop` ends a run on the server: the run's event returns its ``dropped`` value (no change, for the page) and
    completes as any event does. Gradio's own ``cancels=`` is not used: the page ran it only after the Cancel
    button's server step had answered, and the server's message that ends a cancelled event, arriving after the
    page had cleaned up that event, made the page mark its outputs "Error" with no message.

    Args:
        limit (int): computations at a time.
        queued (Callable[[], list]): the slow group's events in Gradio's queue, waiting or started
            (:func:`queued_events`), so that a run dropped before its handler began ends when it begins (a Cancel
            pressed right after Compute can arrive while Gradio still prepares the run's inputs).
    """

    def __init__(self, limit: int, queued: Callable[[], list]) -> None:
        self.limit = limit
        self.queued = queued
        self._free = limit  # places no computation holds
        self._held: Counter = Counter()  # address → places its visitors' computations hold
        self._waiters: list[tuple[int, str, asyncio.Future]] = []  # (arrival, address, set when given a place)
        self._arrivals = itertools.count()
        self._runs: dict[tuple[str, str | None, str], set[_Run]] = {}  # (visitor, session, view) → its started runs
        self._dropped_joins = weakref.WeakSet()  # the join requests of runs dropped while in Gradio's queue
        self._begun_joins = weakref.WeakSet()  # the join requests whose handler has begun (then in _runs)
        self._computing: dict[str, int] = {}  # visitor → its computations running (dropped ones until they stop)
        self._idle: dict[str, asyncio.Event] = {}  # visitor → set when its last computation ends

    def wrap(self, handler, dropped=None):
        """``handler`` (a blocking function with a ``request`` parameter) as a coroutine function of the same
        signature that computes through this limit and, dropped, returns ``dropped``."""
        view, signature = handler.__name__, inspect.signature(handler)

        @functools.wraps(handler)
        async def slow(*args, **kwargs):
            request = signature.bind(*args, **kwargs).arguments.get("request")
            join = getattr(request, "request", None)
            if join in self._dropped_joins:
                return dropped  # dropped while it waited in Gradio's queue, or before its handler began
            if join is not None:
                self._begun_joins.add(join)
            run = _Run(asyncio.get_running_loop().create_future())
            key, where = (*_owner(request), view), address(request)
            self._runs.setdefault(key, set()).add(run)
            try:
                if await self._own_turn(key[0], run.end) and await self._take_place(where, run.end):
                    self._compute(functools.partial(handler, *args, **kwargs), run, view, key[0], where)
                ended = await run.end
            finally:
                if run.end.cancelled() or not run.end.done():  # Gradio's /cancel: stopped as a dropped run is
                    self._stop(run)
                self._runs[key].discard(run)
                if not self._runs[key]:
                    del self._runs[key]
            if ended is _DROPPED:
                return dropped
            result, error = ended
            if error is not None:
                raise error
            return result
        return slow

    async def _own_turn(self, who: str, end: asyncio.Future) -> bool:
        """Wait until no computation of visitor ``who`` runs (a run it dropped stops at its next step), or for
        ``end`` (this run dropped): whether the run may go on."""
        while self._computing.get(who):
            idle = asyncio.ensure_future(self._idle.setdefault(who, asyncio.Event()).wait())
            try:
                await asyncio.wait([idle, end], return_when=asyncio.FIRST_COMPLETED)
            finally:
                idle.cancel()
            if end.done():
                return False
        return True

    async def _take_place(self, where: str, end: asyncio.Future) -> bool:
        """Wait for a place, or for ``end`` (the run dropped): whether the place was taken. A free place goes to the
        waiting run whose address (``where``) holds the fewest places, the first to come among those
        (:meth:`_give_places`), so that visitors at one address (tokens a client minted) cannot take every place
        while another address waits. A run dropped, or cancelled through Gradio's ``/cancel``, while it waits takes
        nothing."""
        given = asyncio.get_running_loop().create_future()
        self._waiters.append((next(self._arrivals), where, given))
        self._give_places()
        if not given.done():
            try:
                await asyncio.wait([given, end], return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                self._no_longer_waiting(where, given)
                raise
        if end.done():
            self._no_longer_waiting(where, given)
            return False
        return True

    def _no_longer_waiting(self, where: str, given: asyncio.Future) -> None:
        """A run that asked for a place will not compute: the place it was given goes back, or it stops waiting."""
        if given.done():
            self._give_back(where)
        else:
            given.cancel()
            self._waiters = [waiter for waiter in self._waiters if waiter[2] is not given]

    def _give_places(self) -> None:
        """Give the free places to the waiting runs, each to the one whose address holds the fewest, then the
        first to come; an address holds all places but one at most (at least one), so that another address's run
        never waits for a place behind runs of one address that may compute for minutes."""
        most = max(1, self.limit - 1)
        while self._free and (waiting := [waiter for waiter in self._waiters if self._held[waiter[1]] < most]):
            waiter = min(waiting, key=lambda waiter: (self._held[waiter[1]], waiter[0]))
            self._waiters.remove(waiter)
            self._free -= 1
            self._held[waiter[1]] += 1
            waiter[2].set_result(True)

    def _give_back(self, where: str) -> None:
        """A place that a run at address ``where`` held is free again; it goes to the next waiting run."""
        self._held -= Counter((where,))  # an address holding none drops out
        self._free += 1
        self._give_places()

    def _compute(self, work, run: _Run, view: str, who: str, where: str) -> None:
        """``work()`` in a thread of its own (Gradio's progress tracker reads the context, :func:`check_dropped` the
        run's ``stop``; not a daemon, as the server's thread may be one), counted as visitor ``who``'s; when it
        ends, its place is given back and ``run.end`` gets ``(result, error)`` unless the run was dropped or
        cancelled meanwhile."""
        loop = run.end.get_loop()
        self._computing[who] = self._computing.get(who, 0) + 1

        def deliver(outcome: tuple) -> None:
            self._computing[who] -= 1
            if not self._computing[who]:
                del self._computing[who]
                if (idle := self._idle.pop(who, None)) is not None:
                    idle.set()
            self._give_back(where)
            if not run.end.done():
                run.end.set_result(outcome)

        def compute() -> None:
            _STOP.set(run.stop)
            try:
                with an.checking_while_waiting(check_dropped):  # a wait for a model's lock stops when dropped
                    outcome = (work(), None)
            except BaseException as err:  # handed to the event, raised there
                outcome = (None, err)
            with contextlib.suppress(RuntimeError):  # the server's loop has closed: no one waits
                loop.call_soon_threadsafe(deliver, outcome)

        try:
            threading.Thread(target=contextvars.copy_context().run, args=(compute,), name=f"slow-{view}",
                             daemon=False).start()
        except BaseException as err:  # no thread to compute in ("can't start new thread"): the place goes back
            deliver((None, err))

    def _stop(self, run: _Run) -> None:
        """Tell ``run``'s computation to stop at its next :func:`check_dropped`; its place is given back when it
        has."""
        run.stop.set()

    def drop(self, request: gr.Request | None, view: str) -> bool:
        """End the runs of ``view`` (a wrapped handler's name) of ``request``'s visitor and session now: one
        computing or waiting for a place returns its ``dropped`` value at once (its computation stops at its next
        :func:`check_dropped` and then gives its place back), one still in Gradio's queue (or started there, its
        handler not begun) ends when its handler begins. Runs in the server's event loop. Returns whether there was
        a run to end."""
        owner, ended = _owner(request), False
        for run in self._runs.get((*owner, view), ()):
            self._stop(run)
            if not run.end.done():
                run.end.set_result(_DROPPED)
                ended = True
        for event in self.queued():
            if ((visitor(event.request), event.session_hash) == owner and event.fn.name == view
                    and event.request not in self._begun_joins):
                self._dropped_joins.add(event.request)
                ended = True
        return ended

    def was_dropped(self, join) -> bool:
        """Whether the run that the queue join request ``join`` (an event's ``request``) made was dropped before its
        handler began: its event still waits in Gradio's queue, to end when it starts."""
        return join in self._dropped_joins

    def dropping(self, views: tuple[str, ...], handler=None, only_if_dropped: bool = False):
        """An event handler (a coroutine taking the ``request``) that drops the session's runs of each of ``views``
        (:meth:`drop`), then returns ``handler(request)``, or nothing without one; with ``only_if_dropped``, no
        change (``gr.skip()``: every output kept) when there was no run to end (a Cancel pressed after the result
        came)."""
        async def drop(request: gr.Request):
            ended = [self.drop(request, view) for view in views]
            if handler is None or (only_if_dropped and not any(ended)):
                return None if handler is None else gr.skip()
            return handler(request)
        drop.__name__ = handler.__name__ if handler else f"drop_{'_'.join(views)}"
        return drop


class Admission:
    """What the server admits to its queue, whatever the client: no file given by a web address (Gradio would
    download it with no size limit, past the work dir's byte budget); and for the slow group, one slow run waiting
    or running per visitor (:func:`server.visitor`; over all slow views and all the visitor's sessions, which a
    client names at will), at most ``max_waiting`` slow runs waiting over all visitors and ``max_waiting_at_address``
    of one network address (whose visitor tokens a client can mint). A request past any of
    these is refused before it enters the queue, with a message (the page shows it), so slow runs can neither pile
    up for one visitor nor fill the queue that clicks and predictions need.

    Gradio has no admission hook per concurrency group (a validator runs after the queue's own size check and marks
    inputs invalid), so this wraps the queue's ``push``, the one step every ``/queue/join`` and ``/call`` passes
    before its event is queued, and reads the queue's waiting and running events.

    Args:
        demo (gr.Blocks): the app, after ``demo.queue()``.
        group (str): the slow views' concurrency group.
        max_waiting (int): slow runs waiting at most, all sessions together.
        max_waiting_at_address (int, optional): of them, those of one network address at most. Default: all
        dropped (Callable[[object], bool]): whether an event's join request was dropped already
            (:meth:`SlowRuns.was_dropped`): such an event is not counted (a Cancel pressed while a run waited must
            not keep its visitor from asking again). Default: none is
    """

    def __init__(self, demo: gr.Blocks, group: str, max_waiting: int,
                 dropped: Callable[[object], bool] = lambda join: False,
                 max_waiting_at_address: int | None = None) -> None:
        self.demo, self.group, self.max_waiting, self.dropped = demo, group, max_waiting, dropped
        self.max_waiting_at_address = max_waiting if max_waiting_at_address is None else max_waiting_at_address
        self.queue = demo._queue
        self.slow_fns = {fn._id for fn in demo.fns.values() if fn.concurrency_id == group}
        self.joining: list[tuple[str, str]] = []  # (visitor, address) of admitted slow requests not queued yet
        self._push = self.queue.push
        self.queue.push = self.push

    def refusal(self, who: str, where: str = "") -> str | None:
        """Why a slow request of the visitor ``who`` at address ``where`` (``""``: a request the server could not
        place, which has no place of its own) is refused now, or None to admit it."""
        waiting = [(visitor(event.request), address(event.request))
                   for event in waiting_events(self.demo, self.group) if not self.dropped(event.request)]
        running = [(visitor(event.request), address(event.request))
                   for event in running_events(self.demo, self.group) if not self.dropped(event.request)]
        if who and who in [item[0] for item in (*waiting, *running, *self.joining)]:
            return ("You already have a slow run (attribution, equivalence demo or every model's spectrum) waiting "
                    "or running, in this tab or another: its result comes first. Ask again once it is shown.")
        if len(waiting) + len(self.joining) >= self.max_waiting:
            return (f"The slow views (attribution, equivalence demo) are busy: {self.max_waiting} requests are "
                    "waiting for them. Try again in a minute; everything else still answers.")
        if where and sum(item[1] == where for item in (*waiting, *self.joining)) >= self.max_waiting_at_address:
            return (f"{self.max_waiting_at_address} slow requests from your network are waiting already: try again "
                    "once they are answered; everything else still answers.")
        return None

    async def push(self, body, request, username):
        """Gradio's ``Queue.push`` for a request that is admitted; else ``(False, message, "error")``, which
        ``/queue/join`` answers 400 with the message."""
        if names_a_web_address(body.data):
            return False, ("Files must be uploaded from your device: a file given as a web address (http:// or "
                           "https://) is not fetched by the server."), "error"
        if body.fn_index not in self.slow_fns:
            return await self._push(body=body, request=request, username=username)
        who = visitor(request), address(request)
        if (message := self.refusal(*who)) is not None:
            return False, message, "error"
        self.joining.append(who)
        try:
            return await self._push(body=body, request=request, username=username)
        finally:
            self.joining.remove(who)
