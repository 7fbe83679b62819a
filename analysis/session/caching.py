"""One least-recently-used store for every cache of :mod:`analysis`, bounded by one byte budget.

Each cached function (a loaded model, a traced forward pass, q/k features, a selection, a layer's outputs, a λ mix,
an attribution, a spectrum, a pixel view) keeps its results in the same store, bounded in entries per function and in
bytes over all of them: :data:`DEFAULT_CACHE_BYTES`, or what :func:`set_cache_budget` sets (the app's ``--cache-mb``
flag, or ``$CONVNN_CACHE_MB``). Once the store holds more, the least recently used entries go first, whatever cache
they belong to.

The accounting is what the entries keep alive (:func:`nbytes`): the tensors and arrays of each result, plus, once each,
those of the objects its key holds (an :class:`~analysis.session.image_decode.InputImage` keys many results but its
pixels are counted once). When a result that keys others is evicted (a loaded model keys its traces, selections, …),
those go with it: nothing derived from it can be asked for again, and it would keep the model alive. A hit on a result
renews the results its key holds, so an entry in use keeps what it derives from.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

__all__ = ["DEFAULT_CACHE_BYTES", "CacheInfo", "bounded_cache", "cache_budget", "cache_usage", "nbytes",
           "set_cache_budget"]

DEFAULT_CACHE_BYTES = 512 * 2**20  # all analysis caches together; a CIFAR session fills 100–300 MB
_MAX_DEPTH = 6  # how deep nbytes looks into containers and dataclasses


class CacheInfo(NamedTuple):
    """Counters of one :func:`bounded_cache`, as :func:`functools.lru_cache`'s ``cache_info()`` plus bytes: this
    cache's ``bytes`` (its results and, once each, what their keys hold) and the store's budget ``max_bytes``."""

    hits: int
    misses: int
    maxsize: int
    currsize: int
    max_bytes: int
    bytes: int


def nbytes(value: Any) -> int:
    """Bytes of the tensors and arrays ``value`` keeps alive: its own, or those among its items, attributes (dataclasses
    and objects with ``__dict__``) and a module's parameters and buffers, each storage counted once."""
    seen: set[int] = set()

    def walk(item: Any, depth: int) -> int:
        if id(item) in seen or depth > _MAX_DEPTH or item is None or isinstance(item, str | bytes | int | float):
            return 0
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            if storage.data_ptr() in seen:
                return 0
            seen.add(storage.data_ptr())
            return storage.nbytes()
        if isinstance(item, np.ndarray):
            return walk(item.base, depth) if isinstance(item.base, np.ndarray | torch.Tensor) else item.nbytes
        if isinstance(item, nn.Module):
            return sum(walk(t, depth + 1) for t in (*item.parameters(), *item.buffers()))
        if isinstance(item, dict):
            return sum(walk(v, depth + 1) for v in item.values())
        if isinstance(item, list | tuple | set | frozenset):
            return sum(walk(v, depth + 1) for v in item)
        if dataclasses.is_dataclass(item) or hasattr(item, "__dict__"):
            return sum(walk(v, depth + 1) for v in vars(item).values())
        return 0

    return walk(value, 0)


@dataclasses.dataclass(eq=False)
class _Entry:
    value: Any
    size: int
    parents: tuple[Hashable, ...]  # keys of the cached results this entry's arguments are
    held: tuple[int, ...]  # ids of the other objects its arguments are (counted in _Store.held)


