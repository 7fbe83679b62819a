"""Checking the numbers a user types or a page sends (a pixel, K, a seed, a click) before they reach arrays and RNGs,
and wording the errors a user can cause for the page.

UI number boxes and ``gradio_client`` calls deliver floats, possibly ``inf``, ``NaN`` or ``2.7``, and a crafted request
anything (``"abc"``, ``[1]``); ``int()`` on those raises ``OverflowError`` or silently truncates. :func:`whole_number`
turns them into an ``int`` or a ``ValueError`` that names the field, :func:`real_number` into a finite ``float``;
:func:`click_position` does the same for a select event's position. :func:`user_error_message` tells the errors a
user can cause (a bad value or file, or an allocation failure from large options: :func:`is_out_of_memory`) from
bugs, and words them for the page: every absolute path shortened to its file name, every number of more than
:data:`MAX_NUMBER_DIGITS` digits abbreviated, at most :data:`MAX_MESSAGE_CHARS`, escaped for HTML (the page renders
error messages as HTML).
"""

from __future__ import annotations

import html
import math
import numbers
import re
from decimal import Decimal

import torch

from convnn.validation import SEED_RANGE, number_range

__all__ = ["KNOB_NAMES", "MAX_MESSAGE_CHARS", "MAX_NUMBER_DIGITS", "MAX_SEED", "OUT_OF_MEMORY_MESSAGE",
           "click_position", "is_out_of_memory", "real_number", "user_error_message", "whole_number"]

# The knobs' names, as their controls' labels (analysis.Query) and every message about them name them (a hint of
# what a value means goes under the label: Setting.info)
KNOB_NAMES = {"num_neighbors": "K (neighbours per query)", "window_size": "window side R",
              "num_candidates": "r (random candidates)", "blend_alpha": "blend α", "head": "attention head",
              "draw": "eval draw (random candidates)"}

MAX_SEED = SEED_RANGE[1]  # the library's one seed range (convnn.validation): 2**63 − 1
OUT_OF_MEMORY_MESSAGE = ("Not enough memory for this request: choose a smaller K, window R or r, another layer, or a "
                         "smaller image or model, and try again.")
_OUT_OF_MEMORY_MARKERS = ("out of memory", "can't allocate", "cannot allocate")  # torch's CPU and CUDA allocators
MAX_MESSAGE_CHARS = 1000  # longer messages (a 5000-character name quoted by a library) are cut
MAX_NUMBER_DIGITS = 20  # a longer number in a message (row = 1e308 quoted in 309 digits) is shown as 1.00e+308; the
#                         largest seed (2**63 − 1, 19 digits) is shown whole
_LONG_NUMBER = re.compile(rf"(?<![\d.])\d{{{MAX_NUMBER_DIGITS + 1},}}")  # not the digits of a fraction
# The folders of an absolute path (POSIX or Windows) in a message: a separator not inside a word, a URL or a relative
# path, then each folder (it may hold spaces, not start with one) and its separator. The file name after them stays.
_ABSOLUTE_FOLDERS = re.compile(r"(?<![\w.~:/\\-])(?:[A-Za-z]:)?[\\/](?:[^\s\\/'\"][^\\/\n'\"]*?[\\/])+")


def whole_number(value: object, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int``, when it is a whole, finite real number (``3``, ``3.0``, ``np.int64(3)``).

    Args:
        value (object): what was typed.
        name (str): the field, for the message (e.g. ``"K (neighbours per query)"``).
        minimum, maximum (int, optional): inclusive bounds. Default: none

    Returns:
        int: the value.

    Raises:
        ValueError: None (an empty box: the message says so), a bool, a non-number, ``inf`` / ``NaN``, a fraction, or
            a value outside the bounds; the message names the field and the value.
    """
    if value is None:
        raise ValueError(f"{name} is empty: type a whole number")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, numbers.Integral):
        number = int(value)
    else:
        as_float = float(value)
        if not math.isfinite(as_float) or not as_float.is_integer():
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        number = int(as_float)
    return _within(number, name, minimum, maximum)


def real_number(value: object, name: str, minimum: float | None = None, maximum: float | None = None) -> float:
    """``value`` as a ``float``, when it is a finite real number (``0.5``, ``3``, ``np.float32(0.5)``).

    Args: as :func:`whole_number`.

    Raises:
        ValueError: a bool, a non-number, ``inf`` / ``NaN``, or a value outside the bounds; the message names the
            field and the value.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return _within(float(value), name, minimum, maximum)


def _within(number: float, name: str, minimum: float | None, maximum: float | None) -> float:
    """``number``, if inside the inclusive bounds (None: unbounded); else a ``ValueError`` naming ``name``."""
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise ValueError(f"{name} must be {number_range(minimum, maximum)}, got {number}")
    return number


def click_position(index: object, width_px: int, height_px: int) -> tuple[float, float]:
    """A select event's ``index`` (Gradio's ``[x, y]`` in display pixels) as two numbers.

    Args:
        index (object): what the event carried; the page sends two numbers, a crafted request anything.
        width_px, height_px (int): the displayed image's size, for the message.

    Returns:
        tuple[float, float]: ``(x, y)`` as received, both finite.

    Raises:
        ValueError: not two finite real numbers (``[None, None]``, ``None``, ``["a", 1]``, ``[inf, 2]``): the message
            a click outside the image gets.
    """
    if (isinstance(index, list | tuple) and len(index) == 2 and all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in index)):
        return index[0], index[1]
    raise ValueError(f"the click ({index!r:.40}) is outside the {width_px}×{height_px} image")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` reports an allocation failure: ``MemoryError``, ``torch.OutOfMemoryError`` (CUDA), or a
    ``RuntimeError`` from torch's CPU allocator ("DefaultCPUAllocator: can't allocate memory: …")."""
    if isinstance(err, MemoryError | torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and any(marker in str(err).lower() for marker in _OUT_OF_MEMORY_MARKERS)


def user_error_message(err: BaseException) -> str | None:
    """What to tell the user about ``err``, or None when it is not one a user can cause (a bug: let it propagate).

    Returns:
        str or None: for ``ValueError`` (including :class:`convnn.CheckpointError`) and ``OSError``, ``str(err)`` with
        every absolute path shortened to its file name (``/srv/app/checkpoints/a.json`` → ``a.json``: no message
        says where the server keeps files), every number of more than :data:`MAX_NUMBER_DIGITS` digits in three
        significant ones (``1.00e+308``), cut to :data:`MAX_MESSAGE_CHARS` and HTML-escaped (``<``, ``>``, ``&``:
        card text in a message is shown, not rendered); :data:`OUT_OF_MEMORY_MESSAGE` when :func:`is_out_of_memory`;
        None otherwise.
    """
    if isinstance(err, ValueError | OSError):
        message = _LONG_NUMBER.sub(lambda digits: f"{Decimal(digits[0]):.2e}", _ABSOLUTE_FOLDERS.sub("", str(err)))
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS - 1] + "…"
        return html.escape(message, quote=False)
    return OUT_OF_MEMORY_MESSAGE if is_out_of_memory(err) else None
