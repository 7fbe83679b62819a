"""Checking the numbers a user types (a pixel, K, a seed, a number of hops) before they reach arrays and RNGs, and
recognising a request that ran out of memory.

UI number boxes and ``gradio_client`` calls deliver floats, possibly ``inf``, ``NaN`` or ``2.7``; ``int()`` on those
raises ``OverflowError`` or silently truncates. :func:`whole_number` turns them into an ``int`` or a ``ValueError``
that names the field. :func:`user_error_message` tells the errors a user can cause (a bad value or file, or an
allocation failure from large options: :func:`is_out_of_memory`) from bugs, and words them for the page.
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["MAX_SEED", "OUT_OF_MEMORY_MESSAGE", "is_out_of_memory", "user_error_message", "whole_number"]

MAX_SEED = 2**64 - 1  # the largest seed torch.Generator.manual_seed accepts
OUT_OF_MEMORY_MESSAGE = ("Not enough memory for this request: choose a smaller K, window R or r, another layer, or a "
                         "smaller image or model, and try again.")
_OUT_OF_MEMORY_MARKERS = ("out of memory", "can't allocate", "cannot allocate")  # torch's CPU and CUDA allocators


def whole_number(value: object, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int``, when it is a whole, finite real number (``3``, ``3.0``, ``np.int64(3)``).

    Args:
        value (object): what was typed.
        name (str): the field, for the message (e.g. ``"K (neighbours per query)"``).
        minimum, maximum (int, optional): inclusive bounds. Default: none

    Returns:
        int: the value.

    Raises:
        ValueError: a bool, a non-number, ``inf`` / ``NaN``, a fraction, or a value outside the bounds; the message
            names the field and the value.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, numbers.Integral):
        number = int(value)
    else:
        as_float = float(value)
        if not math.isfinite(as_float) or not as_float.is_integer():
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        number = int(as_float)
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        low = "−∞" if minimum is None else minimum
        high = "∞" if maximum is None else maximum
        raise ValueError(f"{name} must be in [{low}, {high}], got {number}")
    return number


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` reports an allocation failure: ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA), or a
    ``RuntimeError`` from torch's CPU allocator ("DefaultCPUAllocator: can't allocate memory: …")."""
    if isinstance(err, MemoryError | torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and any(marker in str(err).lower() for marker in _OUT_OF_MEMORY_MARKERS)


def user_error_message(err: BaseException) -> str | None:
    """What to tell the user about ``err``, or None when it is not one a user can cause (a bug: let it propagate).

    Returns:
        str or None: ``str(err)`` for ``ValueError`` (including :class:`convnn.CheckpointError`) and ``OSError``;
        :data:`OUT_OF_MEMORY_MESSAGE` when :func:`is_out_of_memory`; None otherwise.
    """
    if isinstance(err, ValueError | OSError):
        return str(err)
    return OUT_OF_MEMORY_MESSAGE if is_out_of_memory(err) else None
