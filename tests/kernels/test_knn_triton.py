"""The fused Triton kernel equals the PyTorch reference (METHOD §2–3): selections, outputs and every gradient.

On CPU the kernels run in Triton's interpreter (``conftest.py``) at small N in fp32; on a CUDA machine the same tests
run on the GPU, plus bf16 and larger-N tests. Every result is checked by ``every_row.check_every_row`` against the
fp64 reference, on every row: a selection may differ from the reference's only by near-ties within the rounding of
the kernel's scores, on a bounded share of the rows, and with integer-valued features (exact scores) on none, where
the kernel must reproduce the reference's stable lower-index tie-break exactly.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re

import pytest
import torch

from kernels import dispatch, knn_aggregate, resolve_backend
from kernels.checks import fused_unsupported_reason
from kernels.knn_triton import backward, function, knn_aggregate_triton, use_selection
from kernels.reference import similarity_scores
from tests.kernels.cases import kernel_cases
from tests.kernels.every_row import DEVICE, OUT_TOL, check_every_row, random_candidates, random_inputs

CUDA_ONLY = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
TEMPERATURE = 0.5
LEAVES = ("q", "k", "v", "weight", "bias")


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _deterministic(enabled):
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(enabled)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


# ---------------------------------------------------------------------------------------------------------------
# Equivalence with the reference
# ---------------------------------------------------------------------------------------------------------------
def _cases():
    """similarity × weighting × aggregation × candidate set × self_first (on a GPU every combination, in the
    interpreter every two factors' combinations: :func:`cases.kernel_cases`); K and N cycle through the sizes."""
    sizes = [(9, 77), (16, 120), (32, 110), (9, 256), (16, 97), (32, 100)]
    flags = kernel_cases([["cosine", "dot"], ["none", "softmax", "uniform"], ["standard", "depthwise"],
                          ["all", "random"], [False, True]], strength=2)
    return [(*case, *sizes[i % len(sizes)]) for i, case in enumerate(flags)]


@pytest.mark.parametrize(
    "similarity, weighting, aggregation, candidates, self_first, num_neighbors, tokens", _cases(),
    ids=lambda x: str(x))
def test_kernel_matches_reference(similarity, weighting, aggregation, candidates, self_first, num_neighbors,
                                  tokens):
    """METHOD §2–3: dense scores → stable top-K → ρ → gather → Conv1D, and its gradients, fused."""
    depthwise = aggregation == "depthwise"
    seed = tokens * 31 + num_neighbors
    q, k, v, weight, bias, groups = random_inputs(
        batch=2, heads=2 if depthwise else 1, tokens=tokens, dim=20 if depthwise else 24,
        value_dim=6 if depthwise else 20, out_channels=12, num_neighbors=num_neighbors, depthwise=depthwise,
        seed=seed)
    cand = None
    if candidates == "random":
        cand = random_candidates(2, tokens, max(num_neighbors + 8, tokens // 3), shared=self_first, seed=seed)
    options = dict(num_neighbors=num_neighbors, similarity=similarity, weighting=weighting, temperature=TEMPERATURE,
                   groups=groups, candidates=cand, self_first=self_first)
    result = knn_aggregate_triton(q, k, v, weight, bias, **options)
    check_every_row(result, q, k, v, weight, bias, **options, seed=seed)


@pytest.mark.parametrize("num_neighbors", [1, 2, 64])
def test_extreme_neighbor_counts(num_neighbors):
    """K = 1, 2 and 64 (K_PAD = the key tile): same selection, output and gradients as the reference, on one
    head (several heads: the depthwise cases of test_kernel_matches_reference)."""
    q, k, v, weight, bias, groups = random_inputs(batch=1, heads=1, tokens=90, dim=16, value_dim=5, out_channels=0,
                                                  num_neighbors=num_neighbors, depthwise=True, seed=num_neighbors)
    options = dict(num_neighbors=num_neighbors, similarity="dot", weighting="softmax", temperature=TEMPERATURE,
                   groups=groups)
    check_every_row(knn_aggregate_triton(q, k, v, weight, bias, **options), q, k, v, weight, bias, **options)


def _forward_variants(q, k, v, weight, bias, options, **overrides):
    """The forward launcher with default heuristics and with ``overrides`` (num_splits, config)."""
    args = (q, k, v, weight, bias, *options.values())
    with torch.no_grad():
        return function.launch_forward(*args), function.launch_forward(*args, **overrides)


@pytest.mark.parametrize("candidates", ["all", "random"])
def test_split_candidate_range_merges_to_the_same_result(candidates):
    """Splitting the candidates across programs (partial top-K lists, then a merge) gives the reference's result:
    the unsplit one's keys, and its weights and output to fp32 rounding (a row the lanes cannot certify in one and
    not the other is scored again in another block by the deferred repair, and the interpreter's matrix products
    may round a score differently there). Two ranges of whole 64-key tiles: every key, 150 columns in 128 + 22;
    110 sampled, 64 + 46. Seed 22: each run, split or not, has a row the lanes cannot certify (repaired)."""
    q, k, v, weight, bias, groups = random_inputs(batch=2, heads=1, tokens=150, dim=24, value_dim=20,
                                                  out_channels=12, num_neighbors=16, depthwise=False, seed=22)
    cand = random_candidates(2, 150, 110, shared=False, seed=22) if candidates == "random" else None
    options = dict(num_neighbors=16, similarity="cosine", weighting="softmax", temperature=TEMPERATURE,
                   groups=groups, candidates=cand, self_first=True)
    single, split = _forward_variants(q, k, v, weight, bias, options, num_splits=2)
    check_every_row(split, q, k, v, weight, bias, **options)
    (out, idx, a), (single_out, single_idx, single_a) = split, single
    torch.testing.assert_close(idx, single_idx, rtol=0, atol=0)
    torch.testing.assert_close(out, single_out)
    torch.testing.assert_close(a, single_a)


@pytest.mark.parametrize("num_neighbors, candidates, self_first", [
    (2, "all", False), (9, "all", True), (16, "random", False), (5, "random", True)])
def test_small_tiles_take_every_merge_path(num_neighbors, candidates, self_first):
    """16×16 tiles over 100 keys (75 sampled): tiles are merged by top-K, by row-maximum insertion or skipped; the
    reference's result, the same keys as the default tiles. Seeds with a row the 16-wide lanes cannot certify
    (repaired) at K = 9 and 16."""
    q, k, v, weight, bias, groups = random_inputs(batch=1, heads=1, tokens=100, dim=12, value_dim=4, out_channels=0,
                                                  num_neighbors=num_neighbors, depthwise=True, seed=num_neighbors + 6)
    cand = random_candidates(1, 100, 75, shared=True, seed=7) if candidates == "random" else None
    options = dict(num_neighbors=num_neighbors, similarity="dot", weighting="softmax", temperature=TEMPERATURE,
                   groups=groups, candidates=cand, self_first=self_first)
    default, tiled = _forward_variants(q, k, v, weight, bias, options, config=dict(BLOCK_M=16, BLOCK_N=16))
    check_every_row(tiled, q, k, v, weight, bias, **options)
    torch.testing.assert_close(tiled[1], default[1], rtol=0, atol=0)  # indices


def test_strided_inputs_give_the_contiguous_result():
    """q, k, v as transposed (B, N, H, D) views, a permuted weight and an expanded grad_out: the reference's
    values and gradients (checked on the strided run), and the contiguous inputs' to 1e-6."""
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(3, 2, 120, 2, 16, generator=gen).to(DEVICE)  # (3, B, N, H, D)
    q, k, v = (x.transpose(1, 2) for x in qkv.unbind(0))  # (B, H, N, D) views
    weight = torch.randn(9, 1, 32, generator=gen).to(DEVICE).permute(2, 1, 0)  # (H·Dv, 1, K), not contiguous
    options = dict(num_neighbors=9, similarity="cosine", weighting="softmax", groups=32)
    results = []
    for args in ((q, k, v, weight), tuple(x.contiguous() for x in (q, k, v, weight))):
        leaves = [x.detach().clone().requires_grad_() for x in args]
        views = [leaf.transpose(1, 2).transpose(1, 2) if leaf.dim() == 4 else leaf for leaf in leaves]
        result = knn_aggregate_triton(*views, **options)
        if not results:  # the strided run; the contiguous one must equal it
            check_every_row(result, *views, **options)
        result.out.sum().backward()  # expanded, stride-0 grad_out
        results.append((result.out, result.topk_idx, *(leaf.grad for leaf in leaves)))
    for strided, contiguous in zip(*results, strict=True):
        torch.testing.assert_close(strided, contiguous, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Ties: integer-valued features, exact lower-index tie-break
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("candidates", ["all", "random"])
@pytest.mark.parametrize("self_first", [False, True])
def test_dot_ties_break_to_the_lower_index(candidates, self_first):
    """METHOD §2: equal scores rank by lower index (candidate order for sampled keys), exactly as the reference."""
    gen = torch.Generator().manual_seed(21)
    q, k = (torch.randint(-1, 2, (2, 1, 100, 4), generator=gen).float().to(DEVICE) for _ in range(2))
    v = torch.randn(2, 1, 100, 8, generator=gen).to(DEVICE)
    weight = torch.randn(6, 8, 16, generator=gen).to(DEVICE)
    cand = random_candidates(2, 100, 70, shared=False, seed=21) if candidates == "random" else None
    options = dict(num_neighbors=16, similarity="dot", candidates=cand, self_first=self_first)
    result = knn_aggregate_triton(q, k, v, weight, **options)
    check_every_row(result, q, k, v, weight, **options, max_tie_share=0)  # exact scores: every row exactly
    ties = (similarity_scores(q, k, "dot").gather(-1, result.topk_idx).diff(dim=-1) == 0).float().mean()
    assert ties > 0.3  # the test is about ties: most rows must have some


def test_cosine_ties_between_duplicate_keys_break_to_the_lower_index():
    """Duplicate key rows (integer features) score exactly alike; the lower index ranks first, as in the reference.

    Zero queries score 0 against every key (F.normalize semantics): a tie over the whole row.
    """
    gen = torch.Generator().manual_seed(0)
    base = torch.randint(-9, 10, (7, 6), generator=gen).float()  # 7 distinct keys, each repeated ~17 times
    k = base[torch.randint(0, 7, (1, 1, 120), generator=gen)].to(DEVICE)
    q = torch.randint(-9, 10, (1, 1, 120, 6), generator=gen).float().to(DEVICE)
    q[..., :3, :] = 0
    v = torch.randn(1, 1, 120, 5, generator=gen).to(DEVICE)
    weight = torch.randn(4, 5, 9, generator=gen).to(DEVICE)
    # Precondition: distinct keys are far from tying, so any tie the kernel sees is between exact duplicates.
    per_base = similarity_scores(q[..., 3:, :].double(), base[None, None].double().to(DEVICE), "cosine")[0, 0]
    gaps = (per_base[:, :, None] - per_base[:, None, :]).abs() + torch.eye(7, device=DEVICE)
    assert gaps.min() > 1e-4
    options = dict(num_neighbors=9, similarity="cosine", weighting="softmax")
    check_every_row(knn_aggregate_triton(q, k, v, weight, **options), q, k, v, weight, **options, max_tie_share=0)


# ---------------------------------------------------------------------------------------------------------------
# Deterministic backward
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("similarity, aggregation", [("cosine", "standard"), ("dot", "depthwise")])
def test_deterministic_backward_equals_atomic_backward(similarity, aggregation):
    """torch.use_deterministic_algorithms(True): key-owned sums, bit-reproducible, the reference's gradients and
    the atomic scatter's. The mode is read by the backward when it runs (the forward does not depend on it), so
    one forward's graph is differentiated three times: atomic, then deterministic twice."""
    depthwise = aggregation == "depthwise"
    *leaves, groups = random_inputs(batch=2, heads=2 if depthwise else 1, tokens=110, dim=16, value_dim=6,
                                    out_channels=10, num_neighbors=9, depthwise=depthwise, seed=4)
    cand = random_candidates(2, 110, 60, shared=True, seed=4) if not depthwise else None
    options = dict(num_neighbors=9, similarity=similarity, weighting="softmax", groups=groups, candidates=cand)
    result = knn_aggregate_triton(*leaves, **options)

    def grads(deterministic):
        with _deterministic(deterministic):  # check_every_row differentiates with retain_graph
            return check_every_row(result, *leaves, **options)

    atomic, first, second = grads(False), grads(True), grads(True)
    for name in LEAVES:
        torch.testing.assert_close(first[name], second[name], rtol=0, atol=0)
        torch.testing.assert_close(first[name], atomic[name], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Backward computes only the gradients autograd asks for
# ---------------------------------------------------------------------------------------------------------------
def _record_launches(monkeypatch, kernel_names):
    """Wrap backward kernels so that each launch appends the kernel's name to the returned list."""
    launched = []

    class Recorded:
        def __init__(self, name):
            self.name, self.kernel = name, getattr(backward, name)

        def __getitem__(self, grid):
            launched.append(self.name)
            return self.kernel[grid]

    for name in kernel_names:
        monkeypatch.setattr(backward, name, Recorded(name))
    return launched


def _frozen_case(aggregation):
    """The leaves and options of test_frozen_inputs_get_no_gradient_and_the_others_are_unchanged: one sample
    (batches: test_kernel_matches_reference), two heads for depthwise aggregation."""
    depthwise = aggregation == "depthwise"
    *leaves, groups = random_inputs(batch=1, heads=2 if depthwise else 1, tokens=70, dim=12, value_dim=6,
                                    out_channels=10, num_neighbors=9, depthwise=depthwise, seed=8)
    options = dict(num_neighbors=9, similarity="cosine", weighting="softmax", temperature=TEMPERATURE, groups=groups)
    return leaves, options


def _frozen_run(aggregation, deterministic, trains):
    """The kernel's gradients of the leaves that train (check_every_row: against the fp64 reference)."""
    leaves, options = _frozen_case(aggregation)
    fresh = [x.detach().clone().requires_grad_(trains[name]) for name, x in zip(LEAVES, leaves, strict=True)]
    with _deterministic(deterministic):
        return check_every_row(knn_aggregate_triton(*fresh, **options), *fresh, **options)


@functools.cache
def _every_grad(aggregation, deterministic):
    """:func:`_frozen_run` with every leaf training, once per (aggregation, mode) for the frozen sets that share it."""
    return {name: grad.detach() for name, grad in
            _frozen_run(aggregation, deterministic, dict.fromkeys(LEAVES, True)).items()}


@pytest.mark.parametrize("aggregation, frozen, deterministic", [  # in the interpreter each frozen set once
    (aggregation, *frozen) for aggregation, frozen in kernel_cases([["standard", "depthwise"], [
        ("weight", False), ("weight bias", True), ("q k", False), ("q k v", True), ("k", True), ("v", False)]],
        strength=1)])
def test_frozen_inputs_get_no_gradient_and_the_others_are_unchanged(aggregation, frozen, deterministic,
                                                                    monkeypatch):
    """Gradients of the leaves that train equal the fp64 reference's and the run where every leaf trains; only the
    backward launches they need run, none for the frozen leaves (requires_grad=False): the standard dW kernel for a
    trainable weight, the query-owned kernel for q, k, v or a depthwise weight, the deterministic key sums for v
    and k. The run where every leaf trains is made once per (aggregation, mode) in a test session."""
    depthwise = aggregation == "depthwise"
    every_grad = _every_grad(aggregation, deterministic)
    launched = _record_launches(monkeypatch, ["knn_bwd_query", "knn_bwd_weight", "knn_bwd_key_sum"])
    trains = {name: name not in frozen.split() for name in LEAVES}
    grads = _frozen_run(aggregation, deterministic, trains)

    query_owned = trains["q"] or trains["k"] or trains["v"] or (trains["weight"] and depthwise)
    key_sums = (trains["v"] + trains["k"]) if deterministic else 0
    standard_dw = trains["weight"] and not depthwise
    assert launched == (["knn_bwd_query"] * query_owned + ["knn_bwd_key_sum"] * key_sums
                        + ["knn_bwd_weight"] * standard_dw)
    same = dict(rtol=0, atol=0) if deterministic else dict(atol=1e-5, rtol=1e-5)  # atomics may reorder on a GPU
    for name, grad in grads.items():
        torch.testing.assert_close(grad, every_grad[name], **same, msg=lambda m, name=name: f"{name}: {m}")


# ---------------------------------------------------------------------------------------------------------------
# Arguments and dispatch
# ---------------------------------------------------------------------------------------------------------------
def _counted(function, calls):
    def counted(*args, **kwargs):
        calls.append(function.__name__)
        return function(*args, **kwargs)

    return counted


@pytest.mark.parametrize("entry", ["dispatch", "direct"])
def test_each_entry_checks_its_arguments_once_and_matches_the_reference(entry, monkeypatch):
    """knn_aggregate(backend="triton") and knn_aggregate_triton run the argument checks (one device sync for the
    candidate range) and the fused-kernel rule once per call; selections, output and gradients equal the reference."""
    calls = []
    for module in (dispatch, function):
        for name in ("check_knn_arguments", "fused_unsupported_reason"):
            monkeypatch.setattr(module, name, _counted(getattr(module, name), calls))
    q, k, v, weight, bias, groups = random_inputs(batch=2, heads=1, tokens=70, dim=8, value_dim=8, out_channels=8,
                                                  num_neighbors=9, depthwise=False, seed=2)
    cand = random_candidates(2, 70, 40, shared=False, seed=2)
    aggregate = functools.partial(knn_aggregate, backend="triton") if entry == "dispatch" else knn_aggregate_triton
    options = dict(num_neighbors=9, similarity="cosine", weighting="softmax", groups=groups, candidates=cand)
    check_every_row(aggregate(q, k, v, weight, bias, **options), q, k, v, weight, bias, **options, seed=2)
    assert sorted(calls) == ["check_knn_arguments", "fused_unsupported_reason"]


def test_dispatch_backend_triton_calls_the_kernel():
    q, k, v, weight, bias, _ = random_inputs(batch=1, heads=1, tokens=70, dim=8, value_dim=8, out_channels=8,
                                             num_neighbors=9, depthwise=False, seed=2)
    with torch.no_grad():
        routed = knn_aggregate(q, k, v, weight, bias, num_neighbors=9, backend="triton")
        direct = knn_aggregate_triton(q, k, v, weight, bias, num_neighbors=9)
    torch.testing.assert_close(routed.out, direct.out, rtol=0, atol=0)


def _checked_call(*, heads=1, tokens=50, dim=8, value_dim=8, groups=1, num_neighbors=9, similarity="cosine",
                  dtype=torch.float32, huge=False):
    """q, k, v, weight and options that pass the argument checks; ``huge``: 2**31 expanded (unallocated) q, k."""
    if huge:
        q = k = torch.zeros(1, 1, 1, 1, device=DEVICE, dtype=dtype).expand(1, heads, 2**16, 2**15)
    else:
        q = k = torch.randn(1, heads, tokens, dim, device=DEVICE, dtype=dtype)
    v = torch.randn(1, heads, q.shape[2], value_dim, device=DEVICE, dtype=dtype)
    c_in = heads * value_dim
    c_out = c_in if groups == c_in else 4
    weight = torch.randn(c_out, c_in // groups, num_neighbors, device=DEVICE, dtype=dtype)
    return q, k, v, weight, dict(num_neighbors=num_neighbors, similarity=similarity, groups=groups)


@pytest.mark.parametrize("call, message", [
    (dict(similarity="euclidean"), "similarity must be one of ('cosine', 'dot')"),
    (dict(heads=2), "needs one head"),
    (dict(groups=2), "groups must be 1 or H·Dv=8"),
    (dict(tokens=140, num_neighbors=129), "num_neighbors must be ≤ 128"),
    (dict(dtype=torch.float64), "torch.float64"),
    (dict(huge=True, value_dim=1), "2147483648 or more elements"),
])
def test_calls_outside_the_kernel_are_refused_by_one_rule(call, message, monkeypatch):
    """fused_unsupported_reason is the one rule: the launcher raises its message, and the dispatch refuses
    backend="triton" with the same message (backend="auto" falls back to the reference on it)."""
    monkeypatch.delenv(dispatch.BACKEND_ENV_VAR, raising=False)
    q, k, v, weight, options = _checked_call(**call)
    reason = fused_unsupported_reason(q, k, v, weight, options["num_neighbors"], options["similarity"],
                                      options["groups"], None)
    assert reason is not None and message in reason
    with pytest.raises(ValueError, match=re.escape(reason)):
        knn_aggregate_triton(q, k, v, weight, **options)
    with pytest.raises(ValueError, match=re.escape(reason)):
        knn_aggregate(q, k, v, weight, **options, backend="triton")
    assert resolve_backend("auto", torch.device("cuda"), reason) == "reference"


def test_the_rule_accepts_what_the_kernel_runs_and_refuses_masks(monkeypatch):
    """One head with a standard Conv1D and depthwise aggregation pass the rule (backend="auto" then picks the
    kernel on CUDA); an attn_mask does not."""
    monkeypatch.delenv(dispatch.BACKEND_ENV_VAR, raising=False)
    for call in (dict(), dict(heads=2, groups=16)):
        q, k, v, weight, options = _checked_call(**call)
        assert fused_unsupported_reason(q, k, v, weight, options["num_neighbors"], options["similarity"],
                                        options["groups"], None) is None
    assert resolve_backend("auto", torch.device("cuda"), None) == "triton"
    mask = torch.ones(1, 1, 50, 50, dtype=torch.bool, device=DEVICE)
    with pytest.raises(ValueError, match="attn_mask is not implemented by the Triton kernel"):
        knn_aggregate(q, k, v, weight, **options, attn_mask=mask, backend="triton")


@pytest.mark.parametrize("change, message", [
    (dict(groups=3), "groups"),
    (dict(num_neighbors=200), "num_neighbors"),
    (dict(similarity="euclidean"), "similarity"),
    (dict(weighting="max"), "weighting"),
    (dict(temperature=0.0), "temperature"),
    (dict(candidates=torch.zeros(1, 4, dtype=torch.int32)), "candidates"),
])
def test_invalid_arguments_raise_value_error(change, message):
    q = k = v = torch.randn(1, 1, 50, 8, device=DEVICE)
    options = dict(num_neighbors=9, groups=1) | change
    if "candidates" in options:
        options["candidates"] = options["candidates"].to(DEVICE)
    weight = torch.randn(4, 8, options["num_neighbors"], device=DEVICE)
    with pytest.raises(ValueError, match=message):
        knn_aggregate_triton(q, k, v, weight, **options)


def test_standard_conv1d_with_several_heads_raises():
    q = k = v = torch.randn(1, 2, 50, 8, device=DEVICE)
    with pytest.raises(ValueError, match="one head"):
        knn_aggregate_triton(q, k, v, torch.randn(4, 16, 9, device=DEVICE), num_neighbors=9, groups=1)


def test_mixed_dtypes_raise():
    q = torch.randn(1, 1, 50, 8, device=DEVICE)
    with pytest.raises(ValueError, match="dtype"):
        knn_aggregate_triton(q, q.double(), q, torch.randn(4, 8, 9, device=DEVICE), num_neighbors=9)


def test_bf16_is_refused_in_the_interpreter_whose_bf16_arithmetic_is_wrong(monkeypatch):
    """Triton's interpreter computes bf16 outputs off by ~1e10 without a word: the rule refuses it (the dispatch's
    backend="auto" then takes the reference); fp32 and fp16 run there."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read at call time
    q = k = v = torch.randn(1, 1, 20, 8, device=DEVICE, dtype=torch.bfloat16)
    weight = torch.randn(4, 8, 4, device=DEVICE, dtype=torch.bfloat16)
    reason = fused_unsupported_reason(q, k, v, weight, 4, "cosine", 1, None)
    assert reason is not None and "bfloat16 does not run correctly in Triton's interpreter" in reason
    with pytest.raises(ValueError, match="bfloat16 does not run correctly"):
        knn_aggregate_triton(q, k, v, weight, num_neighbors=4)
    for dtype in (torch.float32, torch.float16):
        assert fused_unsupported_reason(q.to(dtype), k.to(dtype), v.to(dtype), weight.to(dtype), 4, "cosine", 1,
                                        None) is None


@pytest.mark.parametrize("similarity", ["cosine", "dot"])
@pytest.mark.parametrize("weighting", ["none", "softmax", "uniform"])
@pytest.mark.parametrize("candidates", ["all", "random"])
def test_a_nan_key_ranks_last_weighs_zero_and_both_backends_agree(similarity, weighting, candidates):
    """The rule for non-finite scores (kernels.reference): a NaN key scores −∞ for every query, so it is never
    picked while K others exist; the query itself stays rank 0 (self_first) and weighs 0 when its own score is NaN;
    the weights reported are the weights applied, on the reference; the kernel's result is the reference's."""
    gen = torch.Generator().manual_seed(3)
    N, D, C, K, nan_key = 24, 4, 3, 5, 7
    q = torch.randn(1, 1, N, D, generator=gen)
    k = q.clone()
    k[0, 0, nan_key] = math.nan
    v = torch.randn(1, 1, N, C, generator=gen)
    weight = torch.randn(2, C, K, generator=gen)
    cand = torch.arange(0, N, 2).view(1, -1) if candidates == "random" else None  # the NaN key is a candidate
    q, k, v, weight = (x.to(DEVICE) for x in (q, k, v, weight))
    options = dict(num_neighbors=K, similarity=similarity, weighting=weighting, self_first=True,
                   candidates=None if cand is None else cand.to(DEVICE))
    ref = knn_aggregate(q, k, v, weight, **options, backend="reference")
    check_every_row(knn_aggregate(q, k, v, weight, **options, backend="triton"), q, k, v, weight, **options)
    idx, weights = ref.topk_idx[0, 0].cpu(), ref.topk_weights[0, 0].cpu()
    assert torch.equal(idx[:, 0], torch.arange(N))
    others = torch.arange(N) != nan_key
    assert not (idx[others] == nan_key).any() and weights[nan_key, 0] == 0
    gathered = v[0, 0].cpu()[idx] * weights[..., None]  # (N, K, C): each neighbour times the weight reported
    expected = torch.nn.functional.conv1d(gathered.permute(2, 0, 1).reshape(1, C, N * K), weight.cpu(), stride=K)
    torch.testing.assert_close(ref.out.cpu(), expected, **OUT_TOL[torch.float32])


@pytest.mark.parametrize("weighting", ["none", "softmax"])
def test_a_nan_token_is_its_own_rank_zero_and_no_one_elses_neighbour(weighting):
    """The plain layer's q = k = v = x with one NaN token: that query ranks itself first, every score it has is
    NaN (→ −∞, ties to the lower index), so all its weights are 0 (its own NaN value still makes its output NaN:
    0·NaN = NaN); no other query picks it, so every other output stays finite; on both backends, and the kernel's
    result is the fp64 reference's."""
    gen = torch.Generator().manual_seed(4)
    N, K, nan_token = 20, 4, 11
    x = torch.randn(1, 1, N, 3, generator=gen)
    x[0, 0, nan_token] = math.nan
    weight, bias = torch.randn(2, 3, K, generator=gen), torch.randn(2, generator=gen)
    x, weight, bias = (t.to(DEVICE) for t in (x, weight, bias))
    options = dict(num_neighbors=K, weighting=weighting, self_first=True)
    results = [knn_aggregate(x, x, x, weight, bias, **options, backend=b) for b in ("reference", "triton")]
    for result in results:
        idx = result.topk_idx[0, 0].cpu()
        assert idx[nan_token].tolist() == [nan_token, 0, 1, 2]
        assert not (idx[torch.arange(N) != nan_token] == nan_token).any()
        assert not result.topk_weights[0, 0, nan_token].any()
        finite = torch.isfinite(result.out[0]).all(0).cpu()
        assert finite.tolist() == [i != nan_token for i in range(N)]
    check_every_row(results[1], x, x, x, weight, bias, **options)


# ---------------------------------------------------------------------------------------------------------------
# GPU only: bf16 and sizes the interpreter is too slow for
# ---------------------------------------------------------------------------------------------------------------
@CUDA_ONLY
@pytest.mark.parametrize("selection", ["auto", "lanes", "rounds"])
@pytest.mark.parametrize("similarity, weighting, aggregation, candidates", [
    ("cosine", "none", "standard", "all"),
    ("dot", "softmax", "depthwise", "all"),
    ("dot", "softmax", "depthwise", "random"),
    ("cosine", "uniform", "standard", "random"),
])
def test_bf16_matches_reference_on_gpu(similarity, weighting, aggregation, candidates, selection):
    """bf16 in, fp32 accumulate: every row's selection, outputs and gradients to bf16 rounding, under both
    selections (:func:`kernels.knn_triton.use_selection`)."""
    depthwise = aggregation == "depthwise"
    q, k, v, weight, bias, groups = random_inputs(
        batch=2, heads=2 if depthwise else 1, tokens=1500, dim=64, value_dim=32 if depthwise else 64,
        out_channels=48, num_neighbors=16, depthwise=depthwise, seed=7, dtype=torch.bfloat16)
    cand = random_candidates(2, 1500, 256, shared=False, seed=7) if candidates == "random" else None
    options = dict(num_neighbors=16, similarity=similarity, weighting=weighting, temperature=TEMPERATURE,
                   groups=groups, candidates=cand)
    with use_selection(selection):
        result = knn_aggregate_triton(q, k, v, weight, bias, **options)
    check_every_row(result, q, k, v, weight, bias, **options)


@CUDA_ONLY
@pytest.mark.parametrize("selection", ["auto", "lanes", "rounds"])
@pytest.mark.parametrize("num_neighbors", [9, 32])
def test_large_n_fp32_matches_reference_on_gpu(num_neighbors, selection):
    """N = 4096, one head: the candidate range is split across programs and merged (fp32, exact IEEE scores),
    under each selection."""
    q, k, v, weight, bias, groups = random_inputs(batch=1, heads=1, tokens=4096, dim=64, value_dim=64,
                                                  out_channels=64, num_neighbors=num_neighbors, depthwise=False,
                                                  seed=num_neighbors)
    options = dict(num_neighbors=num_neighbors, similarity="cosine", weighting="softmax", temperature=TEMPERATURE,
                   groups=groups, self_first=True)
    with use_selection(selection):
        result = knn_aggregate_triton(q, k, v, weight, bias, **options)
    check_every_row(result, q, k, v, weight, bias, **options, grad_tol=dict(atol=1e-3, rtol=1e-3))


@CUDA_ONLY
def test_a_random_layer_trains_without_a_device_sync():
    """The layer's CPU draw is range-checked on the CPU and copied without blocking: one training step of a
    random-candidate layer (forward + backward under autocast) makes no host–device sync, so the host queues the
    next layer while the GPU works (bench/kernel.py's ``layer_random32_fwdbwd`` was host-bound on it). The result
    equals the layer's reference path with the same candidates on the GPU."""
    from convnn import ConvNN2d

    torch.manual_seed(0)
    layer = ConvNN2d(16, 16, num_neighbors=9, selection="random", num_candidates=32).to(DEVICE).train()
    x = torch.randn(4, 16, 16, 16, device=DEVICE, requires_grad=True)
    with torch.autocast("cuda", torch.bfloat16):
        layer(x).float().sum().backward()  # compiles the kernels
    torch.cuda.synchronize()
    state = layer._sampler.generator.get_state()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", torch.bfloat16):
            out = layer(x)
            out.float().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    layer._sampler.generator.set_state(state)  # the same draw again, on the GPU through the reference
    layer.backend = "reference"
    with torch.autocast("cuda", torch.bfloat16):
        expected = layer(x)
    torch.testing.assert_close(out.float(), expected.float(), **OUT_TOL[torch.bfloat16])


@CUDA_ONLY
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rule, warm, batch", [("blend", 4, 8), ("all", 1, 8), ("all", 16, 8), ("all", 1, 40),
                                               ("all", 16, 40)])
def test_a_warm_start_selects_the_reference_sets_on_gpu(dtype, rule, warm, batch):
    """With the floors a warm start sets (fwd_config ``WARM``: the blend rule's default 4; for every key 1 tile, or
    16: all of them, the floor then the bound of every tile's elementwise max) the kernel gives the reference's
    result on every row, on the GPU at the CIFAR layer's size (32×32 map, K = 9, 64×64 tiles). Batch 8 leaves the
    GPU half empty, so the keys are split over programs (each split's floor from its own tiles); clustered keys give
    many near-equal scores at the floor: in fp32 on the CPU about 1.5 % of their rows round to another near-tie
    than fp64, so up to 5 % may differ by legal near-ties."""
    from kernels.reference import BlendGrid

    gen = torch.Generator().manual_seed(9)
    tokens = 1024
    centres = torch.randn(8, 64, generator=gen)
    keys = centres[torch.randint(0, 8, (batch, 1, tokens), generator=gen)] + 0.05 * torch.randn(
        batch, 1, tokens, 64, generator=gen)
    q = k = keys.to(DEVICE, dtype)
    v = torch.randn(batch, 1, tokens, 32, generator=gen).to(DEVICE, dtype)
    weight = torch.randn(48, 32, 9, generator=gen).to(DEVICE, dtype)
    blend = BlendGrid(32, 32, 3, 0.5) if rule == "blend" else None
    weighting = "none" if rule == "blend" else "softmax"
    options = dict(num_neighbors=9, similarity="cosine", weighting=weighting, temperature=1.0, groups=1,
                   candidates=None, self_first=True, blend=blend)
    warmed = function.launch_forward(q, k, v, weight, None, *options.values(), config=dict(LANES=False, WARM=warm))
    check_every_row(warmed, q, k, v, weight, **options, max_tie_share=0.05)
