"""A least-recently-used cache bounded in bytes as well as in entries, for results whose size varies by orders of
magnitude (a K = 9 selection is 0.2 MB, a K = 1024 one 22 MB on a 32×32 map).

:func:`functools.lru_cache` bounds only the number of entries, so a few large results can hold gigabytes.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import numpy as np

__all__ = ["CacheInfo", "array_bytes", "bounded_cache"]


class CacheInfo(NamedTuple):
    """Counters of a :func:`bounded_cache`, as :func:`functools.lru_cache`'s ``cache_info()`` plus bytes."""

    hits: int
    misses: int
    maxsize: int
    currsize: int
    max_bytes: int
    bytes: int


def array_bytes(value: Any) -> int:
    """Bytes held by the NumPy arrays among ``value``'s attributes (a dataclass or any object with ``__dict__``)."""
    return sum(v.nbytes for v in vars(value).values() if isinstance(v, np.ndarray))


def bounded_cache(max_entries: int, max_bytes: int, size_of: Callable[[Any], int] = array_bytes):
    """Decorator: memoise a function of hashable positional arguments, least recently used entries evicted first
    once more than ``max_entries`` entries or ``max_bytes`` bytes (as ``size_of`` measures them) are held.

    A result larger than ``max_bytes`` on its own is returned but not kept. Thread-safe; like ``lru_cache`` the
    function may run twice for the same key when two threads miss at once. The wrapper has ``cache_info()``
    (:class:`CacheInfo`) and ``cache_clear()``.

    Args:
        max_entries (int): most entries kept (≥ 1).
        max_bytes (int): most bytes kept (≥ 0).
        size_of (Callable[[Any], int]): bytes of one result. Default: :func:`array_bytes`
    """
    def decorate(fn: Callable) -> Callable:
        entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        lock = threading.Lock()
        stats = {"hits": 0, "misses": 0, "bytes": 0}

        @functools.wraps(fn)
        def wrapper(*args: Hashable) -> Any:
            with lock:
                if args in entries:
                    entries.move_to_end(args)
                    stats["hits"] += 1
                    return entries[args][0]
                stats["misses"] += 1
            value = fn(*args)
            size = size_of(value)
            if size > max_bytes:
                return value
            with lock:
                if args not in entries:
                    entries[args] = (value, size)
                    stats["bytes"] += size
                while len(entries) > max_entries or stats["bytes"] > max_bytes:
                    stats["bytes"] -= entries.popitem(last=False)[1][1]
            return value

        def cache_info() -> CacheInfo:
            with lock:
                return CacheInfo(stats["hits"], stats["misses"], max_entries, len(entries), max_bytes, stats["bytes"])

        def cache_clear() -> None:
            with lock:
                entries.clear()
                stats.update(hits=0, misses=0, bytes=0)

        wrapper.cache_info, wrapper.cache_clear = cache_info, cache_clear
        return wrapper
    return decorate
