"""The one check of a fused-kernel result against the fp64 reference, on every row (docs/kernel.md, "Guarantees"),
and the random inputs the kernel tests draw.

Every kernel test hands :func:`check_every_row` what the kernel returned and the arguments it was called with.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from kernels.reference import (
    aggregate_neighbors,
    blend_scores,
    neighbor_scores,
    neighbor_weights,
    padded_tokens,
    query_positions_in_padded,
    select_topk,
    similarity_scores,
    spatial_scores,
)

# The kernel's scores are fp32 for every input dtype: fp32 inputs multiply in IEEE fp32; bf16 and fp16 products are
# exact in fp32 and are summed in fp32. ε bounds |kernel score − fp64 score| relative to the row's score scale
# (:func:`_scores64`). fp32: 64 units in the last place of fp32 (u = 2^-24); the largest error measured between
# fp32 and fp64 similarity on random inputs is ~5 u (16 M pairs, D ≤ 128); a D-term sum's worst case is D·u.
# bf16, fp16: twice that, for tensor cores that truncate while they accumulate.
EPS = {torch.float32: 2.0**-18, torch.bfloat16: 2.0**-17, torch.float16: 2.0**-17}
MAX_TIE_SHARE = 0.01  # random features: at most 1 % of the rows may hold a near-tie swap
OUT_TOL = {  # outputs and weights vs fp64: sums of ≤ K·Dv products, rounded to the input dtype
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
    torch.float16: dict(atol=1e-2, rtol=1e-2),
}
GRAD_TOL = {torch.float32: dict(atol=2e-4, rtol=1e-3)}
GRAD_REL_NORM = {torch.bfloat16: 2e-2, torch.float16: 5e-3}  # grad_out enters the half-precision GEMMs rounded
_F32_MAX = torch.finfo(torch.float32).max
_INPUTS = ("q", "k", "v", "weight", "bias")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def check_every_row(result, q: Tensor, k: Tensor, v: Tensor, weight: Tensor, bias: Tensor | None = None, *,
                    num_neighbors: int, similarity: str = "cosine", weighting: str = "none",
                    temperature: float = 1.0, groups: int = 1, candidates: Tensor | None = None,
                    self_first: bool = False, blend=None, max_tie_share: float = MAX_TIE_SHARE,
                    out_tol: dict | None = None, grad_tol: dict | None = None,
                    seed: int = 0) -> dict[str, Tensor | None]:
    """Assert that the kernel's ``result`` is the reference's on every row, up to the rounding of its scores.

    ``result`` is ``(out, topk_idx, topk_weights)`` — a :class:`kernels.reference.KnnResult` or what
    ``function.launch_forward`` returns — for the inputs and options it was called with (the keyword arguments
    of :func:`kernels.knn_aggregate_triton`). The reference is :mod:`kernels.reference` evaluated in fp64 on the
    same inputs.

    **Selection, every row.** A row must equal the reference's K keys in rank order (ties to the lower index; with
    sampled candidates, to the earlier candidate), or differ only by near-ties: at each rank the kernel's key
    scores within tol of the reference's key of that rank, every key the kernel adds scores ≥ s_K − tol and
    every key it drops ≤ s_K + tol (s_K the reference's K-th score, fp64), and its keys are distinct candidates.
    tol is ``EPS[q.dtype]`` (fp32 2^-18, bf16 and fp16 2^-17) times the row's score scale: 1 for cosine,
    ‖q_i‖·max_j ‖k_j‖/√D for dot (a bound on |q·k|/√D), 1 + 4α·that scale / the row's feature range for the blend
    rule. Such rows are counted; their share may not exceed ``max_tie_share`` (pass 0 for exactly representable
    scores: integer features). Scores follow the reference's non-finite rule in the fp32 range the kernel's
    scores have — NaN → −∞, above the largest fp32 → the largest fp32, below its negative → −∞ — and these
    canonical values are exact in every dtype, so ties among them must break exactly as in the reference.

    **Values.** Output and weights equal the fp64 reference evaluated at the kernel's keys — the reference's own
    keys on every row that matches, a legal near-tie's keys elsewhere — within ``out_tol`` (default
    ``OUT_TOL[dtype]``), NaN where the reference has NaN.

    **Gradients**, when ``out`` requires grad: of Σ out·g (+ Σ topk_weights·g' when the weights carry a gradient)
    for seeded random g, w.r.t. each of q, k, v, weight, bias that requires grad, against fp64 autograd of the
    same reference: elementwise within ``grad_tol`` (default ``GRAD_TOL``) in fp32, by relative norm
    (``GRAD_REL_NORM``) in bf16 and fp16. A gradient the reference does not have must be absent or zero.

    Returns:
        dict[str, Tensor | None]: the kernel's gradients it compared, by input name (None where it gave none).
    """
    out, idx, weights = result
    dtype = q.dtype
    B, H, Nq = idx.shape[:3]
    assert out.dtype == dtype and out.shape == (B, weight.shape[0], Nq)
    assert idx.dtype == torch.int64 and idx.shape == (B, H, Nq, num_neighbors)
    assert weights.dtype == torch.float32 and weights.shape == idx.shape
    inputs = (q, k, v, weight, bias)
    inputs64 = [None if x is None else x.detach().double().requires_grad_(x.requires_grad) for x in inputs]
    q64, k64, v64, weight64, bias64 = inputs64
    with torch.autocast(q.device.type, enabled=False):
        scores, scale = _scores64(q64.detach(), k64.detach(), similarity, blend)  # (B, H, Nq, M), scale(keys)
        tie_share, ranked = _check_selection(idx, scores, lambda keys: EPS[dtype] * scale(keys), num_neighbors,
                                             candidates, self_first, blend)
        assert tie_share <= max_tie_share, (
            f"{tie_share:.2%} of the rows differ from the reference by near-ties, more than {max_tie_share:.2%}")

        if blend is None:  # differentiable through the selected keys only, where the kernel's gradients flow
            selected = _in_fp32_range(neighbor_scores(q64, k64, idx, similarity))
            selected = selected.masked_fill(ranked == -math.inf, -math.inf)  # a sampled copy of the query: masked
        else:  # the blend rule's weights (none, uniform) carry no gradient
            selected = scores.gather(-1, idx)
        weights64 = neighbor_weights(selected, weighting, temperature)
        values64 = v64 if blend is None else padded_tokens(v64, (blend.height, blend.width), blend.pad)
        out64 = aggregate_neighbors(values64, idx, weights64, weight64, bias64, groups)
        tol = out_tol or OUT_TOL[dtype]
        torch.testing.assert_close(out.double(), out64.detach(), equal_nan=True, **tol, msg=lambda m: f"out: {m}")
        torch.testing.assert_close(weights.double(), weights64.detach(), **tol, msg=lambda m: f"weights: {m}")
        grads = _check_gradients(out, weights, out64, weights64, inputs, inputs64, grad_tol, seed)
    return grads


def _in_fp32_range(scores: Tensor) -> Tensor:
    """fp64 scores as the reference's non-finite rule treats them in the fp32 range of the kernel's scores: NaN and
    anything below −(largest fp32) → −∞, anything above the largest fp32 → the largest fp32."""
    scores = torch.where(scores < -_F32_MAX, -math.inf, scores)
    return torch.where(scores.isnan(), -math.inf, scores.clamp(max=_F32_MAX))


def _similarity64(q64: Tensor, k64: Tensor, similarity: str) -> Tensor:
    """fp64 similarity as the fp32 kernel and reference compute it: a dot product that leaves the fp32 range
    overflows to ±∞ before it is scaled by 1/√D (``kernels.reference.similarity_scores`` sums first, then scales)."""
    if similarity != "dot":
        return similarity_scores(q64, k64, similarity)
    products = q64 @ k64.transpose(-1, -2)
    products = torch.where(products.abs() > _F32_MAX, products.sign() * math.inf, products)
    return products / math.sqrt(q64.shape[-1])


def _scores64(q64: Tensor, k64: Tensor, similarity: str, blend) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """fp64 scores of every query against every key (B, H, Nq, Nk), or every padded cell of the blend rule's map;
    and a function of a row's keys (B, H, Nq, n) giving (B, H, Nq, 1): a bound on the magnitude of the scores
    compared there, in the units their rounding scales with — 1 for cosine; ‖q_i‖·max ‖k_j‖/√D over those keys for
    dot (one large key elsewhere does not loosen the row); for the blend rule, whose normalisation divides feature
    errors by the row's range over every cell, 1 + 4α·‖q_i‖·max over all cells ‖k_j‖/√D / range (its three terms,
    score, low and range, carry one each)."""
    grid = None if blend is None else (blend.height, blend.width)
    keys64 = k64 if blend is None else padded_tokens(k64, grid, blend.pad)
    if similarity == "cosine":
        ones = torch.ones_like(q64[..., :1])

        def magnitude(keys: Tensor) -> Tensor:
            return ones
    else:
        q_norms = q64.norm(dim=-1).nan_to_num(nan=0.0)
        k_norms = keys64.norm(dim=-1).nan_to_num(nan=0.0)

        def magnitude(keys: Tensor) -> Tensor:
            norms = k_norms[:, :, None, :].expand(*keys.shape[:3], k_norms.shape[-1]).gather(-1, keys)
            return (q_norms * norms.amax(-1) / math.sqrt(q64.shape[-1])).unsqueeze(-1)
    feature = _in_fp32_range(_similarity64(q64, keys64, similarity))
    if blend is None:
        return feature, magnitude
    finite = feature > -math.inf
    spread = feature.where(finite, -math.inf).amax(-1, keepdim=True) - feature.where(finite, math.inf).amin(
        -1, keepdim=True)
    every_cell = torch.arange(keys64.shape[2], device=q64.device).expand(*feature.shape)
    rows = 1 + 4 * blend.alpha * magnitude(every_cell) / spread.clamp_min(torch.finfo(torch.float32).tiny)
    scores = blend_scores(feature, spatial_scores(*grid, blend.window_size, q64.device), blend.alpha)
    return scores, lambda keys: rows


def _check_selection(idx, scores, tolerance, num_neighbors, candidates, self_first, blend) -> tuple[float, Tensor]:
    """Assert the every-row rule of :func:`check_every_row` on the kernel's keys ``idx``, with ``tolerance`` a
    function of the keys a row compares (the kernel's and the reference's) giving its tol; return the share of rows
    that differ from the reference (by legal near-ties) and the ranking score of each of the kernel's slots."""
    B, H, Nq = idx.shape[:3]
    M = scores.shape[-1]
    assert ((idx >= 0) & (idx < M)).all(), "keys out of range"
    query = torch.arange(Nq, device=idx.device)
    if blend is not None:
        query = query_positions_in_padded(blend.height, blend.width, blend.pad, idx.device)
        self_first = True
    if candidates is None:  # the columns are the keys (or cells)
        column_keys, columns, ranking = None, idx, scores.clone()
    else:  # column 0 the query itself, then the sampled keys in their order; a sampled query is masked
        r = candidates.shape[-1]
        sampled = candidates.to(idx.device).expand(B, r)
        column_keys = torch.cat([query.view(1, Nq, 1).expand(B, Nq, 1), sampled[:, None, :].expand(B, Nq, r)], -1)
        column_keys = column_keys[:, None].expand(B, H, Nq, r + 1)
        ranking = scores.gather(-1, column_keys).clone()
        ranking[..., 1:] = ranking[..., 1:].masked_fill(column_keys[..., 1:] == query.view(Nq, 1), -math.inf)
        position = torch.full((B, M), -1, dtype=torch.long, device=idx.device)
        position.scatter_(1, sampled, torch.arange(1, r + 1, device=idx.device).expand(B, r))
        columns = position[:, None, None, :].expand(B, H, Nq, M).gather(-1, idx)
        # The query's first occurrence is column 0; a second one is its masked sampled copy (−∞, K beyond the
        # finite candidates), which ranks after it.
        own = idx == query.view(Nq, 1)
        columns = torch.where(own & (own.cumsum(-1) == 1), 0, columns)
    if self_first:
        self_column = 0 if candidates is not None else query
        ranking[..., torch.arange(Nq, device=idx.device), self_column] = math.inf
    ref_scores, ref_columns = select_topk(ranking, num_neighbors)
    ref_keys = ref_columns if column_keys is None else column_keys.gather(-1, ref_columns)
    tol = tolerance(torch.cat([idx, ref_keys], -1))

    is_candidate = (columns >= 0).all(-1)
    distinct = (columns.sort(-1).values.diff(dim=-1) != 0).all(-1)
    got = ranking.gather(-1, columns.clamp_min(0))
    canonical = (got == -math.inf) | (got >= _F32_MAX) | (ref_scores == -math.inf) | (ref_scores >= _F32_MAX)
    near = ~canonical & ((got - ref_scores).abs() <= tol)
    ranks_agree = ((columns == ref_columns) | near).all(-1)
    kth = ref_scores[..., -1:]
    added = ~(columns[..., :, None] == ref_columns[..., None, :]).any(-1)
    dropped = ~(ref_columns[..., :, None] == columns[..., None, :]).any(-1)
    sets_agree = ((~added | (got >= kth - tol)) & (~dropped | (ref_scores <= kth + tol))).all(-1)
    legal = is_candidate & distinct & ranks_agree & sets_agree
    if not legal.all():
        detail = []
        for row in legal.logical_not().nonzero()[:3].tolist():
            row = tuple(row)
            ranks = (columns[row] != ref_columns[row]).nonzero().flatten().tolist()
            detail.append(f"(b, h, i) = {row}, tol {tol[row].item():.3g}: " + ", ".join(
                f"rank {t} kernel key {idx[row][t].item()} ({got[row][t].item():.9g}) vs reference key "
                f"{ref_keys[row][t].item()} ({ref_scores[row][t].item():.9g})" for t in ranks[:4]))
        detail = "; ".join(detail)
        raise AssertionError(f"{int((~legal).sum())} of {legal.numel()} rows differ from the reference beyond the "
                             f"rounding of their scores: {detail}")
    return (columns != ref_columns).any(-1).float().mean().item(), got


