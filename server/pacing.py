"""Pacing between visitors' computations on the same cores (:class:`Pacing`).

Fair turns (:class:`server.FairTurns`) decide which waiting request starts next, but a request that has started
computes until it ends: a visitor whose uploaded model takes seconds a pass, asking again and again, keeps a core
busy beside everyone else's clicks. Here a visitor whose requests have run for more than ``heavy_s`` seconds within
the last ``window_s`` is *heavy*; between the layers of its forward passes (a forward pre-hook on every module) a
heavy visitor's computation waits while a computation of a visitor who is not heavy runs, for at most ``max_wait_s``
at a time, so it always moves on. The others then compute as if it were not there, and it uses what they leave.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch

__all__ = ["Pacing"]

_RUNNING: ContextVar[tuple[Pacing, str] | None] = ContextVar("paced_visitor", default=None)  # the request this
#   thread computes for: its pacing and visitor (Pacing.computing), read by the one forward pre-hook
_HOOK: list = []  # the process's forward pre-hook, installed with the first Pacing


def _pace_layer(module, args) -> None:
    running = _RUNNING.get()
    if running is not None:
        running[0].pace(running[1])


class Pacing:
    """Which visitors compute, how long each has lately, and the wait of a heavy one between its layers.

    Args:
        window_s (float): how far back a visitor's run time counts, s. Default: 30
        heavy_s (float): run time within the window past which a visitor is heavy, s. Default: 5
        max_wait_s (float): the longest a heavy computation waits at one layer, s. Default: 0.5
        clock (Callable[[], float]): seconds, monotonic. Default: ``time.monotonic``
    """

    def __init__(self, window_s: float = 30.0, heavy_s: float = 5.0, max_wait_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not _HOOK:  # every module's forward in this process, once: a no-op outside a paced request
            _HOOK.append(torch.nn.modules.module.register_module_forward_pre_hook(_pace_layer))
        self.window_s, self.heavy_s, self.max_wait_s, self.clock = window_s, heavy_s, max_wait_s, clock
        self._changed = threading.Condition()
        self._active: Counter[str] = Counter()  # visitor → its requests running now
        self._runs: dict[str, deque[tuple[float, float]]] = {}  # visitor → (end, seconds) of its recent runs

    @contextlib.contextmanager
    def computing(self, who: str) -> Iterator[None]:
        """Around one request of visitor ``who`` running: counted as running, its time charged when it ends, and
        its computation's layers paced (:meth:`pace`, in the threads that inherit this context)."""
        token = _RUNNING.set((self, who))
        with self._changed:
            self._active[who] += 1
        started = self.clock()
        try:
            yield
        finally:
            _RUNNING.reset(token)
            with self._changed:
                self._active[who] -= 1
                if not self._active[who]:
                    del self._active[who]
                now = self.clock()
                self._runs.setdefault(who, deque()).append((now, now - started))
                self._changed.notify_all()

    def heavy(self, who: str) -> bool:
        """Whether visitor ``who``'s requests have run for more than ``heavy_s`` within the last ``window_s``
        (those running now counted up to now only when they end). Call with the lock held, or alone."""
        runs = self._runs.get(who)
        if not runs:
            return False
        since = self.clock() - self.window_s
        while runs and runs[0][0] < since:
            runs.popleft()
        return sum(seconds for _, seconds in runs) > self.heavy_s

    def pace(self, who: str) -> None:
        """Between two layers of visitor ``who``'s computation (the forward pre-hook calls it in a request's
        threads): if ``who`` is heavy, wait while a visitor who is not heavy computes, at most ``max_wait_s``."""
        with self._changed:
            if not self.heavy(who):
                return
            deadline = self.clock() + self.max_wait_s
            while (left := deadline - self.clock()) > 0 and any(
                    other != who and not self.heavy(other) for other in self._active):
                self._changed.wait(left)
