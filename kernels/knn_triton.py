"""Fused ConvNN k-NN aggregation in Triton: similarity, streaming top-K, gather, ρ and Conv1D without an N×N tensor.

For query ``i`` of sample ``b`` and head ``h`` (METHOD §2, the specification is :mod:`kernels.reference`)::

    s_ij   = q̂_i·k̂_j  (cosine, x̂ = x / max(‖x‖, 1e-12))   or   q_i·k_j / √D  (dot)
    idx_i  = the K candidates j with the largest s_ij, rank 0 first, ties to the lower candidate index
    a_it   = 1 (none) | softmax_t(s_i,idx_it / τ) (softmax) | 1/K (uniform)
    out[b, o, i] = bias[o] + Σ_t Σ_c W[o, c, t] · a_it · v[idx_it, c]                  (groups = 1, H = 1)
    out[b, h·Dv + c, i] = bias[h·Dv + c] + Σ_t W[h·Dv + c, 0, t] · a_it · v[h, idx_it, c]   (groups = H·Dv)

Tiling. A program owns ``BLOCK_M`` queries of one (sample, head) and streams over the candidate keys in tiles of
``BLOCK_N``: one ``tl.dot`` gives the [BLOCK_M, BLOCK_N] score tile, which never leaves registers. Candidates are
either all Nk keys or the r keys sampled per sample (``candidates``), gathered by index into the same tile, plus the
query itself as column 0 (METHOD §3; a sampled key equal to the query scores −∞ so the query counts once). When
there are too few query blocks to fill the GPU, the candidate range is split across ``num_splits`` programs that
write partial top-K lists, and a second launch (``_knn_fwd_merge``) merges them.

Running top-K. Each score is packed with its candidate column into one int64 key: the high 32 bits hold an
order-preserving int32 image of the fp32 score, the low 32 bits ``0x7FFFFFFF − column``, so a larger key is a larger
score and, among equal scores, the lower column (docs/kernel.md). ``self_first`` ranks the query's own candidate with
score +∞ (its real score is restored for the weights). The accumulator keeps ``K_PAD`` = next power of two ≥ K keys
per query: ``acc = max(bitonic_merge(acc), topk(tile, K_PAD))`` (the max of an ascending and a descending sorted
list is the top half of their union, as a bitonic sequence). Only scores above a row's current K-th can enter: a
tile without any costs one compare, and rows with a few are inserted one row maximum at a time instead of sorting
the whole tile (the top-K selection, not the GEMM, dominates the forward: docs/kernel.md).

Non-finite scores follow the reference's rule (:mod:`kernels.reference`): each score tile is canonicalised (NaN →
−∞, +∞ → the largest finite fp32) before it is ranked, so NaN keys rank last and weigh 0, and the forced query
(+∞) stays strictly first.

Dtypes. q, k, v in fp32, bf16 or fp16 (all the same); scores, softmax and every accumulator are fp32. fp32 inputs
use ``input_precision="ieee"`` in ``tl.dot`` because TF32 scores change the selected set (docs/kernel.md). The Conv1D
runs on ``tl.dot`` in the input dtype with fp32 accumulation; ``out`` is stored in the input dtype.

Backward reuses the forward's ``idx`` (int32) and weights ``a`` (fp32); nothing is re-selected. With
``dG_it = Σ_o dO_io W[o, :, t]``: ``dV[idx_it] += a_it dG_it``, ``da_it = ⟨dG_it, v[idx_it]⟩``, and for softmax
``ds = a (da − Σ_t a da) / τ``, ``dq_i = Σ_t ds_it ∂s/∂q_i`` (owned by the query, no atomics), ``dk_j += ds_it ∂s/∂k_j``
(through the cosine normalisation, applied on the host). The scatters ``dV``/``dK`` use fp32 ``tl.atomic_add``;
under :func:`torch.are_deterministic_algorithms_enabled` the per-(query, slot) contributions are written out
instead and summed by a key-owned pass over the inverse index (a stable sort of ``idx``), in a fixed order.
``dW`` is reduced from per-program partials (no atomics), ``db`` is ``Σ dO``. Only the gradients autograd asks for
are computed: a frozen weight skips the standard ``dW`` launch (the depthwise ``dW`` partials come out of the
query-owned kernel, only their reduction is skipped), frozen q and k skip the softmax part of that kernel, and
frozen q, k, v skip that kernel altogether for a standard Conv1D.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .checks import check_knn_arguments, fused_unsupported_reason, triton_runs_on
from .reference import KnnResult
from .usage import note_backend

__all__ = ["knn_aggregate_triton"]

# ---------------------------------------------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------------------------------------------
NORM_EPS = 1e-12  # F.normalize's eps: x̂ = x / max(‖x‖, eps)
_NORM_EPS = tl.constexpr(NORM_EPS)
_INDEX_MASK = tl.constexpr(0x7FFFFFFF)  # low half of the packed key: column ^ mask = 0x7FFFFFFF − column
_PAD_KEY = tl.constexpr(-(2**63))  # an empty slot: below the packed −inf of every real candidate
_NEG_INF = tl.constexpr(float("-inf"))
_POS_INF = tl.constexpr(float("inf"))  # the ranking score of a forced (self_first) candidate
_MAX_SCORE = tl.constexpr(torch.finfo(torch.float32).max)  # +∞ scores count as this (reference.canonical_scores)

_WEIGHTINGS = {"none": 0, "softmax": 1, "uniform": 2}
_TARGET_PROGRAMS_PER_SM = 2  # a grid of fewer programs than SMs is split up to about this many programs per SM
_MIN_TILES_PER_SPLIT = 4  # never split a candidate range into pieces of fewer key tiles
_MAX_SPLITS = 16
# Sizes and run-time flags only bound loops and masks: not specialising them on divisibility by 16 (Triton's default)
# saves a recompilation for every new N, K or channel count.
_UNSPECIALIZED_FWD = ["H", "Nq", "num_cols", "cols_per_split", "num_splits", "num_neighbors", "D", "Dv", "C_out",
                      "weighting", "self_first", "has_bias"]


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------
@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b with fp32 accumulation; exact fp32 products for fp32 inputs (TF32 changes selections)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _inv_norm(x):
    """1 / max(‖x‖, eps) per row of an fp32 [rows, D] block (F.normalize semantics)."""
    return 1.0 / tl.maximum(tl.sqrt(tl.sum(x * x, axis=1)), _NORM_EPS)


@triton.jit
def _canonical(s):
    """The reference's rule for non-finite scores: NaN → −∞, +∞ → the largest finite fp32."""
    return tl.where(s != s, _NEG_INF, tl.where(s > _MAX_SCORE, _MAX_SCORE, s))


