"""Autocast for the ConvNN aggregation: inside ``torch.autocast`` it computes in the autocast dtype, as ``F.conv2d``
and ``F.scaled_dot_product_attention`` do (docs/kernel.md, "Dtypes").

``torch.autocast`` casts the inputs of the operators it knows; a custom operator has to say what it does. This one
follows the lower-precision policy of convolutions and matmuls: every fp32, fp16 or bf16 tensor argument is cast
to the autocast dtype (:class:`Caster`), the reference runs with autocast off, scores and accumulators stay fp32
inside (the kernel's ``tl.dot`` accumulates in fp32, the reference promotes to fp32 before it sums), the output
comes back in the autocast dtype, and the backward returns each gradient in its input's own dtype: the fused
kernel's autograd takes the tensors passed beside casts made without autograd (``kernels.dispatch``), the
reference gets casts that carry gradients (:func:`linked`). fp64 tensors are left alone, as
autocast leaves them; outside autocast nothing changes (fp32 keeps IEEE fp32 selection).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

__all__ = ["Caster", "autocast_aware", "autocast_dtype", "linked"]

_CASTABLE = (torch.float32, torch.float16, torch.bfloat16)
F = TypeVar("F", bound=Callable)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype ``torch.autocast(device_type, ...)`` computes in where it is on for ``device_type``; else None."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


class Caster:
    """Casts tensors to ``dtype`` as autocast would: fp32/fp16/bf16 tensors to ``dtype`` (a contiguous copy,
    token-major rows), each tensor once however often it is passed (by identity, not id(): torch.compile traces
    `is`, not id() of a tensor); anything else (ints, int64 indices, bool masks, fp64 tensors, None) as it is."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self._casts: list[tuple[Tensor, Tensor]] = []  # (tensor, its copy)

    def __call__(self, x):
        if not (isinstance(x, Tensor) and x.dtype in _CASTABLE):
            return x
        for tensor, copy in self._casts:
            if tensor is x:
                return copy
        self._casts.append((x, x.to(self.dtype, memory_format=torch.contiguous_format)))
        return self._casts[-1][1]


def linked(originals: Sequence, computed: Sequence, dtype: torch.dtype) -> tuple:
    """``computed`` (casts of ``originals`` made without autograd, e.g. under ``torch.no_grad()``) with autograd to
    the originals: where grad mode is on and an original requires grad, it is cast again by a :class:`Caster`
    (differentiably, its gradient back in the original's dtype); every other entry of ``computed`` as it is."""
    if not torch.is_grad_enabled():
        return tuple(computed)
    cast = Caster(dtype)
    return tuple(cast(x) if isinstance(x, Tensor) and x.requires_grad and c is not x else c
                 for x, c in zip(originals, computed, strict=True))


def autocast_aware(fn: F) -> F:
    """Wrap ``fn`` so that under autocast for the device of its first tensor argument, its fp32/fp16/bf16 tensor
    arguments (positional and keyword) are cast to the autocast dtype (:class:`Caster`: q = k = v, a layer's own
    input, is cast once), and it runs with autocast off. Other arguments (ints, int64 indices, bool masks, fp64
    tensors, modules) pass as they are."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        first = next((x for x in (*args, *kwargs.values()) if isinstance(x, Tensor)), None)
        dtype = None if first is None else autocast_dtype(first.device.type)
        if dtype is None:
            return fn(*args, **kwargs)
        cast = Caster(dtype)
        with torch.autocast(first.device.type, enabled=False):
            return fn(*map(cast, args), **{name: cast(x) for name, x in kwargs.items()})

    return wrapper
