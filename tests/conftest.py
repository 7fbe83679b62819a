"""Shared test settings: the repository root on sys.path, Triton's interpreter when there is no GPU, and one
share of the CPU cores per pytest-xdist worker."""

import os
import signal
import sys
from pathlib import Path

import pytest
import torch

# The fused kernel runs in Triton's CPU interpreter where there is no GPU; it must be set before Triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Under pytest-xdist (``.ci/run`` passes ``-n 2``) each worker is a process with torch's default of one intra-op
# thread per core: two workers on two cores would run four threads. Give each worker its share of the cores.
if (workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))) > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


class Hung(Exception):
    """A step that blocked past its deadline (:func:`deadline`)."""


@pytest.fixture
def deadline():
    """``deadline(seconds)``: a step that blocks past ``seconds`` from now raises :class:`Hung` instead (SIGALRM, in
    the test's main thread), e.g. a reader opening a FIFO; the alarm is cleared after the test."""
    def hung(signum, frame):
        raise Hung("blocked past its deadline")

    previous = signal.signal(signal.SIGALRM, hung)
    yield signal.alarm
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