@triton.jit
def _pack_score_index(scores, cols):
    """int64 key: order-preserving int32 image of the fp32 score (high) | 0x7FFFFFFF − column (low)."""
    scores = tl.where(scores == 0.0, 0.0, scores)  # −0.0 and +0.0 must tie
    bits = scores.to(tl.int32, bitcast=True)
    image = bits ^ ((bits >> 31) & _INDEX_MASK)  # negative floats: reverse their order
    return (image.to(tl.int64) << 32) | (cols ^ _INDEX_MASK).to(tl.int64)


@triton.jit
def _unpack_score(keys):
    image = (keys >> 32).to(tl.int32)
    bits = image ^ ((image >> 31) & _INDEX_MASK)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _unpack_column(keys):
    return ((keys & _INDEX_MASK) ^ _INDEX_MASK).to(tl.int32)


@triton.jit
def _column(x, slots, t):
    """x[:, t] of a [rows, K_PAD] block, t a run-time integer."""
    return tl.sum(tl.where(slots[None, :] == t, x, 0), axis=1)


@triton.jit
def _kth_key(acc, slots, num_neighbors, K_PAD: tl.constexpr):
    """The K-th largest key per row of an ascending [rows, K_PAD] accumulator."""
    return tl.max(tl.where(slots[None, :] + num_neighbors == K_PAD, acc, _PAD_KEY), axis=1)


@triton.jit
def _threshold(acc, slots, num_neighbors, K_PAD: tl.constexpr):
    """Per row: the score a candidate must beat to enter the top K (fp32), and whether K candidates are held."""
    kth = _kth_key(acc, slots, num_neighbors, K_PAD)
    return _unpack_score(kth), kth != _PAD_KEY


@triton.jit
def _merge_tile(acc, threshold, full, s, start, mask_n, slots, num_neighbors, K_PAD: tl.constexpr,
                BLOCK_N: tl.constexpr, FEW_ENTRIES: tl.constexpr):
    """Merge a [rows, BLOCK_N] score tile into the ascending running top-K keys (slots of the top K stay exact).

    Only scores above a row's current K-th (``threshold``, kept up to date here) can enter; equal scores cannot,
    since every earlier candidate has a lower column. Tiles without such scores cost a compare; rows with at most
    FEW_ENTRIES are inserted one row maximum at a time (argmax with the lower column on ties, exactly the key
    order); otherwise the tile is packed and its top K_PAD merged: max(ascending acc, descending topk) holds the
    top K_PAD of the union as a bitonic sequence. Returns (acc, threshold, full).
    """
    above = (s > threshold[:, None]) & mask_n[None, :]  # [rows, BLOCK_N]
    count = tl.where(full, tl.sum(above.to(tl.int32), axis=1), FEW_ENTRIES + 1)
    most = tl.max(count, axis=0)
    if most > FEW_ENTRIES:
        keys = tl.where(mask_n[None, :], _pack_score_index(s, start + tl.arange(0, BLOCK_N)), _PAD_KEY)
        acc = tl.bitonic_merge(tl.maximum(acc, tl.topk(keys, K_PAD)))
    elif most > 0:
        offs_n = tl.arange(0, BLOCK_N)
        for _ in range(most):
            best, best_at = tl.max(tl.where(above, s, _NEG_INF), axis=1, return_indices=True,
                                   return_indices_tie_break_left=True)  # [rows]
            new = tl.where(best > _NEG_INF, _pack_score_index(best, start + best_at), _PAD_KEY)
            acc = tl.bitonic_merge(tl.maximum(acc, tl.where(slots[None, :] == 0, new[:, None], _PAD_KEY)))
            above = above & (offs_n[None, :] != best_at[:, None])
    if most > 0:
        threshold, full = _threshold(acc, slots, num_neighbors, K_PAD)
    return acc, threshold, full


@triton.jit
def _self_scores(q, q_scale, k_rows_ptrs, mask_md, COSINE: tl.constexpr):
    """s_ii for each query row: q [BLOCK_M, D_PAD] fp32 against its own key row."""
    k_self = tl.load(k_rows_ptrs, mask=mask_md, other=0.0).to(tl.float32)  # [BLOCK_M, D_PAD]
    s = tl.sum(q * k_self, axis=1) * q_scale
    if COSINE:
        s = s * _inv_norm(k_self)
    return _canonical(s)


