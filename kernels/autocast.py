"""Autocast for the ConvNN aggregation: inside ``torch.autocast`` it computes in the autocast dtype, as ``F.conv2d``
and ``F.scaled_dot_product_attention`` do (docs/kernel.md, "Dtypes").

``torch.autocast`` casts the inputs of the operators it knows; a custom operator has to say what it does. This one
follows the lower-precision policy of convolutions and matmuls: every fp32, fp16 or bf16 tensor argument is cast
to the autocast dtype, the body runs with autocast off, scores and accumulators stay fp32 inside (the kernel's
``tl.dot`` accumulates in fp32, the reference promotes to fp32 before it sums), the output comes back in the
autocast dtype, and the backward returns each gradient in its input's own dtype. fp64 tensors are left alone, as
autocast leaves them; outside autocast nothing changes (fp32 keeps IEEE fp32 selection).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

__all__ = ["autocast_aware", "autocast_dtype"]

_CASTABLE = (torch.float32, torch.float16, torch.bfloat16)
F = TypeVar("F", bound=Callable)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype ``torch.autocast(device_type, ...)`` computes in where it is on for ``device_type``; else None."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def autocast_aware(fn: F) -> F:
    """Wrap ``fn`` so that under autocast for the device of its first tensor argument, its fp32/fp16/bf16 tensor
    arguments (positional and keyword) are cast to the autocast dtype, each tensor once however often it is passed,
    and it runs with autocast off. Other arguments (ints, int64 indices, bool masks, fp64 tensors, modules) pass as
    they are."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        first = next((x for x in (*args, *kwargs.values()) if isinstance(x, Tensor)), None)
        dtype = None if first is None else autocast_dtype(first.device.type)
        if dtype is None:
            return fn(*args, **kwargs)

        casts: list[tuple[Tensor, Tensor]] = []  # (tensor, its copy): q = k = v (a layer's own input) is cast once

        def cast(x):
            if not (isinstance(x, Tensor) and x.dtype in _CASTABLE):
                return x
            for tensor, copy in casts:  # by identity, not id(): torch.compile traces `is`, not id() of a tensor
                if tensor is x:
                    return copy
            casts.append((x, x.to(dtype, memory_format=torch.contiguous_format)))  # token-major rows
            return casts[-1][1]

        with torch.autocast(first.device.type, enabled=False):
            return fn(*map(cast, args), **{name: cast(x) for name, x in kwargs.items()})

    return wrapper
