"""Fair shares of the computing cores between visitors (:class:`ComputeShares`).

:class:`server.FairTurns` orders each event group's waiting events, but once events of several groups run, their
forward passes share the machine's cores as the operating system pleases: a visitor whose uploaded model takes
seconds a pass, with a request running in every group, held a core whenever it had one running, and every other
visitor's views computed on what was left (`bench/RESULTS.md` §9). Here every forward pass that a visitor's request
runs, in any group and any thread, computes in one of ``slots`` places (one a core, as each computation runs on one
torch thread: ``--threads``). The places go to the waiting computation whose network address, then whose visitor
among that address's, has computed least (thread CPU seconds, charged as they are spent); a visitor who starts
asking while others compute is charged as much as the least charged of them (no credit saved up while idle, as in
start-time fair queueing). A running pass gives its place up between two module calls when a computation waits
whose address (or, at the same address, whose visitor) has computed at least ``quantum_s`` less — so a heavy model
computes on a core only while nobody else wants it, and a click waits at most one module call of it, not a pass.
While a request of an address that has computed ``quantum_s`` less is being served (in or between its passes: an
image's decode, a figure, its answer's JSON compute outside them), an address holds all places but one, so that
work outside the places is not left to share the cores with a heavy model computing in all of them; a pass whose
thread holds a model's lock that another thread waits for (:func:`analysis.holds_up_a_waiter`) is not held back.
A slow run that was dropped (:class:`server.SlowRuns`) stops at its next module call, whatever view computes it.

Passes of threads that no visitor's request runs (the server loading a model, a script, the tests) are not counted and
never wait. What is gated is module calls: gradients outside one (an attribution's are inside: it is one module call,
``analysis.views.attribution``, holding one place, yielding it between its passes' module calls and keeping it through
their backward), tensor work outside any module and a TorchScript model's inner calls compute beside the places,
uncharged; a pass must not hand its modules to another thread that copies its context (that thread would wait for a
second place while the pass waits for it); and a ``BaseException`` other than ``Exception`` raised inside a pass (torch
then skips the forward hook) leaks its place. A pass holds a place only inside the model's ``forward`` (from its
outermost module's call to that call's end, also when it raises), where it takes no lock, so a pass waiting for a place
never holds up one that has one.

It wraps ``Queue.process_events`` (listed in :data:`server.fairness.GRADIO_PRIVATE`) to run each event as its
visitor's, and registers one global forward pre-hook and forward hook with torch (``register_module_forward_*``).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import gradio as gr
import torch

import analysis as an

from .guards import RunDropped, check_dropped
from .visitors import address, visitor

__all__ = ["QUANTUM_S", "ComputeShares"]

QUANTUM_S = 0.05  # a running pass gives its place up to a waiting one that has computed this much less, s
DROP_CHECK_S = 0.1  # how often a pass waiting for a place checks whether its slow run was dropped, s


@dataclass(eq=False)
class _Turn:
    """One computation waiting for a place: its share's keys and its order of arrival."""

    where: tuple[str]  # ("address",)
    who: tuple[str, str]  # (address, visitor)
    arrival: int
    holds_up: bool = False  # whether its thread holds a model's lock that another thread waits for


@dataclass
class _Running:
    """The thread's own state: how deep inside a pass it is, and whose it is."""

    depth: int = 0
    turn: _Turn | None = None
    holding: bool = False  # whether the pass holds a place now
    since: float = 0.0  # thread CPU time when the place was taken, s


@dataclass(frozen=True)
class _Visitor:
    shares: ComputeShares
    where: tuple[str]
    who: tuple[str, str]


_CURRENT: contextvars.ContextVar[_Visitor | None] = contextvars.ContextVar("compute_visitor", default=None)
_HOOKS: list = []  # the two global torch hooks, registered once per process


def _enter(module, args) -> None:
    current = _CURRENT.get()
    if current is not None:
        current.shares._enter(current)


def _leave(module, args, output) -> None:
    current = _CURRENT.get()
    if current is not None:
        current.shares._leave()