@triton.jit
def _finish(
    acc, b, h, pid_bh, offs_m, mask_m, slots,
    Q, K, V, W, Bias, Cand, Out, Idx, A,
    Nq, num_neighbors, Dv, C_out, D,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_wo, stride_wc, stride_wt,
    stride_cb,
    stride_ob, stride_oc, stride_on,
    scale, inv_temperature, weighting, self_first, has_bias,
    COSINE: tl.constexpr, CANDIDATES: tl.constexpr, DEPTHWISE: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_O: tl.constexpr,
):
    """From the final (descending) top-K keys: indices, weights a, then the Conv1D over rank slots."""
    mask_mk = mask_m[:, None] & (slots[None, :] < num_neighbors)  # [BLOCK_M, K_PAD]
    scores = _unpack_score(acc)
    cols = _unpack_column(acc)
    if self_first != 0:  # the forced key carries no score: rank 0 is the query itself, give it its real score
        offs_d = tl.arange(0, D_PAD)
        mask_md = mask_m[:, None] & (offs_d[None, :] < D)
        q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=mask_md, other=0.0).to(tl.float32)
        if COSINE:
            q_scale = _inv_norm(q)
        else:
            q_scale = tl.zeros([BLOCK_M], tl.float32) + scale
        k_ptrs = K + b * stride_kb + h * stride_kh + offs_m[:, None] * stride_kn + offs_d[None, :] * stride_kd
        s_self = _self_scores(q, q_scale, k_ptrs, mask_md, COSINE)
        scores = tl.where(slots[None, :] == 0, s_self[:, None], scores)
    if CANDIDATES:  # column 0 is the query, column c ≥ 1 the sampled key candidates[b, c − 1]
        sampled = tl.load(Cand + b * stride_cb + (cols - 1), mask=mask_mk & (cols > 0), other=0).to(tl.int32)
        keys_idx = tl.where(cols == 0, offs_m[:, None], sampled)
    else:
        keys_idx = cols
    keys_idx = tl.where(mask_mk, keys_idx, 0)
    valid = mask_mk & (scores > _NEG_INF)
    if weighting == 1:  # exp((s − s_max) / τ): saturated scores share the weight instead of giving NaN
        top = tl.max(tl.where(valid, scores, _NEG_INF), axis=1)
        top = tl.where(top > _NEG_INF, top, 0.0)  # rows past Nq, or without a valid slot
        e = tl.where(valid, tl.exp((scores - top[:, None]) * inv_temperature), 0.0)
        a = e / tl.maximum(tl.sum(e, axis=1), 1.0)[:, None]  # the row maximum contributes exp(0) = 1
    elif weighting == 2:
        a = valid.to(tl.float32)
        a = a / tl.maximum(tl.sum(a, axis=1), 1.0)[:, None]
    else:
        a = valid.to(tl.float32)
    out_ptrs = pid_bh.to(tl.int64) * Nq * num_neighbors + offs_m[:, None] * num_neighbors + slots[None, :]
    tl.store(Idx + out_ptrs, keys_idx, mask=mask_mk)
    tl.store(A + out_ptrs, a, mask=mask_mk)

    # Conv1D over rank slots: loop over neighbours at run time (static unrolling compiles for minutes at K = 32).
    v_base = V + b * stride_vb + h * stride_vh
    dtype = V.dtype.element_ty
    if DEPTHWISE:
        for c0 in range(0, Dv, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            mask_c = offs_c < Dv
            mask_mc = mask_m[:, None] & mask_c[None, :]
            chan = h * Dv + offs_c
            out = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
            for t in range(num_neighbors):
                j_t = _column(keys_idx, slots, t)
                a_t = _column(a, slots, t)
                g = tl.load(v_base + j_t[:, None] * stride_vn + offs_c[None, :] * stride_vd, mask=mask_mc, other=0.0)
                w_t = tl.load(W + chan * stride_wo + t * stride_wt, mask=mask_c, other=0.0).to(tl.float32)
                out += g.to(tl.float32) * a_t[:, None] * w_t[None, :]
            if has_bias != 0:
                out += tl.load(Bias + chan, mask=mask_c, other=0.0).to(tl.float32)[None, :]
            o_ptrs = Out + b * stride_ob + chan[None, :] * stride_oc + offs_m[:, None] * stride_on
            tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=mask_mc)
    else:
        for o0 in range(0, C_out, BLOCK_O):
            offs_o = o0 + tl.arange(0, BLOCK_O)
            mask_o = offs_o < C_out
            out = tl.zeros([BLOCK_M, BLOCK_O], tl.float32)
            for t in range(num_neighbors):
                j_t = _column(keys_idx, slots, t)
                a_t = _column(a, slots, t)
                for c0 in range(0, Dv, BLOCK_C):
                    offs_c = c0 + tl.arange(0, BLOCK_C)
                    mask_c = offs_c < Dv
                    g_ptrs = v_base + j_t[:, None] * stride_vn + offs_c[None, :] * stride_vd
                    g = tl.load(g_ptrs, mask=mask_m[:, None] & mask_c[None, :], other=0.0)  # [BLOCK_M, BLOCK_C]
                    g = (g.to(tl.float32) * a_t[:, None]).to(dtype)
                    w_ptrs = W + offs_o[None, :] * stride_wo + offs_c[:, None] * stride_wc + t * stride_wt
                    w_t = tl.load(w_ptrs, mask=mask_c[:, None] & mask_o[None, :], other=0.0)  # [BLOCK_C, BLOCK_O]
                    out += _dot(g, w_t.to(dtype), IEEE)
            if has_bias != 0:
                out += tl.load(Bias + offs_o, mask=mask_o, other=0.0).to(tl.float32)[None, :]
            o_ptrs = Out + b * stride_ob + offs_o[None, :] * stride_oc + offs_m[:, None] * stride_on
            tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_o[None, :])


