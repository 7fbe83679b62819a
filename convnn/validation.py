"""Argument checks shared by the library (the message names the argument and the range), and its one seed range.

Every seed a user gives (a layer's ``seed``, a model's ``candidate_seed``, a training run's ``--seed``, the app's
seed box) lies in :data:`SEED_RANGE`; seeds the library derives from them (:func:`derive_seed`) lie there too.
"""

from __future__ import annotations

import hashlib
import math

import torch

SEED_RANGE = (0, 2**63 - 1)  # what torch.Generator.manual_seed takes without wrapping to a negative int64
_SEED_BYTES = 8


def derive_seed(*parts: object) -> int:
    """A seed in :data:`SEED_RANGE` derived from ``parts`` (a seed and labels such as a layer's name or a rank).

    Returns:
        int: the first 8 bytes of ``blake2b("/".join(str(p) for p in parts))`` as a little-endian integer, masked
        to 63 bits: independent-looking seeds for different parts, the same for the same parts on any machine.
    """
    digest = hashlib.blake2b("/".join(str(part) for part in parts).encode(), digest_size=_SEED_BYTES).digest()
    return int.from_bytes(digest, "little") & SEED_RANGE[1]


def number_range(minimum: float | None, maximum: float | None) -> str:
    """The inclusive range ``minimum`` to ``maximum`` in words, as a refusal names it: "from 1 to 256", "at least 0"
    (``maximum`` None: no upper bound), "at most 1" (``minimum`` None)."""
    if maximum is None:
        return f"at least {minimum}"
    return f"at most {maximum}" if minimum is None else f"from {minimum} to {maximum}"


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def check_ratio(name: str, value: float) -> None:
    """Raise ``ValueError`` unless ``value`` is a number (not a bool) with ``0 ≤ value ≤ 1``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def check_bool(name: str, value) -> None:
    """Raise ``ValueError`` unless ``value`` is True or False (a card's ``"no"`` would otherwise read as True)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")


def check_int(name: str, value, low: int, high: float = math.inf) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer (not a bool or float) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        bound = "∞" if high == math.inf else str(high)
        raise ValueError(f"{name} must be an integer in [{low}, {bound}], got {value!r}")


def check_positive(name: str, value) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def check_nonnegative(name: str, value, below: float = math.inf) -> None:
    """Raise ``ValueError`` unless ``value`` is a number (not a bool) with ``0 ≤ value < below`` (so finite)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < below:
        bound = "∞" if below == math.inf else f"{below:g}"
        raise ValueError(f"{name} must be a number in [0, {bound}), got {value!r}")


def check_floating_input(x: torch.Tensor) -> None:
    """Raise ``ValueError`` for integer or boolean inputs (their products would silently truncate)."""
    if not x.is_floating_point():
        raise ValueError(f"input must be a floating-point tensor, got {x.dtype}")
