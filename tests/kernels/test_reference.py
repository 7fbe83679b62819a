"""The PyTorch reference (the spec): tie-breaking, weighting, gradients (METHOD §2)."""

import os

import pytest
import torch

from kernels import knn_aggregate
from kernels.reference import knn_aggregate_reference, neighbor_scores, neighbor_weights, select_topk, similarity_scores


def test_select_topk_orders_by_score_and_breaks_ties_by_lower_index():
    scores = torch.tensor([[3.0, 1.0, 3.0, 2.0, 3.0, 2.0]])
    topk_scores, idx = select_topk(scores, 4)
    assert idx.tolist() == [[0, 2, 4, 3]] and topk_scores.tolist() == [[3.0, 3.0, 3.0, 2.0]]


def test_select_topk_matches_a_stable_sort_on_integer_scores():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (5, 9, 40), generator=generator).float()
    for k in (1, 7, 13, 40):
        expected = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
        assert torch.equal(select_topk(scores, k)[1], expected)


def test_self_index_is_forced_to_rank_zero_with_its_real_score():
    scores = torch.tensor([[0.1, 0.9, 0.5]])
    topk_scores, idx = select_topk(scores, 2, self_index=torch.tensor([0]))
    assert idx.tolist() == [[0, 1]] and topk_scores[0].tolist() == pytest.approx([0.1, 0.9])


def test_weightings():
    scores = torch.tensor([[2.0, 1.0, float("-inf")]])
    assert neighbor_weights(scores, "none").tolist() == [[1.0, 1.0, 0.0]]
    assert neighbor_weights(scores, "uniform").tolist() == [[0.5, 0.5, 0.0]]
    soft = neighbor_weights(scores, "softmax", temperature=0.5)
    torch.testing.assert_close(soft, torch.tensor([[1.0, torch.e**-2, 0.0]]) / (1 + torch.e**-2))


@pytest.mark.parametrize("weighting", ["none", "softmax", "uniform"])
@pytest.mark.parametrize("similarity", ["cosine", "dot", "euclidean"])
def test_gradcheck_in_float64_with_the_selection_held_fixed(weighting, similarity):
    """METHOD §2: gradients reach v, the Conv1D and (softmax) q, k; checked against finite differences."""
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 7, 3, generator=generator, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    weight = torch.randn(6, 1, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(6, generator=generator, dtype=torch.float64, requires_grad=True)

    def run(q, k, v, weight, bias):
        return knn_aggregate_reference(q, k, v, weight, bias, num_neighbors=3, similarity=similarity,
                                       weighting=weighting, temperature=0.7, groups=6).out

    assert torch.autograd.gradcheck(run, (q, k, v, weight, bias))
    if weighting != "softmax":
        run(q, k, v, weight, bias).sum().backward()
        assert q.grad is None and k.grad is None


@pytest.mark.parametrize("kwargs, message", [
    ({"num_neighbors": 11}, "num_neighbors"),
    ({"num_neighbors": 5, "candidates": torch.tensor([[1, 2]])}, "num_neighbors"),
    ({"similarity": "l1"}, "similarity"),
    ({"temperature": -1.0}, "temperature"),
    ({"backend": "cuda"}, "backend"),
])
def test_knn_aggregate_rejects_impossible_arguments(kwargs, message):
    q = k = v = torch.randn(1, 1, 10, 4)
    options = {"num_neighbors": 3, **kwargs}
    weight = torch.randn(4, 4, options["num_neighbors"])
    with pytest.raises(ValueError, match=message):
        knn_aggregate(q, k, v, weight, **options)


def test_candidate_indices_outside_the_keys_are_refused():
    q = torch.randn(1, 1, 20, 4)
    with pytest.raises(ValueError, match=r"candidates must be key indices in \[0, Nk=20\)"):
        knn_aggregate(q, q, q, torch.randn(4, 4, 3), num_neighbors=3, candidates=torch.tensor([[1, 2, 999]]))


def test_integer_values_are_refused():
    q = torch.randn(1, 1, 20, 4)
    with pytest.raises(ValueError, match="floating-point"):
        knn_aggregate(q, q, q.long(), torch.randn(4, 4, 3), num_neighbors=3)


@pytest.mark.parametrize("similarity", ["cosine", "dot", "euclidean"])
def test_neighbor_scores_equal_the_gathered_score_matrix(similarity):
    generator = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 3, 7, 5, generator=generator), torch.randn(2, 3, 9, 5, generator=generator)
    idx = torch.randint(0, 9, (2, 3, 7, 4), generator=generator)
    expected = similarity_scores(q, k, similarity).gather(-1, idx)
    torch.testing.assert_close(neighbor_scores(q, k, idx, similarity), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the kernel on CPU tensors: needs "
                    "Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py without a GPU)")
def test_record_backends_names_the_path_each_aggregation_took():
    """The set a training card reports: empty without aggregations, "reference" on CPU, "triton" on the kernel
    (the interpreter stands in for CUDA here); an inner block collects only its own calls."""
    from kernels import record_backends

    q = torch.randn(1, 1, 12, 4)
    v = torch.randn(1, 1, 12, 3)
    weight = torch.randn(2, 3, 4)
    with record_backends() as outer:
        assert outer == set()
        knn_aggregate(q, q, v, weight, num_neighbors=4)
        with record_backends() as inner:
            knn_aggregate(q, q, v, weight, num_neighbors=4, backend="triton")
    assert outer == {"reference"} and inner == {"triton"}
    knn_aggregate(q, q, v, weight, num_neighbors=4)  # outside any block: nothing is collected, nothing fails
    assert outer == {"reference"}


def test_use_backend_sets_what_auto_resolves_to_inside_the_block_only(monkeypatch):
    """An explicit context (how a training run applies --backend), innermost first, ahead of $CONVNN_BACKEND; an
    explicit backend argument is kept."""
    from kernels import BACKEND_ENV_VAR, resolve_backend, use_backend

    monkeypatch.setenv(BACKEND_ENV_VAR, "triton")
    cpu = torch.device("cpu")
    with use_backend("reference"):
        assert resolve_backend("auto", cpu) == "reference"
        with use_backend("auto"):  # defers to the environment again
            assert resolve_backend("auto", torch.device("cuda")) == "triton"
    monkeypatch.delenv(BACKEND_ENV_VAR)
    assert resolve_backend("auto", torch.device("cuda")) in ("reference", "triton")  # outside: auto
    with pytest.raises(ValueError, match="backend must be one of"), use_backend("cuda"):
        pass


def test_a_missing_or_unknown_option_is_named_with_the_entry():
    """The options are written once (KnnOptions); a missing or misspelt one is named as Python names a call's own
    keyword-only argument, with the function the caller called — not the options class."""
    from kernels import knn_aggregate
    from kernels.reference import knn_aggregate_reference

    q = torch.randn(1, 1, 4, 2)
    weight = torch.randn(2, 2, 2)
    for entry, name in ((knn_aggregate, "knn_aggregate"), (knn_aggregate_reference, "knn_aggregate_reference")):
        with pytest.raises(TypeError, match=rf"^{name}\(\) missing 1 required keyword-only argument: 'num_neighbors'"):
            entry(q, q, q, weight)
        with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'num_neighbours'"):
            entry(q, q, q, weight, num_neighbours=2)
