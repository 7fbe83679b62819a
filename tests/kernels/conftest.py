"""Kernel tests run on the GPU when there is one, else on CPU through Triton's interpreter (docs/kernel.md).

Without CUDA, ``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before anything imports Triton; this file replaces
the interpreter's element-by-element xor reduction (which ``tl.sort``/``tl.topk`` use for every compare-and-swap) with
``numpy.bitwise_xor.reduce``: the same result, about 40× faster here, patches the language once per kernel
launch instead of at every jit-helper call, skips the integer-overflow condition the interpreter computes for every
int32 add, sub and mul only to hand it to a ``device_assert`` that drops it (a quarter of the kernel tests' time), and
remembers the numpy dtype of each Triton dtype (the interpreter rebuilds a 19-entry table for every lookup). The hooks
only touch Triton's interpreter, only in this test session, and change no result.
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


def _skip_the_dropped_overflow_check() -> None:
    """Skip the interpreter's integer-overflow check where its assert is dropped (test-only; no-op if Triton's
    internals differ).

    ``sanitize_overflow`` is on in the interpreter's options, so every int32 add, sub and mul also casts both operands
    to int64, repeats the operation, compares it with the int32 range and hands the condition to ``device_assert`` —
    which returns without looking at it unless ``options.debug`` is set (it never is in the interpreter: a plain
    ``InterpreterOptions()``). With debug off the check is skipped after its two type asserts, its only other effect;
    with debug on it runs as Triton's."""
    from triton.runtime import interpreter

    semantic = getattr(interpreter, "interpreter_semantic", None)
    check = getattr(semantic, "binary_op_sanitize_overflow_impl", None)
    options = getattr(getattr(semantic, "builder", None), "options", None)
    if check is None or not hasattr(options, "debug") or not hasattr(semantic, "device_assert"):
        return

    def checked_only_in_debug(lhs, rhs, binary_op):
        if semantic.builder.options.debug:
            return check(lhs, rhs, binary_op)
        if lhs.type.scalar.int_bitwidth >= 64 or not semantic.builder.options.sanitize_overflow:
            return None
        assert lhs.type.scalar == rhs.type.scalar, (
            f"expected matching operand types, got {lhs.type.scalar} and {rhs.type.scalar}")
        assert lhs.type.scalar.is_int(), f"expected integer type, got {lhs.type.scalar}"
        return None

    semantic.binary_op_sanitize_overflow_impl = checked_only_in_debug


def _remember_numpy_dtypes() -> None:
    """Look up the numpy dtype of a Triton dtype once (test-only; no-op if Triton's internals differ): the
    interpreter's ``_get_np_dtype`` builds its table of 19 dtypes, each hashed, on every call (hundreds of thousands a
    test). Its result depends only on the element type (a block's, or the dtype itself; a pointer's is uint64 without
    the table), and dtypes compare by name, so the first answer for an element type is every later one's; a dtype it
    does not know raises as before."""
    import triton.language as tl
    from triton.runtime import interpreter

    lookup = getattr(interpreter, "_get_np_dtype", None)
    if lookup is None:
        return
    known = {}

    def get_np_dtype(tt_dtype):
        element = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(element, tl.pointer_type):  # uint64, before the table (and pointer types are unhashable)
            return lookup(element)
        if element not in known:
            known[element] = lookup(tt_dtype)
        return known[element]

    interpreter._get_np_dtype = get_np_dtype


if os.environ.get("TRITON_INTERPRET") == "1":
    _install_fast_xor_reduction()
    _patch_the_language_once_per_launch()
    _skip_the_dropped_overflow_check()
    _remember_numpy_dtypes()
