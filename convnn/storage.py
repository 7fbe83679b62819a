"""How a checkpoint's weights are stored: the state dict cast to fp16, bf16 or fp32, or int8 with scales.

int8 storage (card ``weights_dtype == "int8"``): every floating tensor with two or more dims (conv, linear and
Conv1D weights, position and class embeddings) is stored as int8 ``q`` with one symmetric scale per slice along
dim 0 (per output channel), ``scale[o] = max|w[o]| / 127`` (1 for an all-zero slice) and
``q = round(w / scale).clamp(-127, 127)``, so ``|q · scale - w| ≤ scale / 2``; the scales are an fp32 tensor of
shape (C_out,) in the same file under the key ``<name>::scale`` (:data:`INT8_SCALE_SUFFIX`). Other floating tensors
(biases, norm weights, running statistics) are stored in fp16, integer buffers as they are. Loading multiplies back
(:func:`convnn.checkpoint.load_checkpoint` returns an ordinary float model), after checking that every scale is
finite and > 0 and every weight finite.
"""

from __future__ import annotations

import torch
from torch import nn

from .card import WEIGHTS_DTYPES, CheckpointError

__all__ = ["INT8_SCALE_SUFFIX", "dequantize", "describe_problems", "not_finite", "shared_tensors", "storage_state",
           "weights_dtype_name"]

_SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # int8 scales: dtypes read back
INT8_SCALE_SUFFIX = "::scale"  # key of an int8 tensor's scales: "<name>::scale" ("::" is in no state-dict key)
_INT8_MAX = 127  # symmetric range [-127, 127]: -128 unused, so q and -q are both representable
_UNQUANTIZED_DTYPE = torch.float16  # int8 storage: how the floating tensors with ndim < 2 are stored


def describe_problems(problems: dict[str, list[str]]) -> str:
    """``{"missing": [a, b]}`` → ``"2 missing (e.g. a)"``, kinds without names left out, joined by commas."""
    return ", ".join(f"{len(names)} {kind} (e.g. {names[0]})" for kind, names in problems.items() if names)


def not_finite(state: dict[str, torch.Tensor]) -> list[str]:
    """The sorted names of the floating tensors of ``state`` that hold an inf or NaN."""
    return sorted(name for name, tensor in state.items()
                  if tensor.is_floating_point() and not torch.isfinite(tensor).all())


