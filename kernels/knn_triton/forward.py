"""Forward kernels: scores and streaming top-K per query block (:func:`knn_fwd`), the merge of split candidate
ranges (:func:`knn_fwd_merge`), and the weights + Conv1D over rank slots both end with (:func:`aggregate`).

Every kernel takes its tensors as two tuples (``inputs``: Q, K, V, W, Bias, Cand, KInv (fp32 inverse key norms),
Spatial (the blend's spatial profile); ``outputs``: Out, Idx, A, Part, Count, Rows — the last two the lists of rows
the lanes could not certify, :func:`knn_fwd_repair`), one stride tuple per strided tensor, and one
``sizes`` tuple (H, Nq, Nk, num_cols, cols_per_split, num_neighbors, D, Dv, C_out, stride_cb, width, pad: the map's
width and padding for the blend rule, whose candidate columns are the cells of the padded map). Base pointers are
offset to the program's (sample, head) once, at the top. A function that takes a tuple unpacks it whole, by name, at
its top (a name not read there starts with ``_``); the smaller helpers take the few sizes they read as arguments.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .select import (
    EMPTY_KEY,
    LANE_ROTATION,
    NEG_INF,
    PACKED_TILES,
    POS_INF,
    TINY,
    canonical,
    column,
    dot,
    entry,
    inv_norm,
    lane_columns,
    lane_empty,
    lane_insert,
    lane_insert2,
    lane_merge,
    lowered,
    merge_tile,
    merge_top,
    pack,
    packed_empty,
    packed_insert,
    packed_merge,
    repair_tile,
    unpack_column,
    unpack_score,
)

# The weighting ρ, the kernels' WEIGHTING (the host's names: function._WEIGHTINGS).
WEIGHTING_NONE, WEIGHTING_SOFTMAX, WEIGHTING_UNIFORM = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def _load_queries(q_base, q_strides, offs_m, mask_m, scale, D, COSINE: tl.constexpr, BLOCK_M: tl.constexpr,
                  D_PAD: tl.constexpr):
    """The query block [BLOCK_M, D_PAD] in its own dtype and its per-row score scale (1/‖q‖ or 1/√D), fp32."""
    offs_d = tl.arange(0, D_PAD)
    q = tl.load(q_base + offs_m[:, None] * q_strides[2] + offs_d[None, :] * q_strides[3],
                mask=mask_m[:, None] & (offs_d[None, :] < D), other=0.0)
    if COSINE:
        q_scale = inv_norm(q.to(tl.float32))
    else:
        q_scale = tl.zeros([BLOCK_M], tl.float32) + scale
    return q, q_scale


@triton.jit(do_not_specialize=["num_rows"])
def key_inv_norms(K, KInv, k_strides, H, Nk, D, num_rows, BLOCK_R: tl.constexpr, D_PAD: tl.constexpr):
    """Grid (cdiv(B·H·Nk, BLOCK_R),): 1 / max(‖k_j‖, eps) of every key row of K (B, H, Nk, D), any strides, into
    KInv (B·H·Nk) fp32 — the same :func:`select.inv_norm` the query block applies to its rows, once per call
    instead of once per query block."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask = rows < num_rows
    bh = rows // Nk
    offs_d = tl.arange(0, D_PAD)
    base = (bh // H) * k_strides[0] + (bh % H) * k_strides[1] + (rows % Nk) * k_strides[2]
    x = tl.load(K + base[:, None] + offs_d[None, :] * k_strides[3], mask=mask[:, None] & (offs_d[None, :] < D),
                other=0.0)
    tl.store(KInv + rows, inv_norm(x.to(tl.float32)), mask=mask)


@triton.jit
def _self_scores(q, q_scale, k_base, k_strides, kinv_base, offs_m, mask_m, D, COSINE: tl.constexpr,
                 D_PAD: tl.constexpr):
    """s_ii for each query row of the block q [BLOCK_M, D_PAD] against its own key row (canonical fp32)."""
    offs_d = tl.arange(0, D_PAD)
    k_self = tl.load(k_base + offs_m[:, None] * k_strides[2] + offs_d[None, :] * k_strides[3],
                     mask=mask_m[:, None] & (offs_d[None, :] < D), other=0.0).to(tl.float32)
    s = tl.sum(q.to(tl.float32) * k_self, axis=1) * q_scale
    if COSINE:
        s = s * tl.load(kinv_base + offs_m, mask=mask_m, other=0.0)
    return canonical(s)


@triton.jit
def _score_tile(q, q_scale, k_base, k_strides, kinv_base, key_rows, mask_n, D, COSINE: tl.constexpr,
                IEEE: tl.constexpr, D_PAD: tl.constexpr, RAW: tl.constexpr = False):
    """Canonical fp32 scores [BLOCK_M, BLOCK_N] of the query block against the key rows ``key_rows``; with ``RAW``
    as the dot product gives them (NaN and +∞ left as they are: the lanes' stream, :func:`select.lane_insert`)."""
    offs_d = tl.arange(0, D_PAD)
    k = tl.load(k_base + key_rows[:, None] * k_strides[2] + offs_d[None, :] * k_strides[3],
                mask=mask_n[:, None] & (offs_d[None, :] < D), other=0.0)
    s = dot(q, tl.trans(k), IEEE) * q_scale[:, None]
    if COSINE:
        s = s * tl.load(kinv_base + key_rows, mask=mask_n, other=0.0)[None, :]
    if RAW:
        return s
    return canonical(s)


@triton.jit
def padded_position(cols, width, pad):
    """Row and column of cells ``cols`` (int32, 0 ≤ cols < 2^21) of the map zero-padded by ``pad`` (raster order,
    rows width + 2·pad long): the quotient floor((c + 0.5) · r), r the correctly rounded fp32 1 / (width + 2·pad),
    and the remainder. Exact below 2^21 cells — the product's error stays under a quarter of (c + 0.5)'s distance
    0.5 / (width + 2·pad) to the nearest integer quotient (checks.FUSED_MAX_BLEND_CELLS) — in four instructions a
    cell instead of an integer division's ≈ 20 (bench/sass_count.py)."""
    padded_width = width + 2 * pad
    inverse = tl.math.div_rn(1.0, padded_width.to(tl.float32))
    row = tl.floor((cols.to(tl.float32) + 0.5) * inverse).to(tl.int32)
    return row, cols - row * padded_width


@triton.jit
def padded_cells(cols, width, pad, height):
    """Cells of the map zero-padded by ``pad`` (the blend rule's candidates, raster order) → the token index of
    each inside the map, −1 for padding cells."""
    row, col = padded_position(cols, width, pad)
    row -= pad
    col -= pad
    inside = (row >= 0) & (row < height) & (col >= 0) & (col < width)
    return tl.where(inside, row * width + col, -1)


@triton.jit
def _feature_range(q, q_scale, k_base, k_strides, kinv_base, Nq, num_cols, D, width, pad, COSINE: tl.constexpr,
                   IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr):
    """Blend, first pass: per query the lowest finite feature score over the padded map and max(high − low, tiny)
    (padding cells score 0), as ``kernels.reference.blend_scores`` normalises. The minimum and maximum are kept per
    (row, column lane) and reduced over the lanes once at the end: elementwise per tile, no row reduction."""
    low = tl.full([BLOCK_M, BLOCK_N], POS_INF, tl.float32)
    high = tl.full([BLOCK_M, BLOCK_N], NEG_INF, tl.float32)
    for start in range(0, num_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask_n = cols < num_cols
        rows = padded_cells(cols, width, pad, Nq // width)
        s = _score_tile(q, q_scale, k_base, k_strides, kinv_base, rows, mask_n & (rows >= 0), D, COSINE, IEEE, D_PAD)
        finite = mask_n[None, :] & (s > NEG_INF)
        low = tl.minimum(low, tl.where(finite, s, POS_INF))
        high = tl.maximum(high, tl.where(finite, s, NEG_INF))
    low = tl.min(low, axis=1)
    return low, tl.maximum(tl.max(high, axis=1) - low, TINY)


@triton.jit
def _blend(feature, low, spread, spatial, blend):
    """(1 − α)·spatial + α·(feature − low) / spread, in the reference's order of operations; ``blend`` = (1 − α, α)."""
    spatial_weight, feature_weight = blend
    return spatial_weight * spatial + feature_weight * tl.math.div_rn(feature - low, spread)


@triton.jit
def _blend_tile(s, cols, offs_m, low, spread, Spatial, width, pad, blend):
    """Blend, second pass: the blended scores of a [BLOCK_M, BLOCK_N] feature tile of padded cells ``cols``; the
    spatial term is the profile at the Chebyshev distance between the query's and the cell's padded positions."""
    row, col = padded_position(cols, width, pad)
    d_row = tl.abs((offs_m // width + pad)[:, None] - row[None, :])
    d_col = tl.abs((offs_m % width + pad)[:, None] - col[None, :])
    spatial = tl.load(Spatial + tl.maximum(d_row, d_col))
    return _blend(s, low[:, None], spread[:, None], spatial, blend)


@triton.jit
def _slot(Idx, A, row_base, t, mask_m, Nq, width, pad, BLEND: tl.constexpr):
    """Rank slot ``t`` of the block's rows as :func:`aggregate` stored them: the value row each gathers ([BLOCK_M]
    int32; −1: a padding cell of the blend's map, a zero value) and its weight a (fp32)."""
    j_t = tl.load(Idx + row_base + t, mask=mask_m, other=0).to(tl.int32)
    if BLEND:
        j_t = padded_cells(j_t, width, pad, Nq // width)
    return j_t, tl.load(A + row_base + t, mask=mask_m, other=0.0)


@triton.jit
def aggregate(acc, s_self, inputs, outputs, v_strides, w_strides, o_strides, sizes, inv_temperature, pid_bh,
              offs_m, mask_m, WEIGHTING: tl.constexpr, SELF_FIRST: tl.constexpr, HAS_BIAS: tl.constexpr,
              CANDIDATES: tl.constexpr, BLEND: tl.constexpr, DEPTHWISE: tl.constexpr, IEEE: tl.constexpr,
              BLOCK_M: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_O: tl.constexpr,
              ONE_C: tl.constexpr):
    """From the final top-K keys ``acc`` (sorted descending, rank 0 first): indices, weights a, then the Conv1D
    over rank slots; writes Out, Idx and A. ``s_self`` [BLOCK_M]: each query's real own score (SELF_FIRST)."""
    _Q, _K, V, W, Bias, Cand, _KInv, _Spatial = inputs
    Out, Idx, A, _Part, _Count, _Rows = outputs
    H, Nq, _Nk, _num_cols, _cols_per_split, num_neighbors, _D, Dv, C_out, stride_cb, width, pad = sizes
    b = pid_bh // H
    h = pid_bh % H
    slots = tl.arange(0, K_PAD)
    mask_mk = mask_m[:, None] & (slots[None, :] < num_neighbors)  # [BLOCK_M, K_PAD]
    scores = unpack_score(acc)
    cols = unpack_column(acc)
    if SELF_FIRST:  # the forced key ranks with +∞: rank 0 is the query itself, give it its real score
        scores = tl.where(slots[None, :] == 0, s_self[:, None], scores)
    filled = mask_mk & (acc != EMPTY_KEY)  # an empty slot (the lanes' result of a row the repair still owes)
    if CANDIDATES:  # column 0 is the query, column c ≥ 1 the sampled key candidates[b, c − 1]
        sampled = tl.load(Cand + b * stride_cb + (cols - 1), mask=filled & (cols > 0), other=0).to(tl.int32)
        keys_idx = tl.where(cols == 0, offs_m[:, None], sampled)
    else:
        keys_idx = cols
    keys_idx = tl.where(filled, keys_idx, 0)  # an empty slot never addresses a value row nor a candidate
    valid = mask_mk & (scores > NEG_INF)
    if WEIGHTING == WEIGHTING_SOFTMAX:  # exp((s − s_max) / τ): saturated scores share the weight instead of giving NaN
        top = tl.max(tl.where(valid, scores, NEG_INF), axis=1)
        top = tl.where(top > NEG_INF, top, 0.0)  # rows past Nq, or without a valid slot
        e = tl.where(valid, tl.exp((scores - top[:, None]) * inv_temperature), 0.0)
        a = e / tl.maximum(tl.sum(e, axis=1), 1.0)[:, None]  # the row maximum contributes exp(0) = 1
    elif WEIGHTING == WEIGHTING_UNIFORM:
        a = valid.to(tl.float32)
        a = a / tl.maximum(tl.sum(a, axis=1), 1.0)[:, None]
    else:  # WEIGHTING_NONE
        a = valid.to(tl.float32)
    row_base = pid_bh.to(tl.int64) * Nq * num_neighbors + offs_m * num_neighbors  # [BLOCK_M]: slot 0 of each row
    tl.store(Idx + row_base[:, None] + slots[None, :], keys_idx.to(tl.int64), mask=mask_mk)
    tl.store(A + row_base[:, None] + slots[None, :], a, mask=mask_mk)
    # The Conv1D reads them back one rank slot t at a time (a load where a select + row sum over the K_PAD slots
    # cost 7 times the instructions), after a barrier: another thread of the block may have stored them.
    tl.debug_barrier()

    # Conv1D over rank slots: loop over neighbours at run time (static unrolling compiles for minutes at K = 32).
    v_base = V + b * v_strides[0] + h * v_strides[1]
    out_base = Out + b * o_strides[0]
    dtype = V.dtype.element_ty
    if DEPTHWISE:
        for c0 in range(0, Dv, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            mask_c = offs_c < Dv
            mask_mc = mask_m[:, None] & mask_c[None, :]
            chan = h * Dv + offs_c
            out = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
            for t in range(num_neighbors):
                j_t, a_t = _slot(Idx, A, row_base, t, mask_m, Nq, width, pad, BLEND)
                g = tl.load(v_base + j_t[:, None] * v_strides[2] + offs_c[None, :] * v_strides[3],
                            mask=mask_mc & (j_t >= 0)[:, None], other=0.0)
                w_t = tl.load(W + chan * w_strides[0] + t * w_strides[2], mask=mask_c, other=0.0).to(tl.float32)
                out += g.to(tl.float32) * a_t[:, None] * w_t[None, :]
            if HAS_BIAS:
                out += tl.load(Bias + chan, mask=mask_c, other=0.0).to(tl.float32)[None, :]
            tl.store(out_base + chan[None, :] * o_strides[1] + offs_m[:, None] * o_strides[2],
                     out.to(Out.dtype.element_ty), mask=mask_mc)
    else:
        for o0 in range(0, C_out, BLOCK_O):
            offs_o = o0 + tl.arange(0, BLOCK_O)
            mask_o = offs_o < C_out
            out = tl.zeros([BLOCK_M, BLOCK_O], tl.float32)
            # One loop over (slot t, channel block c0), t-major: the innermost loop, so the compiler prefetches the
            # next gather while this one's dot runs.
            num_c = 1  # ONE_C: Dv ≤ BLOCK_C, one channel block (no division by a run-time count below)
            if not ONE_C:
                num_c = tl.cdiv(Dv, BLOCK_C)
            for i in range(num_neighbors * num_c):
                t = i // num_c
                j_t, a_t = _slot(Idx, A, row_base, t, mask_m, Nq, width, pad, BLEND)
                offs_c = (i % num_c) * BLOCK_C + tl.arange(0, BLOCK_C)
                mask_c = offs_c < Dv
                g = tl.load(v_base + j_t[:, None] * v_strides[2] + offs_c[None, :] * v_strides[3],
                            mask=(mask_m & (j_t >= 0))[:, None] & mask_c[None, :], other=0.0)
                g = g * a_t.to(dtype)[:, None]  # in the input dtype: one packed multiply a pair
                w_t = tl.load(W + offs_o[None, :] * w_strides[0] + offs_c[:, None] * w_strides[1]
                              + t * w_strides[2], mask=mask_c[:, None] & mask_o[None, :], other=0.0)
                out += dot(g, w_t.to(dtype), IEEE)
            if HAS_BIAS:
                out += tl.load(Bias + offs_o, mask=mask_o, other=0.0).to(tl.float32)[None, :]
            tl.store(out_base + offs_o[None, :] * o_strides[1] + offs_m[:, None] * o_strides[2],
                     out.to(Out.dtype.element_ty), mask=mask_m[:, None] & mask_o[None, :])


@triton.jit
def _first_key(acc, q, q_scale, k_base, k_strides, kinv_base, offs_m, mask_m, pid_s, low, spread, D, width, pad,
               blend, SELF_FIRST: tl.constexpr, CANDIDATES: tl.constexpr, BLEND: tl.constexpr, COSINE: tl.constexpr,
               BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, K_PAD: tl.constexpr):
    """With candidates or a forced self, the query's own candidate enters the accumulator first (split 0): ranked
    +∞ when forced, else by its score. Returns (acc, its column, its real score s_ii: feature, or blended with the
    spatial term 1)."""
    s_self = _self_scores(q, q_scale, k_base, k_strides, kinv_base, offs_m, mask_m, D, COSINE, D_PAD)
    self_col = offs_m
    if CANDIDATES:
        self_col = tl.zeros([BLOCK_M], tl.int32)
    if BLEND:
        self_col = (offs_m // width + pad) * (width + 2 * pad) + offs_m % width + pad
        s_self = _blend(s_self, low, spread, 1.0, blend)
    rank_score = s_self
    if SELF_FIRST:
        rank_score = tl.zeros([BLOCK_M], tl.float32) + POS_INF
    if CANDIDATES or SELF_FIRST:  # otherwise the query is an ordinary candidate of the tiles
        if pid_s == 0:
            acc = tl.where(tl.arange(0, K_PAD)[None, :] == K_PAD - 1, pack(rank_score, self_col)[:, None], acc)
    return acc, self_col, s_self


@triton.jit
def _stream_tile(block, cols, start, col_hi, SELF_FIRST: tl.constexpr, COSINE: tl.constexpr,
                 CANDIDATES: tl.constexpr, BLEND: tl.constexpr, IEEE: tl.constexpr, ANY_ROWS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr, RAW: tl.constexpr = False,
                 FULL: tl.constexpr = False):
    """The canonical scores [BLOCK_M, BLOCK_N] of the key tile whose columns are ``cols`` (some order of
    ``start + [0, BLOCK_N)``), and which of them are candidates (``valid``; the others score −∞). ``block``: what
    the query block scores with, as :func:`knn_fwd` packs it; ``ANY_ROWS``: its rows are any rows of the map (the
    repair's lists), not ``row_lo + [0, BLOCK_M)``; ``RAW``: the feature scores as the dot product gives them, not
    canonical (the lanes' stream; the blend rule's blended scores are always of canonical ones); ``FULL``: the
    caller knows the tile lies inside the range (no load masks)."""
    q, q_scale, k_base, k_strides, kinv_base, Cand, Spatial, sizes, blend, low, spread, b, offs_m, row_lo, self_col = (
        block)
    _H, Nq, _Nk, _num_cols, _cols_per_split, _num_neighbors, D, _Dv, _C_out, stride_cb, width, pad = sizes
    if FULL:
        mask_n = tl.full([BLOCK_N], 1, tl.int1)
    else:
        mask_n = cols < col_hi
    if CANDIDATES:
        key_rows = tl.load(Cand + b * stride_cb + (cols - 1), mask=mask_n, other=0)
    elif BLEND:
        key_rows = padded_cells(cols, width, pad, Nq // width)
    else:
        key_rows = cols
    mask_k = mask_n
    if BLEND:  # a padding cell has no key row
        mask_k = mask_n & (key_rows >= 0)
    s = _score_tile(q, q_scale, k_base, k_strides, kinv_base, key_rows, mask_k, D, COSINE, IEEE, D_PAD,
                    RAW and not BLEND)
    if BLEND:
        s = _blend_tile(s, cols, offs_m, low, spread, Spatial, width, pad, blend)
    # Only the tiles that need it are masked: past the range, and where the query's own candidate (in acc already)
    # appears: any tile of sampled keys or of padded cells, the diagonal tiles of a forced self.
    needs_mask = start + BLOCK_N > col_hi
    if CANDIDATES or BLEND:
        needs_mask = start >= 0
    elif SELF_FIRST:
        if ANY_ROWS:  # any tile may hold one of the rows' own keys
            needs_mask = start >= 0
        else:
            needs_mask = needs_mask | ((start < row_lo + BLOCK_M) & (start + BLOCK_N > row_lo))
    valid = tl.full([BLOCK_M, BLOCK_N], 1, tl.int1)
    if needs_mask:
        valid = valid & mask_n[None, :]
        if CANDIDATES:  # a sampled key equal to the query scores −∞ (the reference's mask), still a candidate
            s = tl.where(valid & (key_rows[None, :] != offs_m[:, None]), s, NEG_INF)
        else:
            if SELF_FIRST:  # the query's own key is in acc already
                valid = valid & (cols[None, :] != self_col[:, None])
            s = tl.where(valid, s, NEG_INF)
    return s, valid


@triton.jit
def _open_block(inputs, q_strides, k_strides, sizes, scale, blend, pid_bh, pid_s, offs_m, mask_m, row_lo,
                SELF_FIRST: tl.constexpr, COSINE: tl.constexpr, CANDIDATES: tl.constexpr, BLEND: tl.constexpr,
                IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
                K_PAD: tl.constexpr):
    """What a block of query rows ``offs_m`` scores with, for split ``pid_s``: (block — the tuple
    :func:`_stream_tile` reads —, the accumulator [BLOCK_M, K_PAD] with the query's own key where it enters first,
    each query's real own score, the split's candidate columns [col_lo, col_hi))."""
    Q, K, _V, _W, _Bias, Cand, KInv, Spatial = inputs
    H, Nq, Nk, num_cols, cols_per_split, _num_neighbors, D, _Dv, _C_out, _stride_cb, width, pad = sizes
    b = pid_bh // H
    h = pid_bh % H
    k_base = K + b * k_strides[0] + h * k_strides[1]
    kinv_base = KInv + pid_bh * Nk
    q, q_scale = _load_queries(Q + b * q_strides[0] + h * q_strides[1], q_strides, offs_m, mask_m, scale, D,
                               COSINE, BLOCK_M, D_PAD)
    low = tl.zeros([BLOCK_M], tl.float32)
    spread = tl.zeros([BLOCK_M], tl.float32) + 1.0
    if BLEND:
        low, spread = _feature_range(q, q_scale, k_base, k_strides, kinv_base, Nq, num_cols, D, width, pad, COSINE,
                                     IEEE, BLOCK_M, BLOCK_N, D_PAD)
    acc = tl.full([BLOCK_M, K_PAD], EMPTY_KEY, tl.int64)
    col_lo = pid_s * cols_per_split
    col_hi = tl.minimum(col_lo + cols_per_split, num_cols)
    if CANDIDATES:  # column 0 is the query itself
        col_lo += 1
        col_hi += 1
    acc, self_col, s_self = _first_key(acc, q, q_scale, k_base, k_strides, kinv_base, offs_m, mask_m, pid_s, low,
                                       spread, D, width, pad, blend, SELF_FIRST, CANDIDATES, BLEND, COSINE, BLOCK_M,
                                       D_PAD, K_PAD)
    block = (q, q_scale, k_base, k_strides, kinv_base, Cand, Spatial, sizes, blend, low, spread, b, offs_m, row_lo,
             self_col)
    return block, acc, s_self, col_lo, col_hi


@triton.jit
def _packed_tile(e1, e2, e3, e4, over, block, t, col_lo, col_hi, first_tile, SELF_FIRST: tl.constexpr,
                 COSINE: tl.constexpr, CANDIDATES: tl.constexpr, BLEND: tl.constexpr, IEEE: tl.constexpr,
                 SHIFTED: tl.constexpr, DEPTH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 D_PAD: tl.constexpr, FULL: tl.constexpr):
    """Tile ``t`` of the range ``col_lo`` onwards into packed lanes (:func:`select.packed_insert`). Returns the
    new state."""
    start = col_lo + t * BLOCK_N
    cols = lane_columns(start, first_tile + t, BLOCK_N)
    s, _valid = _stream_tile(block, cols, start, col_hi, SELF_FIRST, COSINE, CANDIDATES, BLEND, IEEE, False, BLOCK_M,
                             BLOCK_N, D_PAD, RAW=True, FULL=FULL)
    return packed_insert(e1, e2, e3, e4, over, entry(s, PACKED_TILES - 1 - t, SHIFTED), DEPTH)


@triton.jit(do_not_specialize=["sizes"])  # a new N, K or width needs no new compile
def knn_fwd(inputs, outputs, q_strides, k_strides, v_strides, w_strides, o_strides, sizes, scale, inv_temperature,
            blend, WEIGHTING: tl.constexpr, SELF_FIRST: tl.constexpr, HAS_BIAS: tl.constexpr, COSINE: tl.constexpr,
            CANDIDATES: tl.constexpr, BLEND: tl.constexpr, DEPTHWISE: tl.constexpr, IEEE: tl.constexpr,
            SPLIT: tl.constexpr, LANES: tl.constexpr, LANE_DEPTH: tl.constexpr, DEFER: tl.constexpr,
            WARM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
            K_PAD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_O: tl.constexpr, ONE_C: tl.constexpr,
            GATHER_T: tl.constexpr = 0, PACKED: tl.constexpr = False):
    """Grid (query blocks, B·H, splits): scores + exact top-K over one split of the candidates; without a split
    also weights and Conv1D (:func:`aggregate`), with one the sorted partial top-K goes to Part.

    ``LANES``: the lane selection (:func:`select.lane_insert`); a row it cannot certify is repaired from its K-th
    score as its floor by :func:`select.repair_tile` — with ``DEFER`` by :func:`knn_fwd_repair`, launched next, to
    which the row goes through the lists Count, Rows (its floor key in the slot that kernel overwrites; with
    ``GATHER_T`` also the one lane it must rescan, see there), without ``DEFER`` by its own block streaming the
    tiles again. ``PACKED`` (a split of at most ``select.PACKED_TILES`` tiles, ``LANE_DEPTH`` 2–4 entries a lane, no
    ``GATHER_T``): the lanes' entries packed into one int32 each (:func:`select.packed_insert`). Otherwise the
    insertion rounds alone, ``WARM`` (not with
    sampled candidates): how many key tiles around the block's middle query set each row's floor first."""
    tl.static_assert(BLOCK_N >= K_PAD)
    _H, Nq, _Nk, _num_cols, cols_per_split, num_neighbors, _D, _Dv, _C_out, _stride_cb, width, pad = sizes
    pid_m, pid_bh, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row_lo = pid_m * BLOCK_M
    offs_m = row_lo + tl.arange(0, BLOCK_M)
    mask_m = offs_m < Nq
    live = tl.arange(0, K_PAD) >= K_PAD - num_neighbors
    block, acc, s_self, col_lo, col_hi = _open_block(inputs, q_strides, k_strides, sizes, scale, blend, pid_bh, pid_s,
                                                     offs_m, mask_m, row_lo, SELF_FIRST, COSINE, CANDIDATES, BLEND,
                                                     IEEE, BLOCK_M, BLOCK_N, D_PAD, K_PAD)
    slots = tl.arange(0, K_PAD)
    num_tiles = tl.cdiv(col_hi - col_lo, BLOCK_N)
    if LANES:
        # Tile t of this range is tile first_tile + t of the whole range: the same rotation, split or not, and the
        # repair reads each tile as the lanes did (the same bits for every score).
        first_tile = pid_s * (cols_per_split // BLOCK_N)
        first = acc
        if PACKED:
            SHIFTED: tl.constexpr = COSINE and not BLEND  # scores in [−1, 1] (select.entry)
            e1, e2, e3, e4, over = packed_empty(BLOCK_M, BLOCK_N, LANE_DEPTH)
            num_full = (col_hi - col_lo) // BLOCK_N  # tiles inside the range: no load masks; then the last, if any
            for t in range(num_full):
                e1, e2, e3, e4, over = _packed_tile(e1, e2, e3, e4, over, block, t, col_lo, col_hi, first_tile,
                                                    SELF_FIRST, COSINE, CANDIDATES, BLEND, IEEE, SHIFTED, LANE_DEPTH,
                                                    BLOCK_M, BLOCK_N, D_PAD, True)
            if num_full < num_tiles:
                e1, e2, e3, e4, over = _packed_tile(e1, e2, e3, e4, over, block, num_full, col_lo, col_hi,
                                                    first_tile, SELF_FIRST, COSINE, CANDIDATES, BLEND, IEEE, SHIFTED,
                                                    LANE_DEPTH, BLOCK_M, BLOCK_N, D_PAD, False)
            acc, certified, floor = packed_merge(acc, live, e1, e2, e3, e4, over, num_neighbors, col_lo,
                                                 first_tile, LANE_DEPTH, SHIFTED)
            lane = tl.full([BLOCK_M], -1, tl.int32)
        else:
            a1, a2, a3, c1, c2, c3, over = lane_empty(BLOCK_M, BLOCK_N)
            for t in range(num_tiles):
                start = col_lo + t * BLOCK_N
                cols = lane_columns(start, first_tile + t, BLOCK_N)
                s, valid = _stream_tile(block, cols, start, col_hi, SELF_FIRST, COSINE, CANDIDATES, BLEND, IEEE,
                                        False, BLOCK_M, BLOCK_N, D_PAD, RAW=True)
                if LANE_DEPTH == 3:
                    a1, a2, a3, c1, c2, c3, over = lane_insert(a1, a2, a3, c1, c2, c3, over, s, cols)
                else:
                    a1, a2, c1, c2, over = lane_insert2(a1, a2, c1, c2, over, s, cols)
            if LANE_DEPTH == 2:  # the third entries stay empty (made here, so the stream carries no copy of them)
                a3 = tl.full([BLOCK_M, BLOCK_N], NEG_INF, tl.float32)
                c3 = tl.full([BLOCK_M, BLOCK_N], -1, tl.int32)
            acc, certified, floor, lane = lane_merge(acc, live, a1, a2, a3, c1, c2, c3, over, num_neighbors)
        certified = certified | (mask_m == 0)  # rows past the map are never read
        if not DEFER:  # with DEFER, knn_fwd_repair takes the rows not certified (after the block's end, below)
            if tl.min(certified.to(tl.int32), axis=0) == 0:  # repair: the rows not certified stream again
                # the floor lowered: a lane's +∞ score (not certified) must not exclude the canonical largest score
                acc = _repair(tl.where(certified[:, None], acc, first), certified == 0, lowered(floor), block,
                              col_lo, col_hi, first_tile, live, num_neighbors, SELF_FIRST, COSINE, CANDIDATES, BLEND,
                              IEEE, False, BLOCK_M, BLOCK_N, D_PAD)
    else:
        # Warm start: the WARM tiles around the block's middle query come first, only to set each row's floor (the
        # loop's own score code, so the floor is bit for bit a score the stream meets again; select.py).
        num_warm = tl.minimum(num_tiles, WARM)
        centre = row_lo + BLOCK_M // 2
        if BLEND:
            centre = (centre // width + pad) * (width + 2 * pad) + centre % width + pad
        first_warm = tl.maximum(tl.minimum((centre - col_lo) // BLOCK_N - WARM // 2, num_tiles - num_warm), 0)
        wanted = num_neighbors  # the keys the tiles must supply: all but a forced self
        if SELF_FIRST:
            wanted = num_neighbors - 1
        bound = tl.full([BLOCK_M, BLOCK_N], NEG_INF, tl.float32)
        floor = tl.full([BLOCK_M], NEG_INF, tl.float32)
        for t in range(-num_warm, num_tiles):
            tile = t
            if WARM > 0:
                tile = tl.where(t < 0, first_warm + num_warm + t, t)
            start = col_lo + tile * BLOCK_N
            cols = start + tl.arange(0, BLOCK_N)
            s, valid = _stream_tile(block, cols, start, col_hi, SELF_FIRST, COSINE, CANDIDATES, BLEND, IEEE,
                                    False, BLOCK_M, BLOCK_N, D_PAD)
            warm = False
            if WARM > 0:
                warm = t < 0
            if warm:  # the elementwise max holds BLOCK_N distinct candidates: its wanted-th largest is a floor
                bound = tl.maximum(bound, s)
                if t == -1:
                    if wanted > 0:
                        floor = column(tl.topk(bound, K_PAD), slots, wanted - 1)
            else:
                acc = merge_tile(acc, s, start, valid, live, floor, num_neighbors, WARM > 0, K_PAD, BLOCK_N)
    _finish(acc, s_self, inputs, outputs, v_strides, w_strides, o_strides, sizes, inv_temperature, pid_bh, pid_s,
            offs_m, mask_m, WEIGHTING, SELF_FIRST, HAS_BIAS, CANDIDATES, BLEND, DEPTHWISE, IEEE, SPLIT, BLOCK_M,
            K_PAD, BLOCK_C, BLOCK_O, ONE_C)
    if LANES:
        if DEFER:
            _defer(certified, floor, lane, outputs, sizes, pid_bh, pid_s, offs_m, SPLIT, K_PAD, GATHER_T)


@triton.jit
def _floor_slot(outputs, sizes, pid_bh, lst, offs_m, SPLIT: tl.constexpr, K_PAD: tl.constexpr):
    """Where a failed row's floor key waits for :func:`knn_fwd_repair` (list ``lst``): a slot the repair
    overwrites — the last of Idx's row, where the row's K-th column was (the key holds it), or with a split the
    first of that split's Part row."""
    _Out, Idx, _A, Part, _Count, _Rows = outputs
    Nq, num_neighbors = sizes[1], sizes[5]
    if SPLIT:
        return Part + (lst.to(tl.int64) * Nq + offs_m) * K_PAD
    return Idx + (pid_bh.to(tl.int64) * Nq + offs_m) * num_neighbors + num_neighbors - 1


@triton.jit
def _repair(acc, rows, floor, block, col_lo, col_hi, first_tile, live, num_neighbors, SELF_FIRST: tl.constexpr,
            COSINE: tl.constexpr, CANDIDATES: tl.constexpr, BLEND: tl.constexpr, IEEE: tl.constexpr,
            ANY_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr):
    """The lanes' repair: the split's tiles streamed again in the lanes' column order, and the rows ``rows``
    [BLOCK_M] (the others see no key) take their keys ≥ ``floor`` with :func:`select.repair_tile`. Returns acc."""
    for t in range(tl.cdiv(col_hi - col_lo, BLOCK_N)):
        start = col_lo + t * BLOCK_N
        cols = lane_columns(start, first_tile + t, BLOCK_N)
        s, valid = _stream_tile(block, cols, start, col_hi, SELF_FIRST, COSINE, CANDIDATES, BLEND, IEEE, ANY_ROWS,
                                BLOCK_M, BLOCK_N, D_PAD)
        keys = tl.where(valid & rows[:, None], pack(s, cols[None, :]), EMPTY_KEY)
        acc = repair_tile(acc, keys, live, floor, num_neighbors)
    return acc


@triton.jit
def _gather_scores(block, q_base, q_strides, offs_m, mask_m, cols, valid, COSINE: tl.constexpr,
                   D_PAD: tl.constexpr):
    """Canonical fp32 scores [rows, W] of query rows ``offs_m`` (their sample's and head's queries at ``q_base``)
    against each row's own key rows ``cols`` [rows, W] (``valid``: which are candidates; the others score −∞), with
    the keys, scales and norms of ``block`` (:func:`_open_block`): products in fp32 summed over D in chunks of 16 —
    :func:`_score_tile`'s score in another order of summation, so within :func:`select.lowered`'s margin of it."""
    q_scale, k_base, k_strides, kinv_base, sizes = block[1], block[2], block[3], block[4], block[7]
    D = sizes[6]
    q_base = q_base + offs_m[:, None] * q_strides[2]  # [rows, 1]
    k_base = k_base + cols[:, :, None] * k_strides[2]  # [rows, W, 1]
    s = tl.zeros(cols.shape, tl.float32)
    for d0 in tl.static_range(0, D_PAD, 16):
        offs_d = d0 + tl.arange(0, 16)
        q = tl.load(q_base + offs_d[None, :] * q_strides[3], mask=mask_m[:, None] & (offs_d[None, :] < D),
                    other=0.0).to(tl.float32)
        k = tl.load(k_base + offs_d[None, None, :] * k_strides[3],
                    mask=valid[:, :, None] & (offs_d[None, None, :] < D), other=0.0).to(tl.float32)
        s += tl.sum(q[:, None, :] * k, axis=2)
    s = s * q_scale[:, None]
    if COSINE:
        s = s * tl.load(kinv_base + cols, mask=valid, other=0.0)
    return tl.where(valid, canonical(s), NEG_INF)


@triton.jit
def _gather_repair(acc, block, lanes, inputs, outputs, q_strides, sizes, pid_bh, offs_m, mask_m, live,
                   SELF_FIRST: tl.constexpr, COSINE: tl.constexpr, GATHER_N: tl.constexpr,
                   GATHER_T: tl.constexpr, D_PAD: tl.constexpr, K_PAD: tl.constexpr):
    """The lanes' repair of rows that have one lane to rescan (``lanes`` [rows], each row's; the "all" rule, no
    split): the row's true top K is among the K columns the lanes gave it (Idx's row as :func:`aggregate` stored
    it, its last slot the floor key, which holds the K-th column) and the columns of that lane — one a tile, tile t
    putting column t·GATHER_N + (lane + 13·t) mod GATHER_N in it (:func:`select.lane_columns`) — so those
    K + GATHER_T candidates alone are scored again (:func:`_gather_scores`) and ranked with the query's own key
    where it is forced (``acc``): no tile streamed. Returns acc."""
    _Out, Idx, _A, _Part, _Count, _Rows = outputs
    H, Nq, num_cols, num_neighbors = sizes[0], sizes[1], sizes[3], sizes[5]
    self_col = block[14]
    q_base = inputs[0] + (pid_bh // H) * q_strides[0] + (pid_bh % H) * q_strides[1]
    row_slots = (pid_bh.to(tl.int64) * Nq + offs_m) * num_neighbors
    slots = tl.arange(0, K_PAD)
    given = tl.load(Idx + row_slots[:, None] + slots[None, :],
                    mask=mask_m[:, None] & (slots[None, :] < num_neighbors - 1), other=0).to(tl.int32)
    floor = tl.load(Idx + row_slots + num_neighbors - 1, mask=mask_m, other=0)
    given = tl.where(slots[None, :] == num_neighbors - 1, unpack_column(floor)[:, None], given)
    tile = given // GATHER_N
    given_lane = (given - tile * GATHER_N - tile * LANE_ROTATION) & (GATHER_N - 1)
    keep = mask_m[:, None] & (slots[None, :] < num_neighbors) & (given_lane != lanes[:, None])  # rescanned below
    if SELF_FIRST:  # the query's own key is in acc already
        keep = keep & (given != self_col[:, None])
    keys = tl.where(keep, pack(_gather_scores(block, q_base, q_strides, offs_m, mask_m, given, keep, COSINE, D_PAD),
                               given), EMPTY_KEY)
    acc = merge_top(acc, keys, live)
    tiles = tl.arange(0, GATHER_T)
    cols = tiles[None, :] * GATHER_N + ((lanes[:, None] + tiles[None, :] * LANE_ROTATION) & (GATHER_N - 1))
    scan = mask_m[:, None] & (cols < num_cols)
    if SELF_FIRST:
        scan = scan & (cols != self_col[:, None])
    keys = tl.where(scan, pack(_gather_scores(block, q_base, q_strides, offs_m, mask_m, cols, scan, COSINE, D_PAD),
                               cols), EMPTY_KEY)
    return merge_top(acc, keys, live)


@triton.jit
def _defer(certified, floor, lane, outputs, sizes, pid_bh, pid_s, offs_m, SPLIT: tl.constexpr, K_PAD: tl.constexpr,
           GATHER_T: tl.constexpr):
    """The rows of a lane block that are not ``certified`` join their (sample, head, split)'s list for
    :func:`knn_fwd_repair`: Count[list] += how many, Rows[list, position] = the row, and the row's floor key
    ``floor`` goes to a slot the repair overwrites (:func:`_floor_slot`); with ``GATHER_T`` the row's one lane to
    rescan ``lane`` (−1: every lane) to the first slot of its A row, as an fp32 number."""
    _Out, _Idx, A, _Part, Count, Rows = outputs
    Nq, num_neighbors = sizes[1], sizes[5]
    failed = (certified == 0).to(tl.int32)
    num_failed = tl.sum(failed, axis=0)
    if num_failed > 0:
        tl.debug_barrier()  # the block's Conv1D may still read the Idx and A slots these stores overwrite
        lst = pid_bh * tl.num_programs(2) + pid_s
        position = tl.atomic_add(Count + lst, num_failed) + tl.cumsum(failed, axis=0) - 1
        tl.store(Rows + lst.to(tl.int64) * Nq + position, offs_m, mask=failed != 0)
        tl.store(_floor_slot(outputs, sizes, pid_bh, lst, offs_m, SPLIT, K_PAD), floor, mask=failed != 0)
        if GATHER_T > 0:
            tl.store(A + (pid_bh.to(tl.int64) * Nq + offs_m) * num_neighbors, lane.to(tl.float32),
                     mask=failed != 0)


@triton.jit
def _finish(acc, s_self, inputs, outputs, v_strides, w_strides, o_strides, sizes, inv_temperature, pid_bh, pid_s,
            offs_m, mask_m, WEIGHTING: tl.constexpr, SELF_FIRST: tl.constexpr, HAS_BIAS: tl.constexpr,
            CANDIDATES: tl.constexpr, BLEND: tl.constexpr, DEPTHWISE: tl.constexpr, IEEE: tl.constexpr,
            SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
            BLOCK_O: tl.constexpr, ONE_C: tl.constexpr):
    """A block's end, its top-K keys ``acc`` found: sorted, then to Part (with a split) or to :func:`aggregate`."""
    _Out, _Idx, A, Part, _Count, _Rows = outputs
    Nq, num_neighbors = sizes[1], sizes[5]
    acc = tl.sort(acc, descending=True)  # [BLOCK_M, K_PAD], rank 0 first
    if SPLIT:
        part_rows = (pid_bh.to(tl.int64) * tl.num_programs(2) + pid_s) * Nq + offs_m
        tl.store(Part + part_rows[:, None] * K_PAD + tl.arange(0, K_PAD)[None, :], acc, mask=mask_m[:, None])
        if SELF_FIRST:  # the merge reads the query's own score from A's first slot: the same bits as unsplit
            if pid_s == 0:
                tl.store(A + (pid_bh.to(tl.int64) * Nq + offs_m) * num_neighbors, s_self, mask=mask_m)
    else:
        aggregate(acc, s_self, inputs, outputs, v_strides, w_strides, o_strides, sizes, inv_temperature, pid_bh,
                  offs_m, mask_m, WEIGHTING, SELF_FIRST, HAS_BIAS, CANDIDATES, BLEND, DEPTHWISE, IEEE, BLOCK_M,
                  K_PAD, BLOCK_C, BLOCK_O, ONE_C)


@triton.jit(do_not_specialize=["sizes"])
def knn_fwd_repair(inputs, outputs, q_strides, k_strides, v_strides, w_strides, o_strides, sizes, scale,
                   inv_temperature, blend, WEIGHTING: tl.constexpr, SELF_FIRST: tl.constexpr, HAS_BIAS: tl.constexpr,
                   COSINE: tl.constexpr, CANDIDATES: tl.constexpr, BLEND: tl.constexpr, DEPTHWISE: tl.constexpr,
                   IEEE: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   D_PAD: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_O: tl.constexpr,
                   ONE_C: tl.constexpr, GATHER_N: tl.constexpr = 64, GATHER_T: tl.constexpr = 0):
    """The lanes' repair, launched after :func:`knn_fwd` with ``DEFER`` on a grid (P, B·H, splits) of its own block
    sizes (:func:`function.fwd_config`'s ``REPAIR_*``: few rows, wide tiles): program i of a (sample, head, split)
    takes the blocks i, i + P, … of BLOCK_M entries of its list of rows the lanes could not certify (P: a few
    programs an SM in all, not one a possible block — a grid of programs that find nothing cost the CIFAR layer
    40 µs of empty waves, bench/RESULTS.md §1n), so a few failed rows of many blocks stream the tiles once,
    together, instead of each block again for its own. Each row restarts from its first key and takes the split's
    keys ≥ its floor with :func:`select.repair_tile` (packed keys compared whole: any column order), then the block
    ends as knn_fwd's does (Part, or :func:`aggregate`), overwriting what knn_fwd wrote for those rows. The rows sit
    in another block and the tiles have another width, so nothing promises a score the lanes' bits: the floor is the
    lanes' K-th key lowered by :func:`select.lowered`. With ``GATHER_T`` (the "all" rule unsplit, at most
    ``GATHER_T`` tiles of the lanes' width ``GATHER_N``), a block whose rows each have one lane to rescan
    (:func:`select.lane_merge`) scores only their K keys and that lane's columns instead (:func:`_gather_repair`)."""
    _Out, _Idx, A, _Part, Count, Rows = outputs
    _H, Nq, _Nk, _num_cols, cols_per_split, num_neighbors, _D, _Dv, _C_out, _stride_cb, _width, _pad = sizes
    pid_m, pid_bh, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    lst = pid_bh * tl.num_programs(2) + pid_s
    count = tl.load(Count + lst)
    for blk in range(pid_m, tl.cdiv(count, BLOCK_M), tl.num_programs(0)):  # the list's blocks, in turn
        position = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = position < count
        offs_m = tl.load(Rows + lst.to(tl.int64) * Nq + position, mask=mask_m, other=0)
        floor = lowered(tl.load(_floor_slot(outputs, sizes, pid_bh, lst, offs_m, SPLIT, K_PAD), mask=mask_m,
                                other=EMPTY_KEY))
        live = tl.arange(0, K_PAD) >= K_PAD - num_neighbors
        block, acc, s_self, col_lo, col_hi = _open_block(inputs, q_strides, k_strides, sizes, scale, blend, pid_bh,
                                                         pid_s, offs_m, mask_m, 0, SELF_FIRST, COSINE, CANDIDATES,
                                                         BLEND, IEEE, BLOCK_M, BLOCK_N, D_PAD, K_PAD)
        first_tile = pid_s * (cols_per_split // BLOCK_N)  # each tile in the lanes' column order
        # every row of the block has its one lane: gather; else stream (rows of either kind)
        if GATHER_T > 0:
            lanes = tl.load(A + (pid_bh.to(tl.int64) * Nq + offs_m) * num_neighbors, mask=mask_m, other=0.0)
            lanes = lanes.to(tl.int32)
            if tl.min(tl.where(mask_m, lanes, 0), axis=0) >= 0:
                acc = _gather_repair(acc, block, lanes, inputs, outputs, q_strides, sizes, pid_bh, offs_m, mask_m,
                                     live, SELF_FIRST, COSINE, GATHER_N, GATHER_T, D_PAD, K_PAD)
            else:
                acc = _repair(acc, mask_m, floor, block, col_lo, col_hi, first_tile, live, num_neighbors,
                              SELF_FIRST, COSINE, CANDIDATES, BLEND, IEEE, True, BLOCK_M, BLOCK_N, D_PAD)
        else:
            acc = _repair(acc, mask_m, floor, block, col_lo, col_hi, first_tile, live, num_neighbors, SELF_FIRST,
                          COSINE, CANDIDATES, BLEND, IEEE, True, BLOCK_M, BLOCK_N, D_PAD)
        _finish(acc, s_self, inputs, outputs, v_strides, w_strides, o_strides, sizes, inv_temperature, pid_bh,
                pid_s, offs_m, mask_m, WEIGHTING, SELF_FIRST, HAS_BIAS, CANDIDATES, BLEND, DEPTHWISE, IEEE, SPLIT,
                BLOCK_M, K_PAD, BLOCK_C, BLOCK_O, ONE_C)


@triton.jit(do_not_specialize=["sizes", "num_splits"])
def knn_fwd_merge(inputs, outputs, q_strides, k_strides, v_strides, w_strides, o_strides, sizes, scale,
                  inv_temperature, num_splits,
                  WEIGHTING: tl.constexpr, SELF_FIRST: tl.constexpr, HAS_BIAS: tl.constexpr, COSINE: tl.constexpr,
                  CANDIDATES: tl.constexpr, DEPTHWISE: tl.constexpr, IEEE: tl.constexpr,
                  BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
                  BLOCK_O: tl.constexpr, ONE_C: tl.constexpr):
    """Grid (query blocks, B·H): merge the per-split top-K lists (each sorted descending), then :func:`aggregate`.
    Not for the blend rule, whose forward is never split (its normalisation spans the whole map)."""
    _Out, _Idx, A, Part, _Count, _Rows = outputs
    _H, Nq, _Nk, _num_cols, _cols_per_split, num_neighbors, _D, _Dv, _C_out, _stride_cb, _width, _pad = sizes
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < Nq
    slots = tl.arange(0, K_PAD)
    acc = tl.full([BLOCK_M, K_PAD], EMPTY_KEY, tl.int64)
    for split in range(num_splits):
        part_rows = (pid_bh.to(tl.int64) * num_splits + split) * Nq + offs_m
        part = tl.load(Part + part_rows[:, None] * K_PAD + slots[None, :], mask=mask_m[:, None], other=EMPTY_KEY)
        acc = tl.maximum(tl.bitonic_merge(acc), part)
    acc = tl.bitonic_merge(acc, descending=True)
    s_self = tl.zeros([BLOCK_M], tl.float32)
    if SELF_FIRST:  # written by split 0 of knn_fwd into A's first slot
        s_self = tl.load(A + (pid_bh.to(tl.int64) * Nq + offs_m) * num_neighbors, mask=mask_m, other=0.0)
    aggregate(acc, s_self, inputs, outputs, v_strides, w_strides, o_strides, sizes, inv_temperature, pid_bh, offs_m,
              mask_m, WEIGHTING, SELF_FIRST, HAS_BIAS, CANDIDATES, False, DEPTHWISE, IEEE, BLOCK_M, K_PAD, BLOCK_C,
              BLOCK_O, ONE_C)