# ---------------------------------------------------------------------------------------------------------------
# Forward kernels
# ---------------------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=_UNSPECIALIZED_FWD)
def _knn_fwd(
    # tensors
    Q, K, V, W, Bias, Cand, Out, Idx, A, Part,
    # sizes
    H, Nq, num_cols, cols_per_split, num_neighbors, D, Dv, C_out,
    # strides
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_wo, stride_wc, stride_wt,
    stride_cb,
    stride_ob, stride_oc, stride_on,
    # scalars and run-time flags
    scale, inv_temperature, weighting, self_first, has_bias,
    # flags
    COSINE: tl.constexpr, CANDIDATES: tl.constexpr, DEPTHWISE: tl.constexpr, IEEE: tl.constexpr,
    SPLIT: tl.constexpr,
    # blocks
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr, K_PAD: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_O: tl.constexpr, FEW_ENTRIES: tl.constexpr,
):
    """Scores + streaming top-K over one split of the candidates; without a split also weights and Conv1D."""
    tl.static_assert(BLOCK_N >= K_PAD)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < Nq
    offs_d = tl.arange(0, D_PAD)
    mask_d = offs_d < D
    slots = tl.arange(0, K_PAD)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=mask_m[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_M, D_PAD]
    if COSINE:
        q_scale = _inv_norm(q.to(tl.float32))
    else:
        q_scale = tl.zeros([BLOCK_M], tl.float32) + scale
    k_base = K + b * stride_kb + h * stride_kh

    acc = tl.full([BLOCK_M, K_PAD], _PAD_KEY, tl.int64)  # ascending between merges
    col_lo = pid_s * cols_per_split
    col_hi = tl.minimum(col_lo + cols_per_split, num_cols)
    if CANDIDATES:  # column 0: the query itself, always a candidate (owned by split 0)
        col_lo += 1
        col_hi += 1
        if pid_s == 0:
            k_self_ptrs = k_base + offs_m[:, None] * stride_kn + offs_d[None, :] * stride_kd
            s_self = _self_scores(q.to(tl.float32), q_scale, k_self_ptrs, mask_m[:, None] & mask_d[None, :], COSINE)
            if self_first != 0:
                s_self = tl.zeros([BLOCK_M], tl.float32) + _POS_INF
            self_key = _pack_score_index(s_self, tl.zeros([BLOCK_M], tl.int32))
            acc = tl.where(slots[None, :] == K_PAD - 1, self_key[:, None], acc)

    threshold, full = _threshold(acc, slots, num_neighbors, K_PAD)
    for start in range(col_lo, col_hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask_n = cols < col_hi
        if CANDIDATES:
            key_rows = tl.load(Cand + b * stride_cb + (cols - 1), mask=mask_n, other=0)
        else:
            key_rows = cols
        k_ptrs = k_base + key_rows[:, None] * stride_kn + offs_d[None, :] * stride_kd
        k = tl.load(k_ptrs, mask=mask_n[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_N, D_PAD]
        s = _dot(q, tl.trans(k), IEEE)  # [BLOCK_M, BLOCK_N] fp32
        s = s * q_scale[:, None]
        if COSINE:
            s = s * _inv_norm(k.to(tl.float32))[None, :]
        s = _canonical(s)
        if CANDIDATES:  # a sampled key equal to the query is masked: the query is column 0 already
            s = tl.where(key_rows[None, :] == offs_m[:, None], _NEG_INF, s)
        else:
            if self_first != 0:
                s = tl.where(cols[None, :] == offs_m[:, None], _POS_INF, s)
        acc, threshold, full = _merge_tile(acc, threshold, full, s, start, mask_n, slots, num_neighbors, K_PAD,
                                           BLOCK_N, FEW_ENTRIES)
    acc = tl.bitonic_merge(acc, descending=True)  # [BLOCK_M, K_PAD], rank 0 first

    if SPLIT:
        num_splits = tl.num_programs(2)
        part_rows = (pid_bh.to(tl.int64) * num_splits + pid_s) * Nq + offs_m
        tl.store(Part + part_rows[:, None] * K_PAD + slots[None, :], acc, mask=mask_m[:, None])
    else:
        _finish(acc, b, h, pid_bh, offs_m, mask_m, slots, Q, K, V, W, Bias, Cand, Out, Idx, A,
                Nq, num_neighbors, Dv, C_out, D,
                stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                stride_vb, stride_vh, stride_vn, stride_vd, stride_wo, stride_wc, stride_wt, stride_cb,
                stride_ob, stride_oc, stride_on, scale, inv_temperature, weighting, self_first, has_bias,
                COSINE, CANDIDATES, DEPTHWISE, IEEE,
                BLOCK_M, D_PAD, K_PAD, BLOCK_C, BLOCK_O)


@triton.jit(do_not_specialize=_UNSPECIALIZED_FWD)
def _knn_fwd_merge(
    # tensors
    Q, K, V, W, Bias, Cand, Out, Idx, A, Part,
    # sizes
    H, Nq, num_splits, num_neighbors, D, Dv, C_out,
    # strides
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_wo, stride_wc, stride_wt,
    stride_cb,
    stride_ob, stride_oc, stride_on,
    # scalars and run-time flags
    scale, inv_temperature, weighting, self_first, has_bias,
    # flags
    COSINE: tl.constexpr, CANDIDATES: tl.constexpr, DEPTHWISE: tl.constexpr, IEEE: tl.constexpr,
    # blocks
    BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_O: tl.constexpr,
):
    """Merge the per-split top-K lists (each sorted descending), then weights and Conv1D as in ``_knn_fwd``."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < Nq
    slots = tl.arange(0, K_PAD)
    acc = tl.full([BLOCK_M, K_PAD], _PAD_KEY, tl.int64)
    for split in range(num_splits):
        part_rows = (pid_bh.to(tl.int64) * num_splits + split) * Nq + offs_m
        part = tl.load(Part + part_rows[:, None] * K_PAD + slots[None, :], mask=mask_m[:, None], other=_PAD_KEY)
        acc = tl.maximum(tl.bitonic_merge(acc), part)
    acc = tl.bitonic_merge(acc, descending=True)
    _finish(acc, b, h, pid_bh, offs_m, mask_m, slots, Q, K, V, W, Bias, Cand, Out, Idx, A,
            Nq, num_neighbors, Dv, C_out, D,
            stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
            stride_vb, stride_vh, stride_vn, stride_vd, stride_wo, stride_wc, stride_wt, stride_cb,
            stride_ob, stride_oc, stride_on, scale, inv_temperature, weighting, self_first, has_bias,
            COSINE, CANDIDATES, DEPTHWISE, IEEE,
            BLOCK_M, D_PAD, K_PAD, BLOCK_C, BLOCK_O)


# ---------------------------------------------------------------------------------------------------------------
# Backward kernels
# ---------------------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["H", "Nq", "Nk", "num_neighbors", "D", "Dv", "C_out"])
def _knn_bwd_dvqk(
    # tensors
    Q, K, V, W, Idx, A, GradA, DOut, DQ, DK, DV, DWPart,
    # sizes
    H, Nq, Nk, num_neighbors, D, Dv, C_out,
    # strides
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_wo, stride_wc, stride_wt,
    stride_dob, stride_doc, stride_don,
    # scalars
    scale, inv_temperature,
    # flags
    COSINE: tl.constexpr, SOFTMAX: tl.constexpr, DEPTHWISE: tl.constexpr, DETERMINISTIC: tl.constexpr,
    HAS_GRAD_A: tl.constexpr, IEEE: tl.constexpr,
    # blocks
    BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_O: tl.constexpr,
):
    """Query-owned backward: dV scatter, da → ds (softmax), dq, dk scatter; depthwise dW partials.

    DV is (BH, Nk, Dv) fp32 (atomics) or (BH, Nq·K, Dv) per-(query, slot) contributions (DETERMINISTIC); likewise
    DK with D. For cosine, DQ and DK receive gradients w.r.t. the normalised q̂ and k̂.
    """
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < Nq
    slots = tl.arange(0, K_PAD)
    mask_mk = mask_m[:, None] & (slots[None, :] < num_neighbors)
    row_ptrs = pid_bh.to(tl.int64) * Nq * num_neighbors + offs_m[:, None] * num_neighbors + slots[None, :]
    idx = tl.load(Idx + row_ptrs, mask=mask_mk, other=0)  # [BLOCK_M, K_PAD] int32
    a = tl.load(A + row_ptrs, mask=mask_mk, other=0.0)  # [BLOCK_M, K_PAD] fp32
    entry = offs_m.to(tl.int64) * num_neighbors  # first (query, slot) entry of each row
    v_base = V + b * stride_vb + h * stride_vh
    dtype = V.dtype.element_ty
    da = tl.zeros([BLOCK_M, K_PAD], tl.float32)

    for t in range(num_neighbors):
        j_t = _column(idx, slots, t)
        a_t = _column(a, slots, t)
        for c0 in range(0, Dv, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            mask_c = offs_c < Dv
            mask_mc = mask_m[:, None] & mask_c[None, :]
            if DEPTHWISE:
                chan = h * Dv + offs_c
                do_ptrs = DOut + b * stride_dob + chan[None, :] * stride_doc + offs_m[:, None] * stride_don
                d_out = tl.load(do_ptrs, mask=mask_mc, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_C]
                w_t = tl.load(W + chan * stride_wo + t * stride_wt, mask=mask_c, other=0.0).to(tl.float32)
                dg = d_out * w_t[None, :]
            else:
                dg = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
                for o0 in range(0, C_out, BLOCK_O):
                    offs_o = o0 + tl.arange(0, BLOCK_O)
                    mask_o = offs_o < C_out
                    do_ptrs = DOut + b * stride_dob + offs_o[None, :] * stride_doc + offs_m[:, None] * stride_don
                    d_out = tl.load(do_ptrs, mask=mask_m[:, None] & mask_o[None, :], other=0.0)  # [BLOCK_M, BLOCK_O]
                    w_ptrs = W + offs_o[:, None] * stride_wo + offs_c[None, :] * stride_wc + t * stride_wt
                    w_t = tl.load(w_ptrs, mask=mask_o[:, None] & mask_c[None, :], other=0.0)  # [BLOCK_O, BLOCK_C]
                    dg += _dot(d_out.to(dtype), w_t.to(dtype), IEEE)
            if SOFTMAX or DEPTHWISE:
                v_ptrs = v_base + j_t[:, None] * stride_vn + offs_c[None, :] * stride_vd
                v_t = tl.load(v_ptrs, mask=mask_mc, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_C]
                if SOFTMAX:
                    da = tl.where(slots[None, :] == t, da + tl.sum(dg * v_t, axis=1)[:, None], da)
                if DEPTHWISE:
                    dw = tl.sum(d_out * a_t[:, None] * v_t, axis=0)  # [BLOCK_C]
                    dw_ptrs = DWPart + ((pid_m * tl.num_programs(1) + pid_bh) * Dv + offs_c) * num_neighbors + t
                    tl.store(dw_ptrs, dw, mask=mask_c)
            contrib = dg * a_t[:, None]
            if DETERMINISTIC:
                dv_ptrs = DV + (pid_bh.to(tl.int64) * Nq * num_neighbors + entry + t)[:, None] * Dv + offs_c[None, :]
                tl.store(dv_ptrs, contrib, mask=mask_mc)
            else:
                dv_ptrs = DV + (pid_bh.to(tl.int64) * Nk + j_t)[:, None] * Dv + offs_c[None, :]
                tl.atomic_add(dv_ptrs, contrib, mask=mask_mc, sem="relaxed")

    if SOFTMAX:
        if HAS_GRAD_A:
            da += tl.load(GradA + row_ptrs, mask=mask_mk, other=0.0)
        ds = a * (da - tl.sum(a * da, axis=1)[:, None]) * inv_temperature  # [BLOCK_M, K_PAD]
        offs_d = tl.arange(0, D_PAD)
        mask_d = offs_d < D
        mask_md = mask_m[:, None] & mask_d[None, :]
        q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=mask_md, other=0.0).to(tl.float32)
        if COSINE:
            q = q * _inv_norm(q)[:, None]  # ∂s/∂k̂ = q̂
        else:
            q = q * scale  # ∂s/∂k = q / √D
        k_base = K + b * stride_kb + h * stride_kh
        dq = tl.zeros([BLOCK_M, D_PAD], tl.float32)
        for t in range(num_neighbors):
            j_t = _column(idx, slots, t)
            ds_t = _column(ds, slots, t)
            k_t = tl.load(k_base + j_t[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=mask_md, other=0.0)
            k_t = k_t.to(tl.float32)
            if COSINE:
                k_t = k_t * _inv_norm(k_t)[:, None]
            else:
                k_t = k_t * scale
            dq += ds_t[:, None] * k_t
            contrib = ds_t[:, None] * q
            if DETERMINISTIC:
                dk_ptrs = DK + (pid_bh.to(tl.int64) * Nq * num_neighbors + entry + t)[:, None] * D + offs_d[None, :]
                tl.store(dk_ptrs, contrib, mask=mask_md)
            else:
                dk_ptrs = DK + (pid_bh.to(tl.int64) * Nk + j_t)[:, None] * D + offs_d[None, :]
                tl.atomic_add(dk_ptrs, contrib, mask=mask_md, sem="relaxed")
        dq_ptrs = DQ + (pid_bh.to(tl.int64) * Nq + offs_m)[:, None] * D + offs_d[None, :]
        tl.store(dq_ptrs, dq, mask=mask_md)


@triton.jit(do_not_specialize=["Nq", "num_rows", "rows_per_split", "num_neighbors", "Dv", "C_out"])
def _knn_bwd_dw(
    # tensors
    V, Idx, A, DOut, DWPart,
    # sizes
    Nq, num_rows, rows_per_split, num_neighbors, Dv, C_out,
    # strides
    stride_vb, stride_vn, stride_vd,
    stride_dob, stride_doc, stride_don,
    # flags
    IEEE: tl.constexpr,
    # blocks
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_O: tl.constexpr,
):
    """Standard Conv1D weight gradient, dW[o, c, t] = Σ_(b,i) dO[b, o, i] · a_it · v[b, idx_it, c] (one head).

    Grid (K, output × input channel blocks, row splits); each program writes its partial sum over a range of the
    B·Nq rows to DWPart (splits, C_out, Dv, K); the host sums the splits (deterministic, no atomics).
    """
    t = tl.program_id(0)
    pid_oc = tl.program_id(1)
    pid_s = tl.program_id(2)
    num_c_blocks = tl.cdiv(Dv, BLOCK_C)
    offs_o = (pid_oc // num_c_blocks) * BLOCK_O + tl.arange(0, BLOCK_O)
    offs_c = (pid_oc % num_c_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_o = offs_o < C_out
    mask_c = offs_c < Dv
    dtype = V.dtype.element_ty
    acc = tl.zeros([BLOCK_O, BLOCK_C], tl.float32)
    row_lo = pid_s * rows_per_split
    row_hi = tl.minimum(row_lo + rows_per_split, num_rows)
    for r0 in range(row_lo, row_hi, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        mask_r = rows < row_hi
        b = rows // Nq
        i = rows % Nq
        j = tl.load(Idx + rows.to(tl.int64) * num_neighbors + t, mask=mask_r, other=0)
        a_t = tl.load(A + rows.to(tl.int64) * num_neighbors + t, mask=mask_r, other=0.0)
        g_ptrs = V + b[:, None].to(tl.int64) * stride_vb + j[:, None] * stride_vn + offs_c[None, :] * stride_vd
        g = tl.load(g_ptrs, mask=mask_r[:, None] & mask_c[None, :], other=0.0)  # [BLOCK_R, BLOCK_C]
        g = (g.to(tl.float32) * a_t[:, None]).to(dtype)
        do_ptrs = DOut + b[None, :].to(tl.int64) * stride_dob + offs_o[:, None] * stride_doc + i[None, :] * stride_don
        d_out = tl.load(do_ptrs, mask=mask_o[:, None] & mask_r[None, :], other=0.0)  # [BLOCK_O, BLOCK_R]
        acc += _dot(d_out.to(dtype), g, IEEE)
    part_ptrs = DWPart + ((pid_s * C_out + offs_o[:, None]) * Dv + offs_c[None, :]) * num_neighbors + t
    tl.store(part_ptrs, acc, mask=mask_o[:, None] & mask_c[None, :])


@triton.jit(do_not_specialize=["Nk", "num_entries", "width"])
def _knn_bwd_key_sum(
    # tensors
    Contrib, Order, Offsets, Out,
    # sizes
    Nk, num_entries, width,
    # blocks
    BLOCK_J: tl.constexpr, BLOCK_W: tl.constexpr,
):
    """Deterministic scatter: Out[bh, j] = Σ Contrib[bh, e] over the entries e of key j, in stable-sorted order.

    Order (BH, num_entries) lists entries (query·K + slot) sorted by key, Offsets (BH, Nk + 1) where each key starts.
    """
    pid_j = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    offs_j = pid_j * BLOCK_J + tl.arange(0, BLOCK_J)
    mask_j = offs_j < Nk
    offs_w = tl.arange(0, BLOCK_W)
    mask_w = offs_w < width
    start = tl.load(Offsets + pid_bh * (Nk + 1) + offs_j, mask=mask_j, other=0)
    count = tl.load(Offsets + pid_bh * (Nk + 1) + offs_j + 1, mask=mask_j, other=0) - start
    acc = tl.zeros([BLOCK_J, BLOCK_W], tl.float32)
    for e in range(tl.max(count, axis=0)):
        has = e < count
        ent = tl.load(Order + pid_bh * num_entries + start + e, mask=has, other=0)
        rows = tl.load(Contrib + (pid_bh * num_entries + ent)[:, None] * width + offs_w[None, :],
                       mask=has[:, None] & mask_w[None, :], other=0.0)
        acc += rows
    tl.store(Out + (pid_bh * Nk + offs_j)[:, None] * width + offs_w[None, :], acc,
             mask=mask_j[:, None] & mask_w[None, :])


# ---------------------------------------------------------------------------------------------------------------
# Host launchers
# ---------------------------------------------------------------------------------------------------------------
def _next_pow2(n: int, floor: int = 1) -> int:
    return max(floor, triton.next_power_of_2(n))


def _fwd_config(num_neighbors: int, D: int, Dv: int, C_out: int) -> dict:
    """Block sizes of the forward: 64×64 query×key blocks, 4 warps up to K = 16, 8 warps for larger K; rows with
    at most 8 new entries in a key tile insert them one by one. The best of the H200 sweep in bench/RESULTS.md §1
    (query blocks of 16–128, key blocks of 32–128, 1–8 warps) at every benchmarked size."""
    k_pad = _next_pow2(num_neighbors, 2)
    return dict(BLOCK_M=64, BLOCK_N=max(64, k_pad), D_PAD=_next_pow2(D, 16), K_PAD=k_pad,
                BLOCK_C=min(64, _next_pow2(Dv, 16)), BLOCK_O=min(128, _next_pow2(C_out, 16)),
                num_warps=4 if k_pad <= 16 else 8, num_stages=2, FEW_ENTRIES=8)


@functools.cache
def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (1 elsewhere, e.g. in the interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def _num_splits(num_programs: int, num_cols: int, block_n: int, device: torch.device) -> int:
    """How many programs share one query block's candidates, so that the grid fills the GPU."""
    if device.type != "cuda":
        return 1
    sms = _sm_count(device)
    if num_programs >= sms:
        return 1
    wanted = -(-_TARGET_PROGRAMS_PER_SM * sms // num_programs)
    most = max(1, num_cols // (block_n * _MIN_TILES_PER_SPLIT))
    return max(1, min(wanted, most, _MAX_SPLITS))


def _check_launchable(q, k, v, weight, bias, candidates) -> None:
    """Raise ``ValueError`` unless the tensors can go to one launch: a device Triton runs on, all on q's device,
    q, k, v of one dtype. Everything else about the arguments is checked by the public entries
    (:func:`knn_aggregate_triton`, :func:`kernels.knn_aggregate`) before they reach the launcher."""
    if not triton_runs_on(q.device):
        raise ValueError(f"the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1), got device={q.device}")
    tensors = (("k", k), ("v", v), ("weight", weight), ("bias", bias), ("candidates", candidates))
    for name, x in tensors:
        if x is not None and x.device != q.device:
            raise ValueError(f"{name} must be on {q.device}, got {x.device}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype on the Triton kernel, got {q.dtype}, {k.dtype}, {v.dtype}")


def _launch_fwd(q, k, v, weight, bias, num_neighbors, similarity, weighting, temperature, groups, candidates,
                self_first, num_splits=None, config=None) -> tuple[Tensor, Tensor, Tensor]:
    """Allocate and launch the forward. Returns out (B, C_out, Nq), idx (B, H, Nq, K) int32, a fp32.

    For arguments that passed :func:`kernels.checks.check_knn_arguments` and
    :func:`kernels.checks.fused_unsupported_reason`; checks only :func:`_check_launchable`. ``num_splits`` and
    ``config`` (entries of :func:`_fwd_config`) override the heuristics (benchmarks, tests).
    """
    _check_launchable(q, k, v, weight, bias, candidates)
    B, H, Nq, D = q.shape
    Nk, Dv = k.shape[2], v.shape[3]
    C_out = weight.shape[0]
    cfg = _fwd_config(num_neighbors, D, Dv, C_out) | (config or {})
    block_m, block_n, k_pad = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["K_PAD"]
    out = torch.empty(B, C_out, Nq, device=q.device, dtype=q.dtype)
    idx = torch.empty(B, H, Nq, num_neighbors, device=q.device, dtype=torch.int32)
    a = torch.empty(B, H, Nq, num_neighbors, device=q.device, dtype=torch.float32)
    if candidates is not None:
        cand = candidates
        num_cols, stride_cb = cand.shape[1], (cand.stride(0) if cand.shape[0] > 1 else 0)
    else:
        cand, num_cols, stride_cb = idx, Nk, 0  # any pointer: never read
    grid_m = triton.cdiv(Nq, block_m)
    if num_splits is None:
        num_splits = _num_splits(grid_m * B * H, num_cols, block_n, q.device)
    cols_per_split = triton.cdiv(triton.cdiv(num_cols, num_splits), block_n) * block_n
    num_splits = triton.cdiv(num_cols, cols_per_split)
    split = num_splits > 1
    part = torch.empty(B * H, num_splits, Nq, k_pad, device=q.device, dtype=torch.int64) if split else idx
    tensors = (q, k, v, weight, bias if bias is not None else weight, cand, out, idx, a, part)
    strides = (*q.stride(), *k.stride(), *v.stride(), *weight.stride(), stride_cb, *out.stride())
    scalars = (1.0 if similarity == "cosine" else 1.0 / math.sqrt(D), 1.0 / temperature, _WEIGHTINGS[weighting],
               int(self_first), int(bias is not None))
    flags = dict(COSINE=similarity == "cosine", CANDIDATES=candidates is not None, DEPTHWISE=groups > 1,
                 IEEE=q.dtype == torch.float32)
    blocks = dict(BLOCK_M=block_m, D_PAD=cfg["D_PAD"], K_PAD=k_pad, BLOCK_C=cfg["BLOCK_C"], BLOCK_O=cfg["BLOCK_O"])
    launch = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    _knn_fwd[(grid_m, B * H, num_splits)](
        *tensors, H, Nq, num_cols, cols_per_split, num_neighbors, D, Dv, C_out, *strides, *scalars,
        **flags, SPLIT=split, BLOCK_N=block_n, FEW_ENTRIES=cfg["FEW_ENTRIES"], **blocks, **launch)
    if split:
        _knn_fwd_merge[(grid_m, B * H)](
            *tensors, H, Nq, num_splits, num_neighbors, D, Dv, C_out, *strides, *scalars, **flags, **blocks,
            **launch)
    return out, idx, a


def _normalize_backward(x: Tensor, grad_hat: Tensor) -> Tensor:
    """Gradient w.r.t. x of x̂ = x / max(‖x‖, eps) (F.normalize), given the gradient w.r.t. x̂; fp32."""
    x = x.float()
    norm = x.norm(dim=-1, keepdim=True)
    x_hat = x / norm.clamp_min(NORM_EPS)
    projected = (grad_hat - x_hat * (x_hat * grad_hat).sum(-1, keepdim=True)) / norm.clamp_min(NORM_EPS)
    return torch.where(norm > NORM_EPS, projected, grad_hat / NORM_EPS)


def _key_order(idx: Tensor, Nk: int) -> tuple[Tensor, Tensor]:
    """The (query, slot) entries of ``idx`` (BH, Nq, K) grouped by key: their order (BH, Nq·K) and each key's
    start in it (BH, Nk + 1), both int32, for :func:`_key_sum`."""
    BH = idx.shape[0] * idx.shape[1]
    keys = idx.reshape(BH, -1).long()
    sorted_keys, order = torch.sort(keys, dim=-1, stable=True)
    bounds = torch.arange(Nk + 1, device=idx.device).expand(BH, Nk + 1).contiguous()
    offsets = torch.searchsorted(sorted_keys, bounds).to(torch.int32).contiguous()
    return order.to(torch.int32).contiguous(), offsets


def _key_sum(contrib: Tensor, key_order: tuple[Tensor, Tensor], Nk: int) -> Tensor:
    """Deterministic Σ over (query, slot) entries per key: contrib (BH, Nq·K, W) → (BH, Nk, W) fp32."""
    BH, num_entries, width = contrib.shape
    order, offsets = key_order
    out = torch.empty(BH, Nk, width, device=contrib.device, dtype=torch.float32)
    block_j = 32
    _knn_bwd_key_sum[(triton.cdiv(Nk, block_j), BH)](
        contrib, order, offsets, out, Nk, num_entries, width,
        BLOCK_J=block_j, BLOCK_W=_next_pow2(width, 16), num_warps=4)
    return out


def _launch_bwd_dw(grad_out: Tensor, v: Tensor, idx: Tensor, a: Tensor, block_c: int, block_o: int) -> Tensor:
    """Standard Conv1D weight gradient (C_out, Dv, K) fp32 (one head): per-split partials, then their sum."""
    B, _, Nq, K = idx.shape
    Dv, C_out = v.shape[3], grad_out.shape[1]
    block_r = 64
    num_rows = B * Nq
    oc_blocks = triton.cdiv(C_out, block_o) * triton.cdiv(Dv, block_c)
    target = _TARGET_PROGRAMS_PER_SM * _sm_count(v.device)
    num_splits = max(1, min(triton.cdiv(target, K * oc_blocks), triton.cdiv(num_rows, block_r * 4)))
    rows_per_split = triton.cdiv(triton.cdiv(num_rows, num_splits), block_r) * block_r
    num_splits = triton.cdiv(num_rows, rows_per_split)
    part = torch.empty(num_splits, C_out, Dv, K, device=v.device, dtype=torch.float32)
    _knn_bwd_dw[(K, oc_blocks, num_splits)](
        v, idx, a, grad_out, part, Nq, num_rows, rows_per_split, K, Dv, C_out,
        v.stride(0), v.stride(2), v.stride(3), *grad_out.stride(), IEEE=v.dtype == torch.float32,
        BLOCK_R=block_r, BLOCK_C=block_c, BLOCK_O=block_o, num_warps=8)
    return part.sum(0)


def _launch_bwd(grad_out, grad_a, q, k, v, weight, idx, a, similarity, weighting, temperature, groups,
                needs_grad) -> tuple[Tensor | None, ...]:
    """Gradients (dq, dk, dv, dweight, dbias) in fp32, each None unless ``needs_grad`` (five bools, for q, k, v,
    weight, bias) asks for it; dq and dk are None too unless weighting is softmax.

    Only what is asked for runs: the query-owned kernel when dq, dk, dv or a depthwise dweight is needed (it writes
    dV and the depthwise dW partials whenever it runs; its softmax part only when dq or dk is needed), the
    deterministic key sums for dv and dk, the standard dW kernel for dweight, the sum over dO for dbias.
    """
    need_q, need_k, need_v, need_w, need_b = needs_grad
    B, H, Nq, D = q.shape
    Nk, Dv = k.shape[2], v.shape[3]
    C_out, K = weight.shape[0], idx.shape[-1]
    BH = B * H
    cosine = similarity == "cosine"
    if weighting != "softmax":  # only softmax weights carry a gradient to q and k
        need_q = need_k = False
    softmax = need_q or need_k  # the kernel's softmax part (da → ds → dq, dk) runs only for them
    depthwise = groups > 1
    deterministic = torch.are_deterministic_algorithms_enabled()
    block_c, block_o = min(64, _next_pow2(Dv, 16)), min(64, _next_pow2(C_out, 16))
    f32 = dict(device=q.device, dtype=torch.float32)
    d_q = d_k = d_v = d_weight = d_bias = None
    if softmax or need_v or (need_w and depthwise):
        block_m = 64
        grid_m = triton.cdiv(Nq, block_m)
        dv = torch.zeros(BH, Nq * K if deterministic else Nk, Dv, **f32)
        dq = torch.empty(BH, Nq, D, **f32) if softmax else dv
        dk = (torch.empty(BH, Nq * K, D, **f32) if deterministic else torch.zeros(BH, Nk, D, **f32)) if softmax else dv
        dw_part = torch.empty(grid_m, BH, Dv, K, **f32) if depthwise else dv
        grad_a = grad_a.contiguous() if grad_a is not None and softmax else None
        _knn_bwd_dvqk[(grid_m, BH)](
            q, k, v, weight, idx, a, grad_a if grad_a is not None else a, grad_out, dq, dk, dv, dw_part,
            H, Nq, Nk, K, D, Dv, C_out,
            *q.stride(), *k.stride(), *v.stride(), *weight.stride(), *grad_out.stride(),
            1.0 if cosine else 1.0 / math.sqrt(D), 1.0 / temperature,
            COSINE=cosine, SOFTMAX=softmax, DEPTHWISE=depthwise, DETERMINISTIC=deterministic,
            HAS_GRAD_A=grad_a is not None, IEEE=q.dtype == torch.float32,
            BLOCK_M=block_m, D_PAD=_next_pow2(D, 16), K_PAD=_next_pow2(K, 2), BLOCK_C=block_c, BLOCK_O=block_o,
            num_warps=8)
        key_order = _key_order(idx, Nk) if deterministic and (need_v or need_k) else None
        if need_v:
            d_v = (_key_sum(dv, key_order, Nk) if deterministic else dv).view(B, H, Nk, Dv)
        if need_q:
            d_q = dq.view(B, H, Nq, D)
            d_q = _normalize_backward(q, d_q) if cosine else d_q
        if need_k:
            d_k = (_key_sum(dk, key_order, Nk) if deterministic else dk).view(B, H, Nk, D)
            d_k = _normalize_backward(k, d_k) if cosine else d_k
        if need_w and depthwise:
            d_weight = dw_part.sum(0).view(B, H * Dv, K).sum(0).unsqueeze(1)  # (H·Dv, 1, K)
    if need_w and not depthwise:
        d_weight = _launch_bwd_dw(grad_out, v, idx, a, block_c, block_o)
    if need_b:
        d_bias = grad_out.float().sum((0, 2))
    return d_q, d_k, d_v, d_weight, d_bias


# ---------------------------------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------------------------------
class _KnnAggregate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, weight, bias, num_neighbors, similarity, weighting, temperature, groups, candidates,
                self_first):
        out, idx, a = _launch_fwd(q, k, v, weight, bias, num_neighbors, similarity, weighting, temperature, groups,
                                  candidates, self_first)
        ctx.save_for_backward(q, k, v, weight, bias, idx, a)
        ctx.options = (similarity, weighting, temperature, groups)
        topk_idx = idx.long()
        ctx.mark_non_differentiable(topk_idx)
        if weighting != "softmax":
            ctx.mark_non_differentiable(a)
        return out, topk_idx, a

    @staticmethod
    def backward(ctx, grad_out, grad_idx, grad_a):
        q, k, v, weight, bias, idx, a = ctx.saved_tensors
        similarity, weighting, temperature, groups = ctx.options
        if grad_out is None:
            grad_out = torch.zeros(v.shape[0], weight.shape[0], q.shape[2], device=q.device, dtype=q.dtype)
        inputs = (q, k, v, weight, bias)
        grads = _launch_bwd(grad_out, grad_a, q, k, v, weight, idx, a, similarity, weighting, temperature, groups,
                            ctx.needs_input_grad[:len(inputs)])
        grads = tuple(None if g is None else g.to(x.dtype) for g, x in zip(grads, inputs, strict=True))
        return *grads, None, None, None, None, None, None, None


def knn_aggregate_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    num_neighbors: int,
    similarity: str = "cosine",
    weighting: str = "none",
    temperature: float = 1.0,
    groups: int = 1,
    candidates: Tensor | None = None,
    self_first: bool = False,
) -> KnnResult:
    """Fused ConvNN aggregation (METHOD §2–3): same result as :func:`kernels.reference.knn_aggregate_reference`.

    Never materialises the (Nq, Nk) score matrix. Differentiable (``torch.autograd``) w.r.t. ``v``, ``weight``,
    ``bias`` and, with ``weighting="softmax"``, ``q`` and ``k``; indices carry no gradient. Under
    ``torch.use_deterministic_algorithms(True)`` the backward is bit-reproducible (no atomics).

    Args:
        q (Tensor): (B, H, Nq, D) queries, float32, bfloat16 or float16, any strides.
        k (Tensor): (B, H, Nk, D) keys, same dtype.
        v (Tensor): (B, H, Nk, Dv) values, same dtype.
        weight (Tensor): (C_out, Dv, K) for ``groups=1`` (needs H = 1) or (H·Dv, 1, K) for ``groups=H·Dv``
            (depthwise); tap ``t`` weighs the rank-``t`` neighbour.
        bias (Tensor, optional): (C_out,) Conv1D bias. Default: None
        num_neighbors (int): K, 1 ≤ K ≤ min(number of candidates, 128).
        similarity (str): ``"cosine"`` (q̂·k̂, zero vectors score 0) or ``"dot"`` (q·k/√D). Default: ``"cosine"``
        weighting (str): ρ: ``"none"``, ``"softmax"`` (over the K selected scores / ``temperature``) or
            ``"uniform"`` (1/K). Default: ``"none"``
        temperature (float): softmax temperature, > 0. Default: 1.0
        groups (int): 1 (standard Conv1D) or H·Dv (depthwise). Default: 1
        candidates (Tensor, optional): (B, r) or (1, r) int64 sampled key indices shared by a sample's queries; each
            query's candidates are itself plus these (METHOD §3, ``random``). None: all Nk keys. Default: None
        self_first (bool): rank each query's own token first (needs Nq = Nk); its real score sets its weight.
            Default: False

    Returns:
        KnnResult: ``out`` (B, C_out, Nq) in the input dtype, ``topk_idx`` (B, H, Nq, K) int64 (rank 0 first,
        ties to the lower candidate index), ``topk_weights`` (B, H, Nq, K) fp32.

    Raises:
        ValueError: non-CUDA tensors without ``TRITON_INTERPRET=1`` or tensors on different devices, mixed or
            unsupported dtypes, shapes that do not match, ``groups`` other than 1 or H·Dv, an unknown similarity or
            weighting, K out of range, or 2**31 or more elements (the message names the argument).

    Example:
        >>> q = k = v = torch.randn(2, 1, 1024, 64, device="cuda", dtype=torch.bfloat16)
        >>> w = torch.randn(64, 64, 9, device="cuda", dtype=torch.bfloat16)
        >>> knn_aggregate_triton(q, k, v, w, num_neighbors=9).out.shape  # torch.Size([2, 64, 1024])
    """
    check_knn_arguments(q, k, v, weight, bias, num_neighbors, similarity, weighting, temperature, groups,
                        candidates, None, self_first)
    unsupported = fused_unsupported_reason(q, k, v, weight, num_neighbors, similarity, groups, None)
    if unsupported is not None:
        raise ValueError(unsupported)
    return knn_aggregate_triton_prechecked(q, k, v, weight, bias, num_neighbors=num_neighbors, similarity=similarity,
                                           weighting=weighting, temperature=temperature, groups=groups,
                                           candidates=candidates, self_first=self_first)


def knn_aggregate_triton_prechecked(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, bias: Tensor | None, *,
                                    num_neighbors: int, similarity: str, weighting: str, temperature: float,
                                    groups: int, candidates: Tensor | None, self_first: bool) -> KnnResult:
    """:func:`knn_aggregate_triton` for arguments that already passed its checks (the fused path of
    :func:`kernels.knn_aggregate`, which checks once per call); only :func:`_check_launchable` runs here.
    Same arguments, result and gradients; arguments that would fail the checks give undefined results."""
    note_backend("triton")
    return KnnResult(*_KnnAggregate.apply(q, k, v, weight, bias, num_neighbors, similarity, weighting, temperature,
                                          groups, candidates, self_first))
