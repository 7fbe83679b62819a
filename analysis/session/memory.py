"""The process's C heap (glibc's malloc): how many arenas it keeps, and handing freed memory back to the OS.

glibc keeps the memory a process frees for reuse instead of returning it: every thread that allocates gets an arena
of its own, and a large allocation, once freed, stays in the process's resident size. The explorer caps the arenas
once (:func:`limit_malloc_arenas`) and trims the heap after each large image decode (:func:`trim_heap`). Elsewhere
than glibc (macOS, Windows, musl) both do nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os

__all__ = ["limit_malloc_arenas", "trim_heap"]

_M_ARENA_MAX = -8  # mallopt's parameter number for the arena cap, in glibc's malloc.h


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, or None where the C library is another one (or cannot be loaded)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def limit_malloc_arenas(arenas: int) -> None:
    """Cap glibc's malloc arenas at ``arenas`` for this process, as ``MALLOC_ARENA_MAX`` would (unless that is set).

    Under many clients a server's RSS kept growing with no cache growing, each handler thread's arena holding what it
    had freed (bench/robustness.py).
    """
    if "MALLOC_ARENA_MAX" not in os.environ and (libc := _glibc()) is not None:
        libc.mallopt(_M_ARENA_MAX, arenas)


def trim_heap() -> None:
    """Give the memory the process has freed back to the OS (glibc's ``malloc_trim(0)``, over every arena).

    Costs milliseconds, so it is meant for after a large allocation is freed: six 179 MP image decodes at once took a
    server from 1.8 to 9.5 GB, and it stayed there once they were done.
    """
    if (libc := _glibc()) is not None:
        libc.malloc_trim(0)
