"""Backward kernels: nothing is re-selected; the forward's ``idx`` (int64, also returned) and weights ``a`` (fp32)
are reused. An index −1 (a padding cell of the blend rule's map: a zero value) gathers zero and receives nothing.

With ``dG_it = Σ_o dO_io W[o, :, t]``: ``dV[idx_it] += a_it dG_it``, ``da_it = ⟨dG_it, v[idx_it]⟩``, for softmax
``ds = a (da − Σ_t a da) / τ``, ``dq_i = Σ_t ds_it ∂s/∂q_i`` (owned by the query, no atomics) and
``dk_j += ds_it ∂s/∂k_j`` (:func:`knn_bwd_query`); ``dW[o, c, t] = Σ_i dO_io a_it v[idx_it, c]`` as one gather + GEMM
per tap (:func:`knn_bwd_weight`); deterministic scatters sum per key over an inverse index (:func:`knn_bwd_key_sum`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .select import column, dot, inv_norm


@triton.jit(do_not_specialize=["sizes"])
def knn_bwd_query(inputs, grads, q_strides, k_strides, v_strides, w_strides, do_strides, sizes, scale,
                  inv_temperature, COSINE: tl.constexpr, SOFTMAX: tl.constexpr, DEPTHWISE: tl.constexpr,
                  DETERMINISTIC: tl.constexpr, HAS_GRAD_A: tl.constexpr, IEEE: tl.constexpr,
                  BLOCK_M: tl.constexpr, D_PAD: tl.constexpr, K_PAD: tl.constexpr, BLOCK_C: tl.constexpr,
                  BLOCK_O: tl.constexpr):
    """Grid (query blocks, B·H), query-owned: dV scatter, da → ds (softmax), dq, dk scatter; depthwise dW partials.

    ``inputs`` = (Q, K, V, W, Idx, A, GradA, DOut), ``grads`` = (DQ, DK, DV, DWPart), ``sizes`` = (H, Nq, Nk, K, D,
    Dv, C_out). DV is (BH, Nk, Dv) fp32 (atomics) or (BH, Nq·K, Dv) per-(query, slot) contributions
    (DETERMINISTIC); likewise DK with D. For cosine, DQ and DK receive gradients w.r.t. the normalised q̂ and k̂.
    """
    Q, K, V, W, Idx, A, GradA, DOut = inputs
    DQ, DK, DV, DWPart = grads
    H, Nq, Nk, num_neighbors, D, Dv, C_out = sizes
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < Nq
    slots = tl.arange(0, K_PAD)
    mask_mk = mask_m[:, None] & (slots[None, :] < num_neighbors)
    row_ptrs = pid_bh.to(tl.int64) * Nq * num_neighbors + offs_m[:, None] * num_neighbors + slots[None, :]
    idx = tl.load(Idx + row_ptrs, mask=mask_mk, other=0).to(tl.int32)  # [BLOCK_M, K_PAD]
    a = tl.load(A + row_ptrs, mask=mask_mk, other=0.0)  # [BLOCK_M, K_PAD] fp32
    entry = pid_bh.to(tl.int64) * Nq * num_neighbors + offs_m.to(tl.int64) * num_neighbors  # first (query, slot)
    v_base = V + b * v_strides[0] + h * v_strides[1]
    do_base = DOut + b * do_strides[0]
    dtype = V.dtype.element_ty
    da = tl.zeros([BLOCK_M, K_PAD], tl.float32)

    for t in range(num_neighbors):
        j_t = column(idx, slots, t)
        a_t = column(a, slots, t)
        for c0 in range(0, Dv, BLOCK_C):
            offs_c = c0 + tl.arange(0, BLOCK_C)
            mask_c = offs_c < Dv
            mask_mc = mask_m[:, None] & mask_c[None, :]
            if DEPTHWISE:
                chan = h * Dv + offs_c
                d_out = tl.load(do_base + chan[None, :] * do_strides[1] + offs_m[:, None] * do_strides[2],
                                mask=mask_mc, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_C]
                w_t = tl.load(W + chan * w_strides[0] + t * w_strides[2], mask=mask_c, other=0.0).to(tl.float32)
                dg = d_out * w_t[None, :]
            else:
                dg = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)
                for o0 in range(0, C_out, BLOCK_O):
                    offs_o = o0 + tl.arange(0, BLOCK_O)
                    mask_o = offs_o < C_out
                    d_out = tl.load(do_base + offs_o[None, :] * do_strides[1] + offs_m[:, None] * do_strides[2],
                                    mask=mask_m[:, None] & mask_o[None, :], other=0.0)  # [BLOCK_M, BLOCK_O]
                    w_t = tl.load(W + offs_o[:, None] * w_strides[0] + offs_c[None, :] * w_strides[1]
                                  + t * w_strides[2], mask=mask_o[:, None] & mask_c[None, :], other=0.0)
                    dg += dot(d_out.to(dtype), w_t.to(dtype), IEEE)
            if SOFTMAX or DEPTHWISE:
                v_t = tl.load(v_base + j_t[:, None] * v_strides[2] + offs_c[None, :] * v_strides[3],
                              mask=mask_mc & (j_t >= 0)[:, None], other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_C]
                if SOFTMAX:
                    da = tl.where(slots[None, :] == t, da + tl.sum(dg * v_t, axis=1)[:, None], da)
                if DEPTHWISE:
                    dw = tl.sum(d_out * a_t[:, None] * v_t, axis=0)  # [BLOCK_C]
                    dw_ptrs = DWPart + ((pid_m * tl.num_programs(1) + pid_bh) * Dv + offs_c) * num_neighbors + t
                    tl.store(dw_ptrs, dw, mask=mask_c)
            contrib = dg * a_t[:, None]
            if DETERMINISTIC:
                tl.store(DV + (entry + t)[:, None] * Dv + offs_c[None, :], contrib, mask=mask_mc)
            else:
                dv_ptrs = DV + (pid_bh.to(tl.int64) * Nk + j_t)[:, None] * Dv + offs_c[None, :]
                tl.atomic_add(dv_ptrs, contrib, mask=mask_mc & (j_t >= 0)[:, None], sem="relaxed")

    if SOFTMAX:
        if HAS_GRAD_A:
            da += tl.load(GradA + row_ptrs, mask=mask_mk, other=0.0)
        ds = a * (da - tl.sum(a * da, axis=1)[:, None]) * inv_temperature  # [BLOCK_M, K_PAD]
        offs_d = tl.arange(0, D_PAD)
        mask_md = mask_m[:, None] & (offs_d[None, :] < D)
        q = tl.load(Q + b * q_strides[0] + h * q_strides[1] + offs_m[:, None] * q_strides[2]
                    + offs_d[None, :] * q_strides[3], mask=mask_md, other=0.0).to(tl.float32)
        if COSINE:
            q = q * inv_norm(q)[:, None]  # ∂s/∂k̂ = q̂
        else:
            q = q * scale  # ∂s/∂k = q / √D
        k_base = K + b * k_strides[0] + h * k_strides[1]
        dq = tl.zeros([BLOCK_M, D_PAD], tl.float32)
        for t in range(num_neighbors):
            j_t = column(idx, slots, t)
            ds_t = column(ds, slots, t)
            k_t = tl.load(k_base + j_t[:, None] * k_strides[2] + offs_d[None, :] * k_strides[3], mask=mask_md,
                          other=0.0).to(tl.float32)
            if COSINE:
                k_t = k_t * inv_norm(k_t)[:, None]
            else:
                k_t = k_t * scale
            dq += ds_t[:, None] * k_t
            contrib = ds_t[:, None] * q
            if DETERMINISTIC:
                tl.store(DK + (entry + t)[:, None] * D + offs_d[None, :], contrib, mask=mask_md)
            else:
                dk_ptrs = DK + (pid_bh.to(tl.int64) * Nk + j_t)[:, None] * D + offs_d[None, :]
                tl.atomic_add(dk_ptrs, contrib, mask=mask_md, sem="relaxed")
        tl.store(DQ + (pid_bh.to(tl.int64) * Nq + offs_m)[:, None] * D + offs_d[None, :], dq, mask=mask_md)


@triton.jit(do_not_specialize=["sizes"])
def knn_bwd_weight(inputs, DWPart, v_strides, do_strides, sizes, IEEE: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_C: tl.constexpr, BLOCK_O: tl.constexpr):
    """Standard Conv1D weight gradient, dW[o, c, t] = Σ_(b,i) dO[b, o, i] · a_it · v[b, idx_it, c] (one head).

    ``inputs`` = (V, Idx, A, DOut), ``sizes`` = (Nq, num_rows, rows_per_split, K, Dv, C_out). Grid (K, output ×
    input channel blocks, row splits); each program writes its partial sum over a range of the B·Nq rows to DWPart
    (splits, C_out, Dv, K); the host sums the splits (deterministic, no atomics).
    """
    V, Idx, A, DOut = inputs
    Nq, num_rows, rows_per_split, num_neighbors, Dv, C_out = sizes
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
        j = tl.load(Idx + rows.to(tl.int64) * num_neighbors + t, mask=mask_r, other=0).to(tl.int32)
        a_t = tl.load(A + rows.to(tl.int64) * num_neighbors + t, mask=mask_r, other=0.0)
        g = tl.load(V + b[:, None].to(tl.int64) * v_strides[0] + j[:, None] * v_strides[2]
                    + offs_c[None, :] * v_strides[3], mask=(mask_r & (j >= 0))[:, None] & mask_c[None, :], other=0.0)
        g = (g.to(tl.float32) * a_t[:, None]).to(dtype)  # [BLOCK_R, BLOCK_C]
        d_out = tl.load(DOut + b[None, :].to(tl.int64) * do_strides[0] + offs_o[:, None] * do_strides[1]
                        + i[None, :] * do_strides[2], mask=mask_o[:, None] & mask_r[None, :], other=0.0)
        acc += dot(d_out.to(dtype), g, IEEE)  # [BLOCK_O, BLOCK_R] @ [BLOCK_R, BLOCK_C]
    part_ptrs = DWPart + ((pid_s * C_out + offs_o[:, None]) * Dv + offs_c[None, :]) * num_neighbors + t
    tl.store(part_ptrs, acc, mask=mask_o[:, None] & mask_c[None, :])


@triton.jit(do_not_specialize=["sizes"])
def knn_bwd_key_sum(Contrib, Order, Offsets, Out, sizes, BLOCK_J: tl.constexpr, BLOCK_W: tl.constexpr):
    """Deterministic scatter: Out[bh, j] = Σ Contrib[bh, e] over the entries e of key j, in stable-sorted order.

    ``sizes`` = (Nk, num_entries, width). Order (BH, num_entries) lists entries (query·K + slot) sorted by key,
    Offsets (BH, Nk + 1) where each key starts.
    """
    Nk, num_entries, width = sizes
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
        acc += tl.load(Contrib + (pid_bh * num_entries + ent)[:, None] * width + offs_w[None, :],
                       mask=has[:, None] & mask_w[None, :], other=0.0)
    tl.store(Out + (pid_bh * Nk + offs_j)[:, None] * width + offs_w[None, :], acc,
             mask=mask_j[:, None] & mask_w[None, :])