@dataclass
class ComputeShares:
    """At most ``slots`` forward passes of visitors' requests at a time, given out by least computing time (module
    docstring). Make one per app with :meth:`attach`.

    Raises:
        ValueError: ``slots`` < 1.

    Args:
        slots (int): passes at a time (the cores, divided by torch's threads a computation).
        quantum_s (float): how much less a waiting computation must have computed to take a running one's place
            between two module calls, s. Default: :data:`QUANTUM_S`.
        clock: the seconds a computation is charged by: this thread's CPU time (``time.thread_time``).
    """

    slots: int
    quantum_s: float = QUANTUM_S
    clock: object = time.thread_time
    charged: dict[tuple, float] = field(default_factory=dict)  # ("address",) or (address, visitor) → seconds
    _active: Counter = field(default_factory=Counter)  # the keys of computations waiting or running → how many
    _waiting: list[_Turn] = field(default_factory=list)
    _running: int = 0
    _holding: Counter = field(default_factory=Counter)  # address → places its passes hold
    _serving: Counter = field(default_factory=Counter)  # address → its requests being served (computing_for)
    _lock: threading.Condition = field(default_factory=threading.Condition)
    _arrivals: itertools.count = field(default_factory=itertools.count)
    _threads: threading.local = field(default_factory=threading.local)
    _process: object = None  # the queue's process_events that attach wrapped

    def __post_init__(self) -> None:
        if not self.slots >= 1:
            raise ValueError(f"slots must be at least 1, got {self.slots}")
        if not _HOOKS:  # once per process: they act only in a context that computing_for set
            _HOOKS.append(torch.nn.modules.module.register_module_forward_pre_hook(_enter))
            _HOOKS.append(torch.nn.modules.module.register_module_forward_hook(_leave, always_call=True))

    def attach(self, demo: gr.Blocks) -> ComputeShares:
        """Run each event of ``demo``'s queue (after ``demo.queue()``) as its visitor's (:meth:`computing_for`).
        Returns self."""
        queue = demo._queue
        self._process = queue.process_events

        async def process_events(events, batch, begin_time, fn):
            with self.computing_for(events[0].request if events else None):
                return await self._process(events, batch, begin_time, fn)

        queue.process_events = process_events
        return self

    @contextlib.contextmanager
    def computing_for(self, request):
        """Inside, every forward pass of this thread (and of the threads started with a copy of its context, as
        Gradio's workers are) computes in a place of these shares, charged to ``request``'s address and visitor
        (:func:`server.address`, :func:`server.visitor`; a ``gr.Request`` or the queue's Starlette request)."""
        where = address(request)
        token = _CURRENT.set(_Visitor(self, (where,), (where, visitor(request))))
        with self._lock:
            self._serving[where] += 1
        try:
            yield
        finally:
            _CURRENT.reset(token)
            with self._lock:
                self._serving -= Counter((where,))  # an address no longer served drops out
                self._lock.notify_all()

    def _state(self) -> _Running:
        state = getattr(self._threads, "state", None)
        if state is None:
            state = self._threads.state = _Running()
        return state

    def _enter(self, current: _Visitor) -> None:
        """A module call of a visitor's pass: the outermost one waits for a place; an inner one gives its place up
        if a computation waits that has computed ``quantum_s`` less. Then a slow run that was dropped stops here,
        or while it waits for a place (:func:`server.check_dropped` raises; the forward hook still ends the call:
        torch runs it on errors too)."""
        state = self._state()
        state.depth += 1
        if state.depth == 1:
            state.turn = _Turn(current.where, current.who, next(self._arrivals), an.holds_up_a_waiter())
            with self._lock:
                self._arrive(state.turn)
                self._take(state)
        elif self._waiting or len(self._serving) > 1:  # read without the lock: what changes meanwhile is seen at
            #                                              the next call
            with self._lock:
                if self._should_yield(state):
                    self._free(state)
                    state.turn.arrival = next(self._arrivals)
                    self._waiting.append(state.turn)
                    self._take(state)
        check_dropped()

    def _leave(self) -> None:
        """The end of a module call (also when it raised): the outermost one charges the pass and frees its place. A
        call whose start was not seen (another global pre-hook raised first) changes nothing."""
        state = self._state()
        if state.depth == 0 or state.turn is None:
            return
        state.depth -= 1
        if state.depth == 0:
            with self._lock:
                if state.holding:
                    self._free(state)
                for key in (state.turn.where, state.turn.who):
                    self._active[key] -= 1
                    if not self._active[key]:
                        del self._active[key]
                floor = {level: min((self.charged.get(key, 0.0) for key in self._active if len(key) == level),
                                    default=None) for level in (1, 2)}
                for key in (state.turn.where, state.turn.who):  # an idle share at or below the least charged
                    if key not in self._active and (floor[len(key)] is None  # one computing is lifted to it anyway
                                                    or self.charged.get(key, 0.0) <= floor[len(key)]):
                        self.charged.pop(key, None)
                if not self._active:  # nobody computes: everyone is even, start afresh
                    self.charged.clear()
            state.turn = None

    def _free(self, state: _Running) -> None:
        """Charge the CPU time since ``state``'s place was taken to its address and visitor, and free the place."""
        now = self.clock()
        for key in (state.turn.where, state.turn.who):
            self.charged[key] = self.charged.get(key, 0.0) + now - state.since
        self._running -= 1
        self._holding -= Counter(state.turn.where)
        state.holding = False
        self._lock.notify_all()

    def _arrive(self, turn: _Turn) -> None:
        """Enter ``turn`` among the waiting; a share not computing yet is charged as much as the least charged share
        computing beside it (its address among addresses, its visitor among its address's visitors)."""
        for key, peers in ((turn.where, [k for k in self._active if len(k) == 1]),
                           (turn.who, [k for k in self._active if len(k) == 2 and k[0] == turn.who[0]])):
            if key not in self._active and peers:
                self.charged[key] = max(self.charged.get(key, 0.0), min(self.charged.get(k, 0.0) for k in peers))
            self._active[key] += 1
        self._waiting.append(turn)

    def _order(self, turn: _Turn) -> tuple[float, float, int]:
        return self.charged.get(turn.where, 0.0), self.charged.get(turn.who, 0.0), turn.arrival

    def _take(self, state: _Running) -> None:
        """Wait (holding the condition) until a place is free and ``state``'s turn is the first waiting; take it. A
        dropped slow run stops waiting (within :data:`DROP_CHECK_S`) and takes none.

        Raises:
            RunDropped: the slow run computing in this thread was dropped.
        """
        while self._running >= self.slots or self._next() is not state.turn:
            self._lock.wait(DROP_CHECK_S)
            state.turn.holds_up = an.holds_up_a_waiter()  # someone may have come to wait for its model's lock
            try:
                check_dropped()
            except RunDropped:
                self._waiting.remove(state.turn)
                self._lock.notify_all()
                raise
        self._waiting.remove(state.turn)
        self._running += 1
        self._holding[state.turn.where[0]] += 1
        state.holding = True
        state.since = self.clock()

    def _next(self) -> _Turn | None:
        """The waiting turn that takes the next free place: the least charged (:meth:`_order`) of those whose
        address is not held back (:meth:`_held_back`)."""
        return min((turn for turn in self._waiting
                    if not self._held_back(turn.where[0], self._holding[turn.where[0]] + 1, holds_up=turn.holds_up)),
                   key=self._order, default=None)

    def _held_back(self, where: str, places: int, spent: float = 0.0, holds_up: bool = False) -> bool:
        """Whether address ``where`` may not hold ``places`` places: more than all but one (at least one), while a
        request of another address that has computed ``quantum_s`` less is being served. Such a request computes
        outside any pass too (an image's decode, a figure, its answer's JSON), and those cores are the OS's to share:
        a heavy model computing in every place took half of them from it. One place always remains, so a pass held
        back waits only for one of its own address's to end. ``spent``: what the asking pass has computed since it
        took its place, not charged yet, s. A pass that ``holds_up`` another thread (it holds a model's lock that
        thread waits for: :func:`analysis.holds_up_a_waiter`) is not held back: the request it would make room for
        may be the one waiting for it."""
        if places <= max(1, self.slots - 1) or holds_up:
            return False
        mine = self.charged.get((where,), 0.0) + spent - self.quantum_s
        return any(other != where and self.charged.get((other,), 0.0) < mine for other in self._serving)

    def _should_yield(self, state: _Running) -> bool:
        """Whether ``state``'s address holds more places than it may now (:meth:`_held_back`), or every place is
        taken and some waiting turn has computed ``quantum_s`` less than ``state``'s: at another address, less than
        its address; at the same address, less than its visitor."""
        if not state.holding:  # a pass whose drop its model swallowed holds none
            return False
        spent = self.clock() - state.since
        if self._held_back(state.turn.where[0], self._holding[state.turn.where[0]], spent, an.holds_up_a_waiter()):
            return True
        if self._running < self.slots:
            return False
        mine = self.charged.get(state.turn.where, 0.0) + spent, self.charged.get(state.turn.who, 0.0) + spent
        for turn in self._waiting:
            theirs = self._order(turn)
            if turn.where != state.turn.where and theirs[0] < mine[0] - self.quantum_s:
                return True
            if turn.where == state.turn.where and turn.who != state.turn.who and theirs[1] < mine[1] - self.quantum_s:
                return True
        return False