def _quantize_int8(weight: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8 quantisation of a floating tensor with ndim ≥ 2 (module docstring).

    The quotient ``w / scale`` is taken in float64, where it is exact enough for fp32 weights that ``q`` is ``w /
    scale`` rounded to nearest, hence ``|q · scale - w| ≤ scale / 2`` holds exactly.

    Returns:
        tuple[Tensor, Tensor]: ``q`` (same shape, int8) and ``scale`` (C_out,) float32, C_out = ``weight.shape[0]``.

    Raises:
        ValueError: ``weight`` has no elements; ``name`` is in the message.
    """
    if weight.numel() == 0:
        raise ValueError(f"{name}: shape {tuple(weight.shape)} has no elements, so it has no int8 scale")
    weight = weight.double()
    scale = (weight.abs().amax(dim=tuple(range(1, weight.dim()))) / _INT8_MAX).float()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # all-zero slice: q = 0, exact
    q = torch.round(weight / scale.double().view(-1, *[1] * (weight.dim() - 1))).clamp(-_INT8_MAX, _INT8_MAX)
    return q.to(torch.int8), scale


def shared_tensors(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """Names of ``state`` that are the very same tensor as an earlier one (tied weights): alias → first name.

    "The same tensor" means the same storage, offset, shape, strides and dtype, as for a module that assigns
    another module's parameter (``b.weight = a.weight``); the first name in state-dict order is the one stored.
    Tensors that only share part of a storage (a slice of another) are not aliases: they are stored as copies.
    """
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, tensor in state.items():
        if tensor.device.type == "meta":
            continue
        identity = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                    tuple(tensor.stride()), tensor.dtype)
        if identity in seen:
            aliases[name] = seen[identity]
        else:
            seen[identity] = name
    return aliases


def storage_state(model: nn.Module, dtype: torch.dtype | None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``model``'s state dict as it is written: floating tensors in ``dtype`` (int8: see the module docstring), each
    tied tensor once.

    Returns:
        tuple[dict[str, Tensor], dict[str, str]]: the tensors to store, and the tied names left out (alias → the
        stored name, :func:`shared_tensors`), which the loader restores from the stored one.

    Raises:
        ValueError: an empty tensor to store as int8; the message names it.
    """
    full = model.state_dict()
    aliases = shared_tensors(full)
    state = {}
    for name, tensor in full.items():
        if name in aliases:
            continue
        tensor = tensor.detach().cpu()
        if dtype == torch.int8 and tensor.is_floating_point() and tensor.dim() >= 2:
            state[name], state[name + INT8_SCALE_SUFFIX] = _quantize_int8(tensor, name)
        elif dtype is not None and tensor.is_floating_point():
            state[name] = tensor.to(_UNQUANTIZED_DTYPE if dtype == torch.int8 else dtype)
        else:
            state[name] = tensor.clone()  # its own memory: safetensors refuses tensors that share any
    return {name: tensor.contiguous() for name, tensor in state.items()}, aliases


def weights_dtype_name(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> str:
    """The card's ``weights_dtype`` of ``state`` stored with ``dtype``; None: the one dtype of its floating tensors.

    Raises:
        ValueError: ``state`` has no floating tensor, or (``dtype`` None) floating tensors of several dtypes or of
            one that is not in :data:`WEIGHTS_DTYPES`.
    """
    found = sorted({str(t.dtype).removeprefix("torch.") for t in state.values() if t.is_floating_point()})
    if not found:
        raise ValueError(f"the model's state dict has no floating-point tensor ({len(state)} tensors): nothing to save")
    if dtype is not None:
        return str(dtype).removeprefix("torch.")
    if len(found) != 1 or found[0] not in WEIGHTS_DTYPES:
        raise ValueError(f"dtype=None keeps each tensor's dtype, but the floating tensors are {found} and a card "
                         f"records one of {list(WEIGHTS_DTYPES)}: pass dtype")
    return found[0]


def dequantize(state: dict[str, torch.Tensor], scales: dict[str, torch.Tensor], own: dict[str, torch.Tensor],
                weights_dtype: str, source: str) -> dict[str, torch.Tensor]:
    """The stored state with its int8 tensors multiplied back by their scales (in float64, then cast to the model's
    dtype).

    Args:
        state (dict[str, Tensor]): the tensors of the weights file without the scales, each of the model's shape.
        scales (dict[str, Tensor]): the scales, keyed by their tensor's name (``INT8_SCALE_SUFFIX`` removed).
        own (dict[str, Tensor]): the state dict of the model built from the card (which tensors are floating, and
            their dtype).
        weights_dtype (str): the card's ``weights_dtype``.
        source (str): the file name, for messages.

    Raises:
        CheckpointError: int8 tensors or scales, or floating tensors of another dtype, while the card's
            ``weights_dtype`` is not ``"int8"``; or, when it is, an int8 tensor without a scale, a scale without an
            int8 tensor, a scale that is not a (C_out,) float16, bfloat16, float32 or float64 tensor of finite
            values > 0, or a floating tensor of two or more dims that is not stored as int8. The message names the
            file and a tensor. (A product that overflows the model's dtype is left to the caller's finite check.)
    """
    floating = {name for name, tensor in own.items() if tensor.is_floating_point()}
    quantized = {name for name in floating & state.keys() if state[name].dtype == torch.int8}
    if weights_dtype != "int8":
        if scales or quantized:
            raise CheckpointError(f"{source}: holds {len(quantized)} int8 tensors and {len(scales)} scales, but the "
                                  f"card says weights_dtype={weights_dtype!r}, not 'int8'")
        other = sorted(name for name in floating & state.keys() if state[name].dtype != getattr(torch, weights_dtype))
        if other:
            raise CheckpointError(f"{source}: the card says weights_dtype={weights_dtype!r}, but {len(other)} floating "
                                  f"tensors are stored otherwise (e.g. {other[0]}: {state[other[0]].dtype})")
        return state
    paired = quantized & scales.keys()
    misshaped = {name for name in paired
                 if scales[name].shape != state[name].shape[:1] or scales[name].dtype not in _SCALE_DTYPES}
    problems = {
        "int8 tensors without a scale": sorted(quantized - scales.keys()),
        "scales without an int8 tensor": sorted(scales.keys() - quantized),
        "scales not of shape (C_out,) or not float16, bfloat16, float32 or float64": sorted(misshaped),
        "scales not finite and > 0": sorted(
            name for name in paired - misshaped
            if not (torch.isfinite(scales[name]).all() and (scales[name] > 0).all())),
        "floating tensors with ndim ≥ 2 not stored as int8": sorted(
            name for name in (floating & state.keys()) - quantized if state[name].dim() >= 2),
    }
    if any(problems.values()):
        raise CheckpointError(f"{source}: the card says weights_dtype='int8' but the file has "
                              f"{describe_problems(problems)} (scales are stored as '<name>{INT8_SCALE_SUFFIX}')")
    for name in sorted(quantized):
        scale = scales[name].double().view(-1, *[1] * (state[name].dim() - 1))
        state[name] = (state[name].double() * scale).to(own[name].dtype)
    return state