def _check_gradients(out, weights, out64, weights64, inputs, inputs64, grad_tol, seed) -> dict[str, Tensor | None]:
    """Gradients of the kernel's outputs vs fp64 autograd of the reference at the same keys (see
    :func:`check_every_row`); returns the kernel's."""
    trained = [i for i, x in enumerate(inputs) if x is not None and x.requires_grad]
    if not out.requires_grad or not trained:
        return {}
    gen = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.device)
    loss, loss64 = (out.double() * grad_out).sum(), (out64 * grad_out).sum()
    if weights.requires_grad:
        grad_weights = torch.randn(weights.shape, generator=gen, dtype=torch.float64).to(out.device)
        loss, loss64 = loss + (weights.double() * grad_weights).sum(), loss64 + (weights64 * grad_weights).sum()
    got = torch.autograd.grad(loss, [inputs[i] for i in trained], allow_unused=True, retain_graph=True)
    expected = torch.autograd.grad(loss64, [inputs64[i] for i in trained], allow_unused=True)
    dtype = inputs[0].dtype
    for i, grad, grad64 in zip(trained, got, expected, strict=True):
        name = _INPUTS[i]
        if grad64 is None:
            assert grad is None or not grad.any(), f"{name}: a gradient the reference does not have"
        elif dtype in GRAD_REL_NORM:
            assert grad is not None, f"{name}: missing gradient"
            error = (grad.double() - grad64).norm() / grad64.norm()
            assert error <= GRAD_REL_NORM[dtype], f"{name}: relative error {error:.3g}"
        else:
            assert grad is not None, f"{name}: missing gradient"
            torch.testing.assert_close(grad.double(), grad64, **(grad_tol or GRAD_TOL[dtype]),
                                       msg=lambda m, name=name: f"{name}: {m}")
    return {_INPUTS[i]: grad for i, grad in zip(trained, got, strict=True)}


