"""Fair shares of the cores (server.ComputeShares): a visitor's pass waits for a place, a heavy pass gives its place
up between module calls to a visitor who has computed less, a pass that raises frees its place, and passes that no
visitor's request runs are not held. Time is a clock of the test's own (each module "computes" a fixed number of
seconds of its thread), so every order below is exact."""

from __future__ import annotations

import threading

import gradio as gr
import pytest
import torch

from server import ComputeShares, RunDropped
from server.guards import _STOP
from tests import small_models
from tests.loops import run_coroutine
from tests.server.test_fairness import request_from

checkpoint_dir = small_models.checkpoint_dir  # shared fixtures
example_image = small_models.example_image

_THREAD_TIME = threading.local()


def thread_clock() -> float:
    """This thread's computing time by the test's clock, s."""
    return getattr(_THREAD_TIME, "now", 0.0)


class Step(torch.nn.Module):
    """A module call that computes ``cost`` seconds of its thread and writes ``label`` to ``log``; ``before`` runs
    first (a test's hold point)."""

    def __init__(self, label: str, cost: float, log: list, before=None) -> None:
        super().__init__()
        self.label, self.cost, self.log, self.before = label, cost, log, before

    def forward(self, x):
        if self.before is not None:
            self.before()
        _THREAD_TIME.now = thread_clock() + self.cost
        self.log.append(self.label)
        return x


