"""Pacing between visitors' computations (server/pacing.py): a heavy visitor's forward pass waits between its layers
while a visitor who is not heavy computes, at most ``max_wait_s`` a layer; nobody else waits."""

from __future__ import annotations

import threading
import time

import torch
from torch import nn

from server import Pacing

MODEL = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))  # three module forwards a pass: three layers to wait at


def charged(pacing: Pacing, who: str, seconds: float, now: list[float]) -> None:
    """A finished request of ``who`` that ran ``seconds`` on the fake clock ``now``."""
    with pacing.computing(who):
        now[0] += seconds


def run_in_thread(pacing: Pacing, who: str, hold: threading.Event | None = None):
    """A request of ``who`` in a thread of its own: one forward pass of MODEL, or, with ``hold``, computing until
    it is set. Returns (thread, started, done) events."""
    started, done = threading.Event(), threading.Event()

    def request():
        with pacing.computing(who):
            started.set()
            if hold is None:
                MODEL(torch.zeros(1, 2))
            else:
                hold.wait(10)
        done.set()
    thread = threading.Thread(target=request)
    thread.start()
    return thread, started, done


def test_a_heavy_visitor_computes_after_the_others():
    now = [0.0]
    pacing = Pacing(window_s=30, heavy_s=5, max_wait_s=1.0, clock=lambda: now[0])  # the deadline never comes
    charged(pacing, "heavy", 6.0, now)
    release = threading.Event()
    light, light_running, _ = run_in_thread(pacing, "light", hold=release)
    assert light_running.wait(5)
    heavy, _, heavy_done = run_in_thread(pacing, "heavy")
    assert not heavy_done.wait(0.5)  # waits at its first layer while "light" computes
    release.set()
    assert heavy_done.wait(5)  # goes on as soon as "light" ends
    light.join(5), heavy.join(5)


def test_a_visitor_who_is_not_heavy_never_waits():
    now = [0.0]
    pacing = Pacing(window_s=30, heavy_s=5, max_wait_s=1.0, clock=lambda: now[0])
    charged(pacing, "busy", 4.0, now)  # below heavy_s
    charged(pacing, "other", 6.0, now)  # heavy, and computing: it does not hold "busy" back
    release = threading.Event()
    other, running, _ = run_in_thread(pacing, "other", hold=release)
    assert running.wait(5)
    busy, _, done = run_in_thread(pacing, "busy")
    assert done.wait(2)
    release.set()
    other.join(5), busy.join(5)


def test_the_window_forgets_and_a_wait_is_bounded():
    now = [0.0]
    pacing = Pacing(window_s=30, heavy_s=5, max_wait_s=0.1, clock=time.monotonic)
    assert not pacing.heavy("heavy")
    clock = Pacing(window_s=30, heavy_s=5, clock=lambda: now[0])
    charged(clock, "heavy", 6.0, now)
    assert clock.heavy("heavy")
    now[0] += 31.0
    assert not clock.heavy("heavy")  # runs older than the window no longer count

    with pacing.computing("heavy"):  # a real clock: 6 s charged in the window
        pass
    pacing._runs["heavy"][-1] = (time.monotonic(), 6.0)
    release = threading.Event()
    light, running, _ = run_in_thread(pacing, "light", hold=release)
    assert running.wait(5)
    started = time.monotonic()
    heavy, _, done = run_in_thread(pacing, "heavy")
    assert done.wait(5)  # "light" never ends, but each layer waits 0.1 s at most
    assert 0.25 <= time.monotonic() - started < 2.0  # three layers
    release.set()
    light.join(5), heavy.join(5)
