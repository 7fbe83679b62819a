"""Argument checks shared by the reference dispatch and the fused kernel's launcher."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from .reference import SIMILARITIES, WEIGHTINGS

FUSED_SIMILARITIES = ("cosine", "dot")  # what the fused kernel scores with
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what it loads; it accumulates in fp32
FUSED_MAX_NEIGHBORS = 128  # its K_PAD ≤ 128 keeps the [BLOCK_M, K_PAD] int64 top-K accumulator in registers
FUSED_MAX_ELEMENTS = 2**31  # its offsets within one tensor are int32
FUSED_MAX_BLEND_CELLS = 2**21  # the blend rule's padded cells: their rows are found in fp32 (forward.padded_position)


@contextmanager
def chosen(var: ContextVar[str], value: str, choices: tuple[str, ...], name: str) -> Iterator[None]:
    """Set ``var`` to ``value`` inside the block (blocks nest; each thread and task sees its own), after checking
    it is one of ``choices``: the one spelling of :func:`kernels.use_backend` and
    :func:`kernels.knn_triton.use_selection`.

    Raises:
        ValueError: ``value`` not in ``choices`` (the message names ``name``).
    """
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, read at call time)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_runs_on(device: torch.device) -> bool:
    """Whether Triton can run kernels on tensors of ``device``: CUDA, or any device in its CPU interpreter."""
    return device.type == "cuda" or interpreting()


def check_knn_arguments(q, k, v, weight, bias, num_neighbors, similarity, weighting, temperature, groups,
                        candidates, attn_mask, self_first, blend=None) -> None:
    """Raise ``ValueError`` for arguments of :func:`kernels.knn_aggregate` that no backend can run.

    Checks ranks and shapes (q, k, v, weight, bias, candidates), the option names, ``temperature > 0``, that
    ``groups`` divides C_in = H·Dv, and ``1 ≤ K ≤`` the number of candidates; the message names the argument. The
    candidates' values (key indices in range) are checked in eager mode only: inside ``torch.compile`` or
    ``torch.export`` a check of values would be a data-dependent branch (docs/method.md §9).
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (B, H, N, D), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, Nq, D = q.shape
    if min(*q.shape, *k.shape, *v.shape) < 1:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    for name, x in (("q", q), ("k", k), ("v", v), ("weight", weight)):
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if k.shape[:2] != (B, H) or k.shape[3] != D:
        raise ValueError(f"k must be (B={B}, H={H}, Nk, D={D}), got {tuple(k.shape)}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must be (B={B}, H={H}, Nk={k.shape[2]}, Dv), got {tuple(v.shape)}")
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    c_in = H * v.shape[3]
    if groups < 1 or c_in % groups:
        raise ValueError(f"groups must divide C_in = H·Dv = {c_in}, got {groups}")
    if weight.dim() != 3 or weight.shape[1] * groups != c_in or weight.shape[2] != num_neighbors:
        raise ValueError(
            f"weight must be (C_out, C_in/groups={c_in // groups}, K={num_neighbors}), got {tuple(weight.shape)}"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
    num_keys = k.shape[2]
    if blend is not None:
        if candidates is not None or attn_mask is not None or not self_first:
            raise ValueError("blend selection takes no candidates and no attn_mask, and ranks the query first "
                             "(self_first=True)")
        if not (Nq == num_keys == blend.height * blend.width):
            raise ValueError(f"blend needs Nq = Nk = height·width = {blend.height * blend.width}, got Nq={Nq}, "
                             f"Nk={num_keys}")
        if not 0 < blend.alpha < 1 or blend.window_size < 1 or blend.window_size % 2 == 0:
            raise ValueError(f"blend needs 0 < alpha < 1 (its ends are the window and all rules) and an odd "
                             f"window_size, got alpha={blend.alpha}, window_size={blend.window_size}")
        num_keys = blend.num_cells
    if (self_first or candidates is not None) and Nq != k.shape[2]:
        raise ValueError(f"self_first and candidates need Nq == Nk, got Nq={Nq}, Nk={num_keys}")
    if candidates is not None:
        if candidates.dim() != 2 or candidates.shape[0] not in (1, B) or candidates.dtype != torch.long:
            raise ValueError(f"candidates must be int64 (B={B} or 1, r), got {candidates.dtype} "
                             f"{tuple(candidates.shape)}")
        if candidates.numel() and not torch.compiler.is_compiling():  # a value check: eager only (no graph can
            # branch on data; in a traced model the layers' draws are key indices by construction, METHOD §9)
            low, high = (int(x) for x in torch.aminmax(candidates))  # free on the CPU, one sync on a device
            if low < 0 or high >= num_keys:
                raise ValueError(f"candidates must be key indices in [0, Nk={num_keys}), got values in "
                                 f"[{low}, {high}]")
        num_keys = candidates.shape[1] + 1  # the query itself is always a candidate
    if not 1 <= num_neighbors <= num_keys:
        raise ValueError(f"num_neighbors must be in [1, number of candidates={num_keys}], got {num_neighbors}")
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool:
            raise ValueError(f"attn_mask must be bool (True = allowed), got {attn_mask.dtype}")
        try:
            torch.broadcast_shapes(attn_mask.shape, (B, H, Nq, k.shape[2]))
        except RuntimeError as err:
            raise ValueError(f"attn_mask must broadcast to (B, H, Nq, Nk) = {(B, H, Nq, k.shape[2])}, "
                             f"got {tuple(attn_mask.shape)}") from err


def fused_unsupported_reason(q, k, v, weight, num_neighbors, similarity, groups, attn_mask, weighting="none",
                             blend=None) -> str | None:
    """Why the fused kernel does not implement a call that passed :func:`check_knn_arguments`; None if it does.

    It implements cosine and scaled-dot-product similarity without a mask, the blend rule with weighting none or
    uniform, K ≤ 128, a standard Conv1D on one head
    or a depthwise one (``groups = C_in = C_out = H·Dv``), ``v`` in fp32, bf16 or fp16 (q and k are run in v's
    dtype; not bf16 in Triton's interpreter, whose bf16 arithmetic is wrong: outputs off by ~1e10, silently) and
    tensors of fewer than 2**31 elements (a blend map of fewer than 2**21 padded cells). The one rule for the
    dispatch's backend choice and the launcher's ``ValueError``; the returned message names the argument and the
    value received.
    """
    B, H, Nq, _ = q.shape
    c_in = H * v.shape[3]
    if similarity not in FUSED_SIMILARITIES:
        return f"similarity must be one of {FUSED_SIMILARITIES} on the Triton kernel, got {similarity!r}"
    if attn_mask is not None:
        return "attn_mask is not implemented by the Triton kernel (use backend='reference')"
    if blend is not None and weighting == "softmax":
        return ("blend selection with softmax weighting runs on the reference: the kernel has no gradient through "
                "the blend's min–max normalisation")
    if groups == 1 and H != 1:
        return f"groups=1 (standard Conv1D) needs one head on the Triton kernel, got H={H}"
    if groups not in (1, c_in) or (groups > 1 and weight.shape[0] != c_in):
        return (f"groups must be 1 or H·Dv={c_in} with C_out = H·Dv (depthwise) on the Triton kernel, "
                f"got groups={groups}, C_out={weight.shape[0]}")
    if num_neighbors > FUSED_MAX_NEIGHBORS:
        return f"num_neighbors must be ≤ {FUSED_MAX_NEIGHBORS} on the Triton kernel, got {num_neighbors}"
    if v.dtype not in FUSED_DTYPES:
        return f"v must be one of {FUSED_DTYPES} on the Triton kernel, got {v.dtype}"
    if v.dtype == torch.bfloat16 and interpreting():
        return ("bfloat16 does not run correctly in Triton's interpreter (TRITON_INTERPRET=1): use float32 or "
                "float16 there, or a GPU")
    if max(q.numel(), k.numel(), v.numel(), B * H * Nq * num_neighbors) >= FUSED_MAX_ELEMENTS:
        return f"inputs with {FUSED_MAX_ELEMENTS} or more elements are not supported by the Triton kernel"
    if blend is not None and blend.num_cells >= FUSED_MAX_BLEND_CELLS:
        return (f"the blend rule's padded map must have fewer than {FUSED_MAX_BLEND_CELLS} cells on the Triton "
                f"kernel, got {blend.num_cells}")
    return None
