"""The slow views' guards (server/guards.py) as they place requests by visitor; the admission through a served app
is tried in tests/app/test_safety.py."""

from __future__ import annotations

import asyncio
import threading

import gradio as gr
from starlette.requests import Request

from analysis import ModelLock
from server import SlowRuns, Visitors
from tests.loops import run_coroutine


def placed(client: str, session: str, mint: bool = False) -> gr.Request:
    """A handler's ``gr.Request`` for ``session`` of a request from ``client`` that :class:`server.Visitors` placed
    (it mints no token here, so the visitor is ``"a:<client>"``; with ``mint``, a new visitor's token each call)."""
    scopes = []

    async def app(scope, receive, send):
        scopes.append(scope)

    scope = {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "headers": [],
             "client": (client, 5000)}
    run_coroutine(Visitors(app, mint_burst=int(mint), mint_per_hour=0)(scope, None, None))
    return gr.Request(request=Request(scopes[0]), session_hash=session)


def test_a_slow_run_is_dropped_by_its_own_visitor_and_session_only():
    """A drop (Cancel, or a change of what the view reads) named a session id, which any client can send: another
    visitor's request naming it dropped the run. Now a drop ends the runs of its own visitor's session only (not
    those of the visitor's other tabs either)."""
    started, release = threading.Event(), threading.Event()

    def on_view(request=None):
        started.set()
        release.wait(10)
        return "computed"

    async def scenario() -> list[bool | str]:
        runs = SlowRuns(1, queued=list)
        drop = runs.dropping(("on_view",))
        alice = placed("10.0.0.1", "s1")
        run = asyncio.ensure_future(runs.wrap(on_view, dropped="dropped")(request=alice))
        await asyncio.to_thread(started.wait, 10)
        seen = []
        for other in (placed("10.0.0.66", "s1"), placed("10.0.0.1", "s2")):  # another visitor; alice's other tab
            await drop(other)
            await asyncio.sleep(0.1)
            seen.append(run.done())
        await drop(alice)
        return [*seen, await asyncio.wait_for(run, 5)]

    try:
        assert run_coroutine(scenario()) == [False, False, "dropped"]
    finally:
        release.set()


def test_cancel_after_the_result_came_changes_nothing():
    """Cancel pressed once an attribution was shown cleared it ("Cancelled. Press Compute…"): with
    ``only_if_dropped`` the handler answers only when there was a run to end, else no change (``gr.skip()``: Gradio
    keeps every output; an empty dict made it raise "didn't return enough output values")."""
    started, release = threading.Event(), threading.Event()

    def on_view(request=None):
        started.set()
        release.wait(10)
        return "computed"

    async def scenario() -> list:
        runs = SlowRuns(1, queued=list)
        cancel = runs.dropping(("on_view",), lambda request: {"note": "cancelled"}, only_if_dropped=True)
        alice = placed("10.0.0.1", "s1")
        idle = await cancel(alice)  # nothing running
        run = asyncio.ensure_future(runs.wrap(on_view, dropped="dropped")(request=alice))
        await asyncio.to_thread(started.wait, 10)
        return [idle, await cancel(alice), await asyncio.wait_for(run, 5)]

    try:
        assert run_coroutine(scenario()) == [gr.skip(), {"note": "cancelled"}, "dropped"]
    finally:
        release.set()


def test_a_visitor_computes_one_slow_run_at_a_time_however_often_it_drops_them():
    """A dropped run gave its place back at once while its computation went on to its next step (a pass of a heavy
    model: seconds), so a visitor starting and cancelling slow views in a loop ran several computations at once.
    Now that visitor's next run waits for its dropped computation to stop; another visitor's starts at once."""
    release = threading.Event()
    started = {name: threading.Event() for name in ("first", "again", "other")}

    def on_view(name: str, request=None):
        started[name].set()
        release.wait(10)  # a step that does not look at check_dropped: the computation goes on after the drop
        return name

    async def scenario() -> list:
        runs = SlowRuns(2, queued=list)
        view = runs.wrap(on_view, dropped="dropped")
        drop = runs.dropping(("on_view",))
        alice, bob = placed("10.0.0.1", "s1"), placed("10.0.0.2", "s1")
        first = asyncio.ensure_future(view("first", request=alice))
        await asyncio.to_thread(started["first"].wait, 10)
        await drop(alice)
        again = asyncio.ensure_future(view("again", request=alice))
        other = asyncio.ensure_future(view("other", request=bob))
        await asyncio.to_thread(started["other"].wait, 10)
        await asyncio.sleep(0.3)
        seen = [await first, started["other"].is_set(), started["again"].is_set()]
        release.set()
        return [*seen, await asyncio.wait_for(again, 5), await asyncio.wait_for(other, 5)]

    try:
        assert run_coroutine(scenario()) == ["dropped", True, False, "again", "other"]
    finally:
        release.set()