class _Store:
    """The one store behind every :func:`bounded_cache` (guarded by one lock)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.lock = threading.RLock()
        self.entries: OrderedDict[Hashable, _Entry] = OrderedDict()  # (cache name, args) → entry, oldest first
        self.owners: dict[int, Hashable] = {}  # id(cached value) → its key
        self.children: dict[Hashable, set[Hashable]] = {}  # key → keys whose arguments hold its value
        self.held: dict[int, list] = {}  # id(object) → [object, bytes, entries holding it]
        self.bytes = 0

    def get(self, key: Hashable) -> tuple[bool, Any]:
        with self.lock:
            entry = self.entries.get(key)
            if entry is None:
                return False, None
            self._renew(key)
            return True, entry.value

    def _renew(self, key: Hashable) -> None:
        for parent in self.entries[key].parents:
            if parent in self.entries:
                self._renew(parent)
        self.entries.move_to_end(key)

    def put(self, key: Hashable, value: Any, size: int, args: tuple, cache: str, max_entries: int) -> None:
        with self.lock:
            if key in self.entries:
                return
            parents = tuple(self.owners[id(a)] for a in args if id(a) in self.owners
                            and self.entries[self.owners[id(a)]].value is a)
            others = [a for a in args if id(a) not in self.owners]
            new_held = sum(nbytes(a) for a in others if id(a) not in self.held)
            if size + new_held > self.max_bytes:
                return  # larger than the whole budget on its own: returned, never kept
            for arg in others:
                record = self.held.setdefault(id(arg), [arg, nbytes(arg), 0])
                self.bytes += record[1] if record[2] == 0 else 0
                record[2] += 1
            self.entries[key] = _Entry(value, size, parents, tuple(id(a) for a in others))
            self.bytes += size
            self.owners[id(value)] = key
            for parent in parents:
                self.children.setdefault(parent, set()).add(key)
            own = [k for k in self.entries if k[0] == cache]
            for old in own[:max(0, len(own) - max_entries)]:
                self.evict(old)
            while self.bytes > self.max_bytes and self.entries:
                self.evict(next(iter(self.entries)))

    def evict(self, key: Hashable) -> None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        self.bytes -= entry.size
        if self.owners.get(id(entry.value)) == key:
            del self.owners[id(entry.value)]
        for object_id in entry.held:
            record = self.held[object_id]
            record[2] -= 1
            if record[2] == 0:
                self.bytes -= record[1]
                del self.held[object_id]
        for parent in entry.parents:
            self.children.get(parent, set()).discard(key)
        for child in self.children.pop(key, set()):
            self.evict(child)

    def clear(self, cache: str) -> None:
        with self.lock:
            for key in [k for k in self.entries if k[0] == cache]:
                self.evict(key)

    def cache_bytes(self, cache: str) -> tuple[int, int]:
        """(entries, bytes) of one cache: its results, plus what their keys hold, once each."""
        with self.lock:
            own = [entry for key, entry in self.entries.items() if key[0] == cache]
            held = {object_id for entry in own for object_id in entry.held}
            return len(own), sum(e.size for e in own) + sum(self.held[i][1] for i in held)


_STORE = _Store(DEFAULT_CACHE_BYTES)


def set_cache_budget(max_bytes: int) -> None:
    """Bound all analysis caches together to ``max_bytes`` (≥ 0), evicting least recently used entries now if they
    hold more.

    Raises:
        ValueError: ``max_bytes`` is not a whole number ≥ 0.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
        raise ValueError(f"the cache budget must be a whole number of bytes ≥ 0, got {max_bytes!r}")
    with _STORE.lock:
        _STORE.max_bytes = max_bytes
        while _STORE.bytes > max_bytes and _STORE.entries:
            _STORE.evict(next(iter(_STORE.entries)))


def cache_budget() -> int:
    """The byte budget of all analysis caches together (:func:`set_cache_budget`)."""
    return _STORE.max_bytes


def cache_usage() -> tuple[int, int]:
    """``(entries, bytes)`` held by all analysis caches now; bytes ≤ :func:`cache_budget` after every call."""
    with _STORE.lock:
        return len(_STORE.entries), _STORE.bytes


def bounded_cache(max_entries: int, size_of: Callable[[Any], int] = nbytes):
    """Decorator: memoise a function of hashable positional arguments in the shared store, at most ``max_entries``
    results of this function, all caches together within the byte budget (module docstring).

    A result larger than the budget on its own is returned but not kept. Thread-safe; like ``lru_cache`` the function
    may run twice for the same key when two threads miss at once. The wrapper has ``cache_info()``
    (:class:`CacheInfo`) and ``cache_clear()``.

    Args:
        max_entries (int): most results kept for this function (≥ 1).
        size_of (Callable[[Any], int]): bytes of one result. Default: :func:`nbytes`
    """
    def decorate(fn: Callable) -> Callable:
        name = f"{fn.__module__}.{fn.__qualname__}"
        stats = {"hits": 0, "misses": 0}

        @functools.wraps(fn)
        def wrapper(*args: Hashable) -> Any:
            key = (name, args)
            found, value = _STORE.get(key)
            with _STORE.lock:
                stats["hits" if found else "misses"] += 1
            if found:
                return value
            value = fn(*args)
            _STORE.put(key, value, size_of(value), args, name, max_entries)
            return value

        def cache_info() -> CacheInfo:
            entries, held = _STORE.cache_bytes(name)
            return CacheInfo(stats["hits"], stats["misses"], max_entries, entries, _STORE.max_bytes, held)

        def cache_clear() -> None:
            _STORE.clear(name)
            with _STORE.lock:
                stats.update(hits=0, misses=0)

        wrapper.cache_info, wrapper.cache_clear = cache_info, cache_clear
        return wrapper
    return decorate