def wait_for(condition, what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        threading.Event().wait(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def run_as(shares: ComputeShares, address: str, model: torch.nn.Module, errors: list,
           stop: threading.Event | None = None) -> threading.Thread:
    """``model(x)`` in a thread of its own, as a request of the visitor at ``address`` (no token: ``a:<address>``);
    with ``stop``, as a slow run that is dropped when ``stop`` is set."""
    def work():
        _STOP.set(stop)
        try:
            with shares.computing_for(request_from(address)):
                model(torch.zeros(1))
        except Exception as err:
            errors.append(err)
    thread = threading.Thread(target=work)
    thread.start()
    return thread


def test_a_heavy_pass_gives_its_place_to_a_visitor_who_computed_less_between_module_calls():
    shares, log, errors = ComputeShares(slots=1, clock=thread_clock), [], []
    hold = threading.Event()
    heavy = torch.nn.Sequential(*[Step(f"H{i}", 0.1, log, before=hold.wait if i == 1 else None) for i in range(6)])
    light = torch.nn.Sequential(*[Step(f"L{i}", 0.01, log) for i in range(3)])
    first = run_as(shares, "10.0.0.1", heavy, errors)
    wait_for(lambda: log == ["H0"], "the heavy pass to compute")
    second = run_as(shares, "10.0.0.2", light, errors)
    wait_for(lambda: len(shares._waiting) == 1, "the light pass to wait for the one place")
    assert log == ["H0"]  # it waits: the place is taken
    hold.set()
    first.join(10), second.join(10)
    assert not errors
    # H has computed 0.2 s at its next module call, the light visitor 0 (charged as the least charged computing
    # visitor was when it came: H, 0 before this pass): H gives its place up, the light pass runs whole, H goes on
    assert log == ["H0", "H1", "L0", "L1", "L2", "H2", "H3", "H4", "H5"]
    assert shares.charged == {}  # nobody computes: even again
    assert shares._running == 0


def test_a_visitor_does_not_give_its_place_to_its_own_next_pass_nor_within_the_quantum():
    shares, log, errors = ComputeShares(slots=1, clock=thread_clock, quantum_s=0.5), [], []
    hold = threading.Event()
    heavy = torch.nn.Sequential(*[Step(f"H{i}", 0.1, log, before=hold.wait if i == 1 else None) for i in range(3)])
    same = torch.nn.Sequential(Step("S0", 0.01, log))
    other = torch.nn.Sequential(Step("O0", 0.01, log))
    first = run_as(shares, "10.0.0.1", heavy, errors)
    wait_for(lambda: log == ["H0"], "the heavy pass to compute")
    threads = [run_as(shares, "10.0.0.1", same, errors)]
    wait_for(lambda: len(shares._waiting) == 1, "its own second pass to wait")
    threads.append(run_as(shares, "10.0.0.2", other, errors))
    wait_for(lambda: len(shares._waiting) == 2, "another visitor's pass to wait")
    hold.set()
    for thread in (first, *threads):
        thread.join(10)
    assert not errors
    # 0.3 s computed is within the quantum of 0.5 s: the heavy pass runs to its end; then the other visitor (charged
    # 0) goes before the heavy visitor's own second pass (charged 0.3 s)
    assert log == ["H0", "H1", "H2", "O0", "S0"]


def test_a_pass_that_raises_frees_its_place_and_passes_of_no_visitor_never_wait():
    shares, log, errors = ComputeShares(slots=1, clock=thread_clock), [], []

    class Fails(torch.nn.Module):
        def forward(self, x):
            raise ValueError("broken model")

    thread = run_as(shares, "10.0.0.1", torch.nn.Sequential(Step("A0", 0.1, log), Fails()), errors)
    thread.join(10)
    assert [str(err) for err in errors] == ["broken model"]
    assert shares._running == 0 and not shares._waiting and not shares._active
    errors.clear()
    hold = threading.Event()
    holder = run_as(shares, "10.0.0.2", torch.nn.Sequential(Step("B0", 0.1, log, before=hold.wait)), errors)
    wait_for(lambda: shares._running == 1, "a pass to hold the one place")
    torch.nn.Sequential(Step("N0", 0.1, log))(torch.zeros(1))  # this thread runs no visitor's request
    assert log == ["A0", "N0"]
    hold.set()
    holder.join(10)
    assert log == ["A0", "N0", "B0"] and not errors
    shares._leave()  # the end of a call whose start it did not see (another global pre-hook raised before it)
    assert shares._state().depth == 0 and shares._running == 0


def test_a_dropped_slow_run_stops_at_its_next_module_call():
    shares, log, errors, stop = ComputeShares(slots=1, clock=thread_clock), [], [], threading.Event()
    model = torch.nn.Sequential(Step("D0", 0.1, log), Step("D1", 0.1, log, before=stop.set), Step("D2", 0.1, log))
    run_as(shares, "10.0.0.1", model, errors, stop).join(10)  # dropped during D1
    assert log == ["D0", "D1"] and [type(err) for err in errors] == [RunDropped]
    assert shares._running == 0 and not shares._active  # its place is free


def test_a_slow_run_dropped_while_it_waits_for_a_place_stops_waiting():
    """A dropped slow run does not wait behind everyone else's passes to notice it (it would hold the slow views' one
    place meanwhile): it stops while the place is still taken."""
    shares, log, errors, stop, hold = ComputeShares(slots=1, clock=thread_clock), [], [], threading.Event(), \
        threading.Event()
    holder = run_as(shares, "10.0.0.2", torch.nn.Sequential(Step("B0", 0.1, log, before=hold.wait)), errors)
    wait_for(lambda: shares._running == 1, "a pass to hold the one place")
    dropped = run_as(shares, "10.0.0.1", torch.nn.Sequential(Step("D0", 0.1, log)), errors, stop)
    wait_for(lambda: len(shares._waiting) == 1, "the slow run to wait")
    stop.set()
    dropped.join(10)
    assert [type(err) for err in errors] == [RunDropped] and not shares._waiting and shares._running == 1
    assert set(shares._active) == {("10.0.0.2",), ("10.0.0.2", "a:10.0.0.2")}
    hold.set()
    holder.join(10)
    assert log == ["B0"] and shares._running == 0 and not shares._active


def test_a_model_that_swallows_its_drop_computes_on_without_counting_a_place_twice():
    """A forward that catches every error around its blocks goes on after a drop that took its place; it holds none
    then, so it never yields (frees) one again: more passes than places would compute at once after that."""
    shares, log, errors, stop = ComputeShares(slots=1, clock=thread_clock), [], [], threading.Event()

    def drop_once_others_wait():
        wait_for(lambda: len(shares._waiting) == 2, "two other visitors to wait")
        stop.set()

    class Tolerant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(
                [Step(f"H{i}", 0.1, log, before=drop_once_others_wait if i == 1 else None) for i in range(5)])

        def forward(self, x):
            for block in self.blocks:
                try:
                    x = block(x)
                except Exception:
                    continue
            return x

    heavy, heavy_done = run_as(shares, "10.0.0.1", Tolerant(), errors, stop), threading.Event()
    wait_for(lambda: log == ["H0"], "the slow run to compute")
    others = [run_as(shares, f"10.0.1.{i}", torch.nn.Sequential(Step(f"L{i}", 0.01, log, before=heavy_done.wait)),
                     errors) for i in (1, 2)]  # the one that takes the place holds it until the slow run ended
    heavy.join(10)
    heavy_done.set()
    for thread in others:
        thread.join(10)
    assert shares._running == 0 and not shares._waiting and not shares._active
    assert {"L1", "L2"} <= set(log)


def test_addresses_share_first_then_their_visitors():
    """Visitors minted at one address share its account: a third address that has computed nothing goes before a
    new visitor at the heavy address."""
    shares = ComputeShares(slots=1, clock=thread_clock)
    shares.charged.update({("10.0.0.1",): 2.0, ("10.0.0.1", "a:10.0.0.1"): 2.0})
    shares._active.update({("10.0.0.1",): 1, ("10.0.0.1", "a:10.0.0.1"): 1})
    with shares.computing_for(request_from("10.0.0.1", minted=True)):
        from server.shares import _CURRENT
        same_address = _CURRENT.get()
    with shares.computing_for(request_from("10.0.0.3")):
        elsewhere = _CURRENT.get()
    assert same_address.who != ("10.0.0.1", "a:10.0.0.1")  # a visitor of its own …
    from server.shares import _Turn
    for current in (same_address, elsewhere):
        shares._arrive(_Turn(current.where, current.who, 0))
    order = sorted(shares._waiting, key=shares._order)
    assert [turn.where for turn in order] == [("10.0.0.3",), ("10.0.0.1",)]  # … but its address's account
    assert shares.charged[same_address.who] == pytest.approx(2.0)  # lifted to its address's computing visitor's


def test_each_event_of_the_queue_computes_as_its_visitor():
    with gr.Blocks() as demo:
        box = gr.Number()
        box.change(lambda value: value, box, box)
    demo.queue()
    seen = []

    async def process(events, batch, begin_time, fn):
        from server.shares import _CURRENT
        seen.append(_CURRENT.get().who)
    demo._queue.process_events = process
    shares = ComputeShares(slots=1).attach(demo)

    class Event:
        request = request_from("10.0.0.7")
    run_coroutine(demo._queue.process_events([Event()], False, 0.0, None))
    assert seen == [("10.0.0.7", "a:10.0.0.7")]
    with pytest.raises(ValueError, match="slots must be at least 1"):
        ComputeShares(slots=0)
    assert shares.slots == 1


def test_a_heavy_address_keeps_one_place_free_while_another_address_is_served_outside_a_pass():
    """A request computes outside its forward passes too (an image's decode, a figure, its answer's JSON), where the
    cores are the OS's to share: a heavy model computing in both places took half of them from every other visitor
    then (the class bench's uploads and examples, 2.1× and 2.5× slower). While another address that has computed
    less is being served, an address holds all places but one: of its two passes, the first to reach a module call
    gives its place up and computes again only once the other has ended, a place left free meanwhile."""
    shares, log, errors = ComputeShares(slots=2, clock=thread_clock), [], []
    served, done = threading.Event(), threading.Event()

    def decode():  # another address's request, between its passes
        with shares.computing_for(request_from("10.0.0.2")):
            served.set()
            done.wait(10)

    other = threading.Thread(target=decode)
    other.start()
    served.wait(10)
    both, hold = threading.Barrier(2, timeout=10), threading.Event()  # both passes hold a place at their step 0
    passes = [run_as(shares, "10.0.0.1", torch.nn.Sequential(
        *[Step(f"{name}{i}", 0.1, log, before={0: both.wait, 3: hold.wait}.get(i)) for i in range(6)]), errors)
        for name in "AB"]
    wait_for(lambda: len(shares._waiting) == 1 and len(log) == 4, "one heavy pass to give its place up")
    assert shares._running == 1  # the other computes on; one place is free for the request being served
    hold.set()
    for thread in passes:
        thread.join(10)
    done.set()
    other.join(10)
    assert not errors and sorted(log) == [f"{name}{i}" for name in "AB" for i in range(6)]
    last = {name: log.index(f"{name}5") for name in "AB"}
    first, second = sorted("AB", key=last.get)  # the one that gave its place up (at its step 1) ended second
    assert log.index(f"{second}1") > log.index(f"{first}5")  # it computed again only once the other had ended


def test_without_another_address_served_an_address_computes_in_every_place():
    """The hold-back above is for others' requests being served: alone, an address's two passes compute at once."""
    shares, log, errors = ComputeShares(slots=2, clock=thread_clock), [], []
    both = threading.Barrier(2, timeout=10)
    passes = [run_as(shares, "10.0.0.1", torch.nn.Sequential(
        *[Step(f"{name}{i}", 0.1, log, before=both.wait if i in (0, 4) else None) for i in range(6)]), errors)
        for name in "AB"]
    for thread in passes:
        thread.join(10)
    assert not errors and sorted(log) == [f"{name}{i}" for name in "AB" for i in range(6)]  # the barrier at step 4
    #                                                                      passed: both passes held a place then


def test_a_pass_holding_a_model_s_lock_that_a_served_request_waits_for_is_not_held_back():
    """The request a held-back pass makes room for may be the one waiting for it: another address's click waited for
    the lock of a shared model that a held-back pass held, with a core idle, until the heavy address's other pass
    ended (2.5 s in an adversary's run). A pass whose thread holds a model's lock another thread waits for is not
    held back (analysis.holds_up_a_waiter)."""
    from analysis import ModelLock

    shares, log, errors = ComputeShares(slots=2, clock=thread_clock), [], []
    shares.charged[("10.0.0.1",)] = 1.0  # ahead of 10.0.0.2
    lock, hold, go, locked = ModelLock(), threading.Event(), threading.Event(), threading.Event()
    first = run_as(shares, "10.0.0.1", torch.nn.Sequential(Step("A0", 0.1, log, before=hold.wait)), errors)
    wait_for(lambda: shares._running == 1, "the heavy address's first pass to hold a place")

    def second():  # the same address's pass through a shared model, under its lock
        with lock:
            locked.set()
            go.wait(10)
            with shares.computing_for(request_from("10.0.0.1")):
                torch.nn.Sequential(Step("B0", 0.1, log), Step("B1", 0.1, log))(torch.zeros(1))

    def click():  # another address's request, served, waiting for that model's lock
        with shares.computing_for(request_from("10.0.0.2")), lock:
            log.append("click")

    threads = [threading.Thread(target=second), threading.Thread(target=click)]
    threads[0].start()
    wait_for(locked.is_set, "the second pass to hold the lock")
    threads[1].start()
    wait_for(lambda: lock.waiting == 1, "the click to wait for the lock")
    go.set()
    for thread in threads:
        thread.join(5)
    assert log == ["B0", "B1", "click"]  # while the first pass still holds its place
    hold.set()
    first.join(10)
    assert not errors and log[-1] == "A0"


def test_an_attribution_s_gradients_are_computed_in_its_place(checkpoint_dir, example_image, monkeypatch):
    """The shares gate module calls; an attribution's backward passes ran outside any (beside the places,
    uncharged: a heavy model's saliency took a core no share counted). The attribution is now one module call:
    every gradient Captum computes runs while that visitor's pass holds a place, and its time is charged."""
    from analysis import attribution_map, load_image, load_model

    loaded, image = load_model(checkpoint_dir / "cnn-l0.5.json"), load_image(example_image)
    shares, seen = ComputeShares(slots=1), []
    grad = torch.autograd.grad

    def watched_grad(*args, **kwargs):
        state = shares._state()
        seen.append((state.depth, state.holding, shares._running))
        return grad(*args, **kwargs)
    monkeypatch.setattr(torch.autograd, "grad", watched_grad)
    with shares.computing_for(request_from("10.0.0.1")):
        attribution_map(loaded, image, "saliency")
        attribution_map(loaded, image, "integrated_gradients")
    assert seen and all(depth >= 1 and holding and running == 1 for depth, holding, running in seen), seen
    assert shares._running == 0 and shares._state().depth == 0  # the place is free again