def random_inputs(*, batch, heads, tokens, dim, value_dim, out_channels, num_neighbors, depthwise, seed,
                  dtype=torch.float32):
    """q, k, v, weight, bias (leaves requiring grad, on DEVICE) and groups for a standard (one head) or depthwise
    Conv1D over ``num_neighbors`` rank slots; standard normal features."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, heads, tokens, dim, generator=gen) for _ in range(2))
    v = torch.randn(batch, heads, tokens, value_dim, generator=gen)
    if depthwise:
        groups, c_out = heads * value_dim, heads * value_dim
        weight = torch.randn(c_out, 1, num_neighbors, generator=gen)
    else:
        groups, c_out = 1, out_channels
        weight = torch.randn(c_out, value_dim, num_neighbors, generator=gen) / math.sqrt(value_dim)
    bias = torch.randn(c_out, generator=gen)
    leaves = [x.to(DEVICE, dtype).requires_grad_() for x in (q, k, v, weight, bias)]
    return (*leaves, groups)


def random_candidates(batch, tokens, num_candidates, shared, seed):
    """(B, r) or (1, r) int64 keys drawn without replacement (METHOD §3), unsorted, on DEVICE."""
    gen = torch.Generator().manual_seed(seed)
    rows = 1 if shared else batch
    return torch.stack([torch.randperm(tokens, generator=gen)[:num_candidates] for _ in range(rows)]).to(DEVICE)
