"""Which implementation ConvNN aggregations ran on, collected for a block of code (e.g. a training run's card)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

__all__ = ["note_backend", "record_backends"]

_RECORDING: ContextVar[set[str] | None] = ContextVar("convnn_backends_used", default=None)


@contextmanager
def record_backends() -> Iterator[set[str]]:
    """Collect the paths that ConvNN aggregations take inside the ``with`` block.

    Yields:
        set[str]: filled as calls run: ``"triton"`` for each aggregation on the fused kernel (dispatched or direct),
        ``"reference"`` for each aggregation in PyTorch (the reference path, and window selection, which runs as
        ``F.conv2d``). Empty if the block ran no ConvNN aggregation (a plain CNN, MHSA). Blocks nest;
        each sees the calls made while it is the innermost.
    """
    used: set[str] = set()
    token = _RECORDING.set(used)
    try:
        yield used
    finally:
        _RECORDING.reset(token)


def note_backend(backend: str) -> None:
    """Record that an aggregation ran on ``backend`` (``"triton"`` or ``"reference"``) if a block is recording;
    a call traced by ``torch.compile`` or ``torch.export`` records nothing (a graph runs without Python)."""
    if torch.compiler.is_compiling():
        return
    used = _RECORDING.get()
    if used is not None:
        used.add(backend)