def test_a_free_slow_place_goes_to_the_address_holding_fewest_and_a_long_run_holds_one():
    """The slow views had one place, first come first served: a hostile visitor's occlusion of a heavy model (minutes,
    its cores given only when nobody else wanted them) held it, and every other visitor's 2 s saliency waited or
    was refused. Now there are several places, and no address holds more than all but one: with three places, two
    held at 10.0.0.1 (two tokens), a third run there waits though a place is free, and a run from 10.0.0.2, come
    later, takes it at once; the next place freed goes to the one waiting."""
    release = {name: threading.Event() for name in ("long", "a2", "a3", "b")}
    order = []

    def on_view(name: str, request=None):
        order.append(name)
        release[name].wait(10)
        return name

    async def until(count: int) -> None:
        while len(order) < count:
            await asyncio.sleep(0.01)

    async def scenario() -> list:
        runs = SlowRuns(3, queued=list)
        view = runs.wrap(on_view, dropped="dropped")
        started = {"long": asyncio.ensure_future(view("long", request=placed("10.0.0.1", "s1", mint=True))),
                   "a2": asyncio.ensure_future(view("a2", request=placed("10.0.0.1", "s2", mint=True)))}
        await until(2)
        started["a3"] = asyncio.ensure_future(view("a3", request=placed("10.0.0.1", "s3", mint=True)))
        await asyncio.sleep(0.1)
        waited = list(order)  # a place is free, but not for a third run of 10.0.0.1
        started["b"] = asyncio.ensure_future(view("b", request=placed("10.0.0.2", "s1")))
        await until(3)
        release["a2"].set()
        await until(4)
        for event in release.values():
            event.set()
        return [waited, order, [await asyncio.wait_for(run, 5) for run in started.values()]]

    try:
        assert run_coroutine(scenario()) == [["long", "a2"], ["long", "a2", "b", "a3"], ["long", "a2", "a3", "b"]]
    finally:
        for event in release.values():
            event.set()


def test_a_slow_run_whose_thread_cannot_start_gives_its_place_back(monkeypatch):
    """A computation's thread that could not start ("can't start new thread") left its place taken and its visitor
    counted as computing: the visitor's next run waited for it forever, and three such closed the slow views. The
    run now fails with the error, and the visitor's next run computes."""
    start = threading.Thread.start
    failed = []

    def start_once_failing(thread):
        if thread.name.startswith("slow-") and not failed:
            failed.append(thread.name)
            raise RuntimeError("can't start new thread")
        return start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_once_failing)

    def on_view(request=None):
        return "computed"

    async def scenario() -> list:
        runs = SlowRuns(1, queued=list)
        view = runs.wrap(on_view, dropped="dropped")
        alice = placed("10.0.0.1", "s1")
        try:
            await view(request=alice)
        except RuntimeError as err:
            first = str(err)
        return [first, await asyncio.wait_for(view(request=alice), 5), runs._free, dict(runs._held)]

    assert run_coroutine(scenario()) == ["can't start new thread", "computed", 1, {}]


def test_a_cancel_before_the_handler_began_drops_the_run():
    """Compute then Cancel at once: Gradio had started the event (its inputs being prepared) but the handler had not
    begun, so the drop found neither a run nor a waiting event; the run then computed and the Cancel changed nothing
    (the browser test's note was not "Cancelled."). A started event whose handler has not begun is dropped now, and
    its handler returns at once when it begins."""
    class Event:  # an event Gradio has started, as its queue lists it
        def __init__(self, request: gr.Request, name: str) -> None:
            self.request, self.session_hash, self.fn = request.request, request.session_hash, type("F", (), {})()
            self.fn.name = name

    computed = []

    def on_view(request=None):
        computed.append(request)
        return "computed"

    async def scenario() -> list:
        alice = placed("10.0.0.1", "s1")
        started = [Event(alice, "on_view")]
        runs = SlowRuns(2, queued=lambda: started)
        dropped = await runs.dropping(("on_view",), lambda request: "cancelled", only_if_dropped=True)(alice)
        return [dropped, await runs.wrap(on_view, dropped="dropped")(request=alice), computed]

    assert run_coroutine(scenario()) == ["cancelled", "dropped", []]


async def drop_first_run(on_view, started: threading.Event) -> tuple:
    """A slow view ``on_view`` under a limit of one place, its run "first" of visitor 10.0.0.1 started (``started``
    set) and then dropped by that session. Returns the wrapped view, that run's future and visitor 10.0.0.2's
    request."""
    runs = SlowRuns(1, queued=list)
    view = runs.wrap(on_view, dropped="dropped")
    alice, bob = placed("10.0.0.1", "s1"), placed("10.0.0.2", "s1")
    first = asyncio.ensure_future(view("first", request=alice))
    await asyncio.to_thread(started.wait, 10)
    await runs.dropping(("on_view",))(alice)
    return view, first, bob


