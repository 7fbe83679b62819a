"""Fused ConvNN k-NN aggregation in Triton: similarity, streaming exact top-K, weights and Conv1D, without an N×N
tensor (docs/kernel.md; the specification is :mod:`kernels.reference`).

For query ``i`` of sample ``b`` and head ``h`` (docs/method.md §2–3)::

    s_ij   = q̂_i·k̂_j  (cosine, x̂ = x / max(‖x‖, 1e-12))   or   q_i·k_j / √D  (dot)
    idx_i  = the K candidates j with the largest s_ij, rank 0 first, ties to the lower candidate index
    a_it   = 1 (none) | softmax_t(s_i,idx_it / τ) (softmax) | 1/K (uniform)
    out[b, o, i] = bias[o] + Σ_t Σ_c W[o, c, t] · a_it · v[idx_it, c]                  (groups = 1, H = 1)
    out[b, h·Dv + c, i] = bias[h·Dv + c] + Σ_t W[h·Dv + c, 0, t] · a_it · v[h, idx_it, c]   (groups = H·Dv)

Layout, as in Triton's fused-attention tutorial: :mod:`.select` (scores and the streaming top-K, jit helpers),
:mod:`.forward` (the forward kernels), :mod:`.backward` (the backward kernels), :mod:`.function` (launch
configuration, launchers, the autograd Function and the one public entry, :func:`knn_aggregate_triton`),
:mod:`.launch` (each launch, with Triton's per-call work cut to its choice of kernel).

Tiling. A program owns ``BLOCK_M`` queries of one (sample, head) and streams over the candidate keys in tiles of
``BLOCK_N``: one ``tl.dot`` gives the score tile, which never leaves registers. Candidates are either all Nk keys or
the r keys sampled per sample, gathered by index into the same tile, plus the query itself (METHOD §3; a sampled key
equal to the query is masked, so the query counts once). When there are too few query blocks to fill the GPU, the
candidate range is split across programs that write partial top-K lists, and a second launch merges them.

Non-finite scores follow the reference's rule: NaN → −∞, +∞ → the largest finite fp32, so NaN keys rank last and
weigh 0, and the forced query (+∞) stays strictly first.

Dtypes. q, k, v in fp32, bf16 or fp16 (all the same); scores, softmax and every accumulator are fp32. fp32 inputs
use ``input_precision="ieee"`` in ``tl.dot`` because TF32 scores change the selected set. The Conv1D runs on
``tl.dot`` in the input dtype with fp32 accumulation; ``out`` is stored in the input dtype. Under
``torch.autocast`` the layers and :func:`kernels.knn_aggregate` hand the kernel autocast-dtype operands
(:mod:`kernels.autocast`).

Backward reuses the forward's ``idx`` and ``a``; the scatters into dV/dK use fp32 atomics, or under
:func:`torch.are_deterministic_algorithms_enabled` a key-owned pass over the inverse index, in a fixed order. Only
the gradients autograd asks for are computed.
"""

from .function import knn_aggregate_triton, use_selection

__all__ = ["knn_aggregate_triton", "use_selection"]
