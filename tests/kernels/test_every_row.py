"""The every-row check (``every_row.check_every_row``) fails kernels planted with the defects it exists to catch.

Each plant runs the fused kernel (in Triton's interpreter on CPU) with one defect: the K-th and (K+1)-th keys
swapped on the rows whose top K + 1 fp64 scores lie within 1e-5 of each other (the rows the check it replaced left
unchecked), scores of TF32-rounded inputs, a softmax temperature 1 % off, ties broken to the higher index, and NaN
scores ranked first. The kernel itself passes the same checks (tests/kernels/test_knn_triton.py).
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from kernels.knn_triton import forward, knn_aggregate_triton
from kernels.reference import KnnResult, aggregate_neighbors, neighbor_weights, similarity_scores
from tests.kernels.every_row import DEVICE, check_every_row, random_inputs

K = 16
OPTIONS = dict(num_neighbors=K, similarity="cosine", weighting="softmax", temperature=0.5, groups=1)


def _inputs():  # one sample of 150 rows: 3 query blocks, 3 key tiles
    return random_inputs(batch=1, heads=1, tokens=150, dim=24, value_dim=20, out_channels=12, num_neighbors=K,
                         depthwise=False, seed=1)[:5]


def _rejects(planted, inputs, options, match, **check):
    """The check raises on the planted kernel's result, with a message matching ``match``."""
    with pytest.raises(AssertionError, match=match):
        check_every_row(planted, *inputs, **options, **check)


def test_the_kernel_passes_the_check_the_plants_fail():
    inputs = _inputs()
    check_every_row(knn_aggregate_triton(*inputs, **OPTIONS), *inputs, **OPTIONS)


def test_a_kernel_that_swaps_the_kth_and_next_key_where_they_are_close_fails():
    """The kernel's K + 1 best keys, the last two swapped on the rows whose top K + 1 fp64 scores are not all
    1e-5 apart; outputs and weights recomputed at the swapped keys, so only the selection can tell."""
    q, k, v, weight, bias = inputs = _inputs()
    top = similarity_scores(q.detach().double(), k.detach().double()).topk(K + 1, dim=-1).values
    close = ((top[..., :-1] - top[..., 1:]) <= 1e-5).any(-1)  # (B, H, N)
    assert 0 < close.float().mean() < 0.12
    with torch.no_grad():
        one_more = torch.cat([weight, weight[..., :1]], -1)  # a tap for the (K+1)-th key
        idx = knn_aggregate_triton(q, k, v, one_more, bias, **OPTIONS | dict(num_neighbors=K + 1)).topk_idx
    idx = torch.where(close[..., None], idx[..., [*range(K - 1), K]], idx[..., :K])
    weights = neighbor_weights(similarity_scores(q, k).gather(-1, idx), "softmax", OPTIONS["temperature"])
    planted = KnnResult(aggregate_neighbors(v, idx, weights, weight, bias), idx, weights)
    _rejects(planted, inputs, OPTIONS, "rows differ from the reference beyond the rounding")


def _tf32(x):
    """x with its fp32 mantissa rounded to TF32's 10 bits (to nearest), as TF32 tensor cores read their inputs;
    the gradient passes straight through."""
    bits = x.detach().view(torch.int32)
    return x + (((bits + 0x1000) & -0x2000).view(torch.float32) - x).detach()


def test_a_kernel_with_tf32_scores_fails():
    """Unweighted (ρ = none), so the output at the kernel's own keys is right: only the selection can tell."""
    q, k, v, weight, bias = inputs = _inputs()
    options = OPTIONS | dict(weighting="none")
    _rejects(knn_aggregate_triton(_tf32(q), _tf32(k), v, weight, bias, **options), inputs, options,
             "rows differ from the reference beyond the rounding")


def test_a_kernel_with_a_wrong_temperature_fails():
    inputs = _inputs()
    planted = knn_aggregate_triton(*inputs, **OPTIONS | dict(temperature=OPTIONS["temperature"] * 1.01))
    _rejects(planted, inputs, OPTIONS, "out|weights")


def test_a_kernel_that_breaks_exact_ties_to_the_higher_index_fails():
    """Integer features (exact scores, many ties): the kernel run on the keys in reverse order and its indices
    mapped back. Every such swap is within rounding, so the bound on near-tie rows is what fails it."""
    gen = torch.Generator().manual_seed(2)
    q, k = (torch.randint(-1, 2, (1, 1, 100, 4), generator=gen).float().to(DEVICE) for _ in range(2))
    v = torch.randn(1, 1, 100, 3, generator=gen).to(DEVICE)
    weight = torch.randn(2, 3, 9, generator=gen).to(DEVICE)
    options = dict(num_neighbors=9, similarity="dot")
    reversed_keys = knn_aggregate_triton(q, k.flip(2), v.flip(2), weight, **options)
    planted = KnnResult(reversed_keys.out, 99 - reversed_keys.topk_idx, reversed_keys.topk_weights)
    _rejects(planted, (q, k, v, weight), options, "differ from the reference by near-ties", max_tie_share=0)


@triton.jit
def _nan_ranks_first(s):
    """The non-finite rule broken: a NaN score counts as the largest fp32 instead of −∞."""
    return tl.where(s == s, tl.minimum(s, 3.4028234663852886e38), 3.4028234663852886e38)


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter calls a jit helper by its module name; a compiled kernel "
                    "may come from a cache built with the real one")
def test_a_kernel_that_ranks_nan_scores_first_fails(monkeypatch):
    """Key 7 is NaN for every query; the kernel ranks it first instead of last."""
    monkeypatch.setattr(forward, "canonical", _nan_ranks_first)
    q, k, v, weight, bias = _inputs()
    k = k.detach().clone()
    k[:, :, 7] = math.nan
    inputs = (q, k, v, weight, bias)
    _rejects(knn_aggregate_triton(*inputs, **OPTIONS), inputs, OPTIONS, "rows differ from the reference")