def test_a_dropped_run_keeps_its_place_until_its_computation_stops():
    """A drop gave the place back at once while the computation went on to its next step (or, for a view that never
    checks, to its end): visitors dropping runs in turn had six computations at once under a limit of two, and two
    equivalence demos at ≈ 9 GB each took the server down. Now the place is given back when the computation
    stops; the dropped run's event still ends at once."""
    release = threading.Event()
    started = {name: threading.Event() for name in ("first", "other")}

    def on_view(name: str, request=None):
        started[name].set()
        release.wait(10)  # never looks at check_dropped
        return name

    async def scenario() -> list:
        view, first, bob = await drop_first_run(on_view, started["first"])
        other = asyncio.ensure_future(view("other", request=bob))
        ended = await asyncio.wait_for(first, 5)  # at once
        await asyncio.sleep(0.3)
        waited = not started["other"].is_set()  # the one place is still the dropped computation's
        release.set()
        return [ended, waited, await asyncio.wait_for(other, 5)]

    try:
        assert run_coroutine(scenario()) == ["dropped", True, "other"]
    finally:
        release.set()


def test_a_run_dropped_while_it_waits_does_not_count_against_its_visitor():
    """Cancel pressed while an attribution waited in Gradio's queue: the dropped event stayed there until its turn
    (to end when it starts), and admission counted it, so the visitor's next Compute was refused ("You already have
    a slow run …") and it held one of the waiting places. A dropped event is not counted now."""
    from types import SimpleNamespace

    from server import Admission, visitor

    bob = placed("10.0.0.2", "s1")
    event = SimpleNamespace(request=bob.request, session_hash="s1", fn=SimpleNamespace(name="on_view"),
                            concurrency_id="slow")

    async def push(body, request, username):
        return True, "id", "ok"

    queue = SimpleNamespace(event_queue_per_concurrency_id={"slow": SimpleNamespace(queue=[event])}, active_jobs=[],
                            push=push)
    demo = SimpleNamespace(_queue=queue, fns={})
    runs = SlowRuns(1, queued=lambda: [event])
    admission = Admission(demo, "slow", 1, dropped=runs.was_dropped)
    before = admission.refusal(visitor(bob.request))
    assert run_coroutine(runs.dropping(("on_view",), lambda request: "cancelled", only_if_dropped=True)(bob)) == (
        "cancelled")
    assert before.startswith("You already have a slow run") and admission.refusal(visitor(bob.request)) is None


def test_a_dropped_run_waiting_for_a_model_s_lock_stops_waiting():
    """A slow run that waits for its model's lock (held by other requests' passes through that model, a flood's)
    holds the slow views' place meanwhile: dropped, it stops waiting within analysis.LOCK_CHECK_S and the next run
    starts while the lock is still held."""
    lock, started = ModelLock(), threading.Event()

    def on_view(name: str, request=None):
        started.set()
        if name == "first":
            with lock:  # held by another thread below: waits
                return name
        return name

    async def scenario() -> list:
        view, first, bob = await drop_first_run(on_view, started)
        ended = await asyncio.wait_for(first, 5)
        other = await asyncio.wait_for(view("other", request=bob), 5)  # the place is free: the lock is still held
        return [ended, other]

    holder, release = threading.Event(), threading.Event()

    def hold():
        with lock:
            holder.set()
            release.wait(30)
    thread = threading.Thread(target=hold)
    thread.start()
    holder.wait(10)
    try:
        assert run_coroutine(scenario()) == ["dropped", "other"]
    finally:
        release.set()
        thread.join(10)


def test_one_address_cannot_fill_the_slow_views_waiting_places():
    """Visitor tokens minted at one address each had a slow run waiting, up to all MAX_SLOW_WAITING, and everyone
    else's was refused ("busy"). One address's waiting runs stop at ``max_waiting_at_address`` now; another
    address's is still admitted."""
    from types import SimpleNamespace

    from server import Admission, visitor

    tokens = [placed("10.6.6.6", f"s{index}", mint=True) for index in range(3)]
    waiting = [SimpleNamespace(request=token.request, session_hash=token.session_hash,
                               fn=SimpleNamespace(name="on_view"), concurrency_id="slow") for token in tokens]
    queue = SimpleNamespace(event_queue_per_concurrency_id={"slow": SimpleNamespace(queue=waiting)}, active_jobs=[],
                            push=None)
    admission = Admission(SimpleNamespace(_queue=queue, fns={}), "slow", 8, max_waiting_at_address=3)
    fourth, other = placed("10.6.6.6", "s9", mint=True), placed("10.0.0.2", "s1")
    assert admission.refusal(visitor(fourth.request), "10.6.6.6") == (
        "3 slow requests from your network are waiting already: try again once they are answered; everything else "
        "still answers.")
    assert admission.refusal(visitor(other.request), "10.0.0.2") is None
    del waiting[0]
    assert admission.refusal(visitor(fourth.request), "10.6.6.6") is None
