"""The checked entry point :func:`knn_aggregate`: validates arguments once and picks the fused kernel or the reference.

Backend choice (``backend="auto"``): the fused Triton kernel for CUDA tensors when Triton imports and the call uses
only what the kernel implements (:func:`kernels.checks.fused_unsupported_reason`, the rule its launcher enforces:
cosine or scaled-dot-product similarity, no mask, K ≤ 128, one head or depthwise aggregation, fp32/bf16/fp16);
the PyTorch reference otherwise. ``"auto"`` defers, in this order, to the innermost :func:`use_backend` block (how a
training run applies its ``--backend``) and to the environment variable ``CONVNN_BACKEND`` (``reference`` |
``triton``, read at call time: a user's override for a whole process).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

from .autocast import Caster, autocast_dtype, linked
from .checks import check_knn_arguments, chosen, fused_unsupported_reason, triton_runs_on
from .reference import KnnResult, bind_options, knn_aggregate_reference, takes_options

__all__ = ["BACKENDS", "BACKEND_ENV_VAR", "knn_aggregate", "resolve_backend", "triton_available", "use_backend"]

BACKENDS = ("auto", "reference", "triton")
BACKEND_ENV_VAR = "CONVNN_BACKEND"
_CHOSEN: ContextVar[str] = ContextVar("convnn_backend", default="auto")  # set by use_backend


@contextmanager
def use_backend(backend: str) -> Iterator[None]:
    """Inside the block, ConvNN aggregations asked for ``backend="auto"`` resolve as ``backend`` (a layer built with
    an explicit backend keeps it). Blocks nest; each thread and task sees its own.

    Args:
        backend (str): ``"auto"``, ``"reference"`` or ``"triton"``.

    Raises:
        ValueError: an unknown backend.
    """
    with chosen(_CHOSEN, backend, BACKENDS, "backend"):
        yield


@torch.compiler.assume_constant_result  # a traced graph takes it as a constant (torch 2.11 traces no ContextVar)
def _chosen_backend() -> str:
    """The backend :func:`use_backend` chose for this thread or task, else the one :data:`BACKEND_ENV_VAR` names
    (``"auto"``: neither chose one).

    Raises:
        ValueError: the environment variable names no backend.
    """
    backend = _CHOSEN.get()
    if backend == "auto":
        backend = os.environ.get(BACKEND_ENV_VAR, "auto") or "auto"
        if backend not in BACKENDS:
            raise ValueError(f"{BACKEND_ENV_VAR} must be one of {BACKENDS}, got {backend!r}")
    return backend


@torch.compiler.assume_constant_result  # a traced graph takes the answer as a constant
def triton_available() -> bool:
    """Whether the fused kernel module imports (Triton installed and usable)."""
    return _triton_imports()


@functools.cache
def _triton_imports() -> bool:
    try:
        from . import knn_triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend: str, device: torch.device, unsupported: str | None = None) -> str:
    """Resolve ``"auto"`` (through :func:`use_backend` and ``CONVNN_BACKEND``) to ``"reference"`` or ``"triton"`` for
    tensors on ``device``.

    Args:
        backend (str): ``"auto"``, ``"reference"`` or ``"triton"``.
        device (torch.device): where the inputs live.
        unsupported (str, optional): why the fused kernel does not implement the requested call
            (:func:`kernels.checks.fused_unsupported_reason`); None if it does. Default: None

    Returns:
        str: ``"reference"`` or ``"triton"``.

    Raises:
        ValueError: unknown backend, or ``"triton"`` forced where it cannot run: no Triton, CPU tensors without
            ``TRITON_INTERPRET=1``, or a call the kernel does not implement (the message gives ``unsupported``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = _chosen_backend()
    runnable = triton_available() and triton_runs_on(device)
    if backend == "auto":
        return "triton" if runnable and unsupported is None and device.type == "cuda" else "reference"
    if backend == "triton" and not runnable:
        raise ValueError(f"backend='triton' needs Triton and CUDA tensors (or TRITON_INTERPRET=1), "
                         f"got device={device}")
    if backend == "triton" and unsupported is not None:
        raise ValueError(f"backend='triton': {unsupported}")
    return backend


@takes_options
def knn_aggregate(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, bias: Tensor | None = None, *,
                  attn_mask: Tensor | None = None, backend: str = "auto", **options) -> KnnResult:
    """ConvNN k-NN aggregation (METHOD §2–3), on the fused Triton kernel or the PyTorch reference.

    ``out[b, o, i] = bias[o] + Σ_t Σ_c weight[o, c, t] · ρ[b, i, t] · v[b, idx[b, i, t], c]`` with ``idx`` the
    top-K keys of query ``i`` by similarity (ties to the lower index). Indices carry no gradient; gradients reach
    ``v``, ``weight``, ``bias`` and, for ``weighting="softmax"``, ``q`` and ``k``. Inside ``torch.autocast`` the
    tensors are cast to the autocast dtype and scores, weights and sums accumulate in fp32
    (:mod:`kernels.autocast`); outside it, fp32 inputs give IEEE fp32 scores.

    Args:
        q (Tensor): (B, H, Nq, D) queries, float32, bfloat16, float16 (or float64 on the reference).
        k (Tensor): (B, H, Nk, D) keys, same dtype.
        v (Tensor): (B, H, Nk, Dv) values, same dtype.
        weight (Tensor): (C_out, H·Dv / groups, K) Conv1D weight; tap ``t`` weighs the rank-``t`` neighbour.
        bias (Tensor, optional): (C_out,) Conv1D bias. Default: None
        num_neighbors (int): K, 1 ≤ K ≤ number of candidates.
        similarity (str): ``"cosine"``, ``"dot"`` (q·k/√D) or ``"euclidean"`` (−‖q−k‖², reference only).
            Default: ``"cosine"``
        weighting (str): ρ: ``"none"``, ``"softmax"`` (over the K selected, with ``temperature``) or
            ``"uniform"`` (1/K). Default: ``"none"``
        temperature (float): softmax temperature, > 0. Default: 1.0
        groups (int): Conv1D groups; ``H·Dv`` is depthwise aggregation. Default: 1
        candidates (Tensor, optional): (B, r) or (1, r) int64 sampled keys per sample; the query itself is added
            (METHOD §3). Pass them on the CPU, as the layers do: they are range-checked there without a device
            sync and copied to q's device without blocking (on q's device the check syncs once). None: every key
            is a candidate. Default: None
        attn_mask (Tensor, optional): bool, broadcastable to (B, H, Nq, Nk), True = allowed (reference only).
        self_first (bool): force each query's own token to rank 0 (needs Nq = Nk). Default: False
        blend (BlendGrid, optional): select by the ``blend`` rule over the zero-padded map (METHOD §3): needs
            ``self_first=True``, no candidates, no mask; ``topk_idx`` counts padded cells. Default: None
        backend (str): ``"auto"``, ``"reference"`` or ``"triton"``. Default: ``"auto"``

    Returns:
        KnnResult: ``out`` (B, C_out, Nq) in the input dtype, ``topk_idx`` (B, H, Nq, K) int64, ``topk_weights``
        (B, H, Nq, K) fp32 (fp64 for fp64 inputs).

    Raises:
        ValueError: a shape, dtype or option outside its allowed range (the message names it), or an impossible K.
    """
    tensors = (q, k, v, weight, bias)
    dtype = autocast_dtype(q.device.type)
    if dtype is None:
        return _aggregate(tensors, None, None, attn_mask, backend, options)
    cast = Caster(dtype)
    with torch.no_grad():  # what the checks and the kernel read; autograd reaches the originals (_aggregate)
        # the weight's cast channel-major (C_out innermost), the layout the fused kernel reads: one copy, not two
        computed = (cast(q), cast(k), cast(v), cast(weight.permute(2, 1, 0)).permute(2, 1, 0), cast(bias))
    return _aggregate(computed, tensors, dtype, attn_mask, backend, options)


def _aggregate(tensors: tuple, originals: tuple | None, dtype: torch.dtype | None, attn_mask: Tensor | None,
               backend: str, options: dict) -> KnnResult:
    """:func:`knn_aggregate` on ``tensors`` (q, k, v, weight, bias), under autocast their casts to ``dtype`` made
    without autograd (``originals``: the tensors passed; both None outside autocast): the fused kernel's autograd
    takes the originals and returns their gradients in their own dtypes without a cast node between (none of its
    launches is an operator autocast changes); the reference gets casts (:func:`~kernels.autocast.linked`) that carry
    the gradients back, and runs with autocast off."""
    q, k, v, weight, bias = tensors
    num_neighbors, similarity, weighting, temperature, groups, self_first, candidates, blend = bind_options(
        "knn_aggregate", options)
    check_knn_arguments(q, k, v, weight, bias, num_neighbors, similarity, weighting, temperature, groups,
                        candidates, attn_mask, self_first, blend)
    unsupported = fused_unsupported_reason(q, k, v, weight, num_neighbors, similarity, groups, attn_mask, weighting,
                                           blend)
    if resolve_backend(backend, q.device, unsupported) == "triton":
        from .knn_triton.function import aggregate_prechecked

        return aggregate_prechecked(q, k, v, weight, bias, originals=originals, **options)  # checked above, once
    if originals is None:
        return knn_aggregate_reference(*tensors, attn_mask=attn_mask, **options)
    with torch.autocast(q.device.type, enabled=False):  # the reference's matmuls in the cast dtype, as the kernel's
        return knn_aggregate_reference(*linked(originals, tensors, dtype), attn_mask=attn_mask, **options)
