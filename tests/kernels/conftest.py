"""Kernel tests run on the GPU when there is one, else on CPU through Triton's interpreter (docs/kernel.md).

Without CUDA, ``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before anything imports Triton; this file replaces
the interpreter's element-by-element xor reduction (which ``tl.sort``/``tl.topk`` use for every compare-and-swap) with
``numpy.bitwise_xor.reduce``: the same result, about 40× faster here, and patches the language once per kernel
launch instead of at every jit-helper call. The hooks only touch Triton's interpreter, only in this test session.
"""

from __future__ import annotations

import os

import numpy as np


def _install_fast_xor_reduction() -> None:
    """Route the interpreter's xor_sum reductions to numpy (test-only; no-op if Triton's internals differ)."""
    import triton.language as tl
    from triton.runtime import interpreter

    reduce_ops = getattr(interpreter, "ReduceOps", None)
    xor_combine = getattr(tl.standard, "_xor_combine", None)
    if reduce_ops is None or xor_combine is None or not hasattr(reduce_ops, "apply_impl"):
        return
    generic_apply = reduce_ops.apply_impl

    def apply_impl(self, inputs):
        if self.combine_fn is xor_combine and self.axis is not None and len(inputs) == 1:
            data = inputs[0].handle.data
            reduced = np.bitwise_xor.reduce(data, axis=self.axis, keepdims=self.keep_dims)
            return self.to_tensor(reduced, inputs[0].dtype)
        return generic_apply(self, inputs)

    reduce_ops.apply_impl = apply_impl


def _patch_the_language_once_per_launch() -> None:
    """Patch a language module for the interpreter once per kernel launch, not again at every jit-function call
    inside it (test-only; no-op if Triton's internals differ).

    A launch patches the language modules its kernel sees (``triton.language``, ``triton.language.core``) and
    restores them when the grid is done; each call of a jit helper inside the kernel patches the modules that
    helper sees again (``inspect.getmembers`` over the whole language: about half of the interpreter's time for
    kernels made of small helpers). A helper call is skipped when its modules were patched earlier in the same
    launch; a module patched for the first time is patched as Triton does."""
    import triton.language as tl
    from triton.runtime import interpreter

    patch_lang = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if patch_lang is None or scope_type is None or executor is None or not callable(executor.__call__):
        return
    launches: list[set[int]] = []  # per launch in progress: ids of the language modules patched in it
    launch = executor.__call__

    def launch_and_forget(self, *args, **kwargs):
        launches.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches.pop()

    def patch_once(fn):
        langs = {id(value) for value in fn.__globals__.values() if value is tl or value is tl.core}
        if launches and launches[-1] and langs <= launches[-1]:
            return scope_type()  # all patched already in this launch: nothing to patch, nothing to restore
        scope = patch_lang(fn)
        if launches:
            launches[-1] |= langs
        return scope

    executor.__call__ = launch_and_forget
    interpreter._patch_lang = patch_once


if os.environ.get("TRITON_INTERPRET") == "1":
    _install_fast_xor_reduction()
    _patch_the_language_once_per_launch()
