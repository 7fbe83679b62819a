"""Kernel tests run on the GPU when there is one, else on CPU through Triton's interpreter (docs/kernel.md).

Without CUDA, ``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before anything imports Triton; this file replaces
the interpreter's element-by-element xor reduction (which ``tl.sort``/``tl.topk`` use for every compare-and-swap) with
``numpy.bitwise_xor.reduce``: the same result, about 40× faster here. The hooks only touch Triton's interpreter,
only in this test session.
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


if os.environ.get("TRITON_INTERPRET") == "1":
    _install_fast_xor_reduction()
