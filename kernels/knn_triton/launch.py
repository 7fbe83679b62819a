"""Launching the fused kernel's Triton kernels with less host work a call (docs/kernel.md, "Host path").

``kernel[grid](**kwargs)`` runs Triton's whole launch path every call. On an H100 host (Triton 3.6, bench/RESULTS.md
§1t) that path took 59.7 µs for ``knn_fwd``: 17.5 µs to bind and specialise its ≈ 35 arguments, 3.7 µs for the
compiled kernel's cache key, 14.8 µs in the compiled launcher, and ≈ 24 µs around them — launch metadata built for
launch hooks that are empty, the hooks called, and a check that no global the kernel reads has changed since it was
compiled (each constexpr compared through Python). The CIFAR layer's forward and backward launch four kernels on a
host that is its bottleneck.

:func:`launch` keeps what decides which kernel runs — Triton's own binder and cache key, so the kernel it launches is
the one ``kernel[grid]`` would launch — and calls that kernel's launcher directly, without metadata or hooks. Where
that key names no compiled kernel (the first call of a specialisation), or launch hooks are set (a profiler such as
proton), or pre-run hooks, or in the interpreter, or for a stand-in of a kernel (tests), it is ``kernel[grid]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction, compute_cache_key

__all__ = ["launch", "use_direct_launch"]

_direct = [True]  # use_direct_launch


@contextmanager
def use_direct_launch(enabled: bool) -> Iterator[None]:
    """Inside the block :func:`launch` goes through Triton's whole launch path every call when ``enabled`` is False
    (tests/kernels/test_launch.py compares the two paths' results; bench/RESULTS.md §1t times them alternated, its
    script in bench/logs/2026-12-08_launch_h100/); the default is the direct launch. Not thread-local."""
    before, _direct[0] = _direct[0], enabled
    try:
        yield
    finally:
        _direct[0] = before


def _hooked() -> bool:
    """Whether launch hooks are set (a profiler's): Triton's path then calls them with the launch's metadata."""
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return any(hook is not None and getattr(hook, "calls", True) for hook in hooks)


def launch(kernel, grid: tuple[int, ...], **kwargs) -> None:
    """``kernel[grid](**kwargs)``, with the compiled kernel Triton picks for these arguments launched directly
    once it exists (see the module's docstring).

    Args:
        kernel: a ``@triton.jit`` kernel; anything else (the interpreter's kernels, a test's stand-in) is launched
            as ``kernel[grid](**kwargs)``.
        grid (tuple[int, ...]): one to three program counts.
        **kwargs: every argument by name, as ``kernel[grid]`` takes them (launch options such as ``num_warps``
            included).
    """
    if (not _direct[0] or not isinstance(kernel, JITFunction) or getattr(kernel, "pre_run_hooks", None) or _hooked()
            or getattr(knobs.runtime, "add_stages_inspection_hook", None) is not None):
        kernel[grid](**kwargs)
        return
    device = driver.active.get_current_device()
    kernel_cache, kernel_key_cache, _, _, binder = kernel.device_caches[device]
    # the options Triton's run adds before it binds (JITFunction.run): the same key, or no kernel and its path
    bound, specialization, options = binder(**kwargs, debug=getattr(kernel, "debug", None) or knobs.runtime.debug,
                                            instrumentation_mode=knobs.compilation.instrumentation_mode)
    compiled = kernel_cache.get(compute_cache_key(kernel_key_cache, specialization, options))
    if compiled is None:
        kernel[grid](**kwargs)
        return
    size = len(grid)
    compiled.run(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1,
                 driver.active.get_current_stream(device), compiled.function, compiled.packed_metadata, None, None,
                 None, *bound.values())
