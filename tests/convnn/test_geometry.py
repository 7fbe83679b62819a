"""ConvNN2d and HybridConvNN2d with nn.Conv2d's kernel_size, stride, padding and dilation (METHOD §3a), checked
against F.conv2d and against selections computed here by hand."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from convnn import ConvNN2d, HybridConvNN2d, record_neighbors
from convnn.functional import window_geometry

C_IN, C_OUT = 4, 8
GRID = list(itertools.product([1, 3, 5], [1, 2], [0, 1, "same"], [1, 2], [1, 2, C_IN]))


def conv_padding(kernel_size: int, padding, dilation: int) -> int:
    """``"same"`` as cells, computed here: d·(R − 1)/2 on every side."""
    return dilation * (kernel_size - 1) // 2 if padding == "same" else padding


@pytest.mark.parametrize(("kernel_size", "stride", "padding", "dilation", "groups"), GRID)
def test_window_selection_through_the_gather_path_is_conv2d(kernel_size, stride, padding, dilation, groups):
    """METHOD §4.1 with §3a, on the whole grid kernel_size × stride × padding × dilation × groups (108 cases, fp64,
    ≈ 2 s): window selection with K = R² gathers the window cells at the recorded indices and aggregates them with
    the Conv1D over rank slots; output and gradients equal F.conv2d with the same geometry (padding "same" as
    d·(R − 1)/2 cells, also with stride 2, where F.conv2d refuses the string).

    With weighting "none" the layer computes the window rule as F.conv2d itself, so this test sends it through the
    gather path: weighting "uniform" weighs every window cell 1/K, undone by a Conv1D weight K times the kernel's.
    """
    torch.manual_seed(0)
    x = torch.randn(2, C_IN, 11, 10, dtype=torch.float64, requires_grad=True)
    kernel = torch.randn(C_OUT, C_IN // groups, kernel_size, kernel_size, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(C_OUT, dtype=torch.float64, requires_grad=True)
    pad = conv_padding(kernel_size, padding, dilation)
    expected = F.conv2d(x, kernel, bias, stride=stride, padding=pad, dilation=dilation, groups=groups)

    layer = ConvNN2d(C_IN, C_OUT, selection="window", weighting="uniform", kernel_size=kernel_size, stride=stride,
                     padding=padding, dilation=dilation, groups=groups, dtype=torch.float64)
    count = kernel_size**2
    with torch.no_grad():
        layer.weight.copy_(kernel.flatten(2) * count)
        layer.bias.copy_(bias)
    with record_neighbors(layer) as records:
        out = layer(x)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert records[""][0].topk_weights.unique().tolist() == [1 / count]  # the gather path's ρ, not a conv

    grad = torch.randn_like(expected)
    want = torch.autograd.grad(expected, (x, kernel, bias), grad)
    got_x, got_weight, got_bias = torch.autograd.grad(out, (x, layer.weight, layer.bias), grad)
    torch.testing.assert_close(got_x, want[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_weight * count, want[1].flatten(2), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_bias, want[2], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("kernel_size", "stride", "padding", "dilation"),
                         [(3, 2, 1, 1), (3, 1, 0, 2), (5, 2, "same", 1), (3, 2, 3, 1), (1, 2, 0, 1)])
def test_the_convolution_shortcut_reads_the_cells_it_records(kernel_size, stride, padding, dilation):
    """Weighting "none" runs the window rule as F.conv2d; the indices it records (what the views show) are the
    cells that convolution reads: gathering the zero-padded input there, in rank order, and applying the Conv1D here
    gives the layer's output."""
    torch.manual_seed(1)
    x = torch.randn(1, 3, 9, 8, dtype=torch.float64)
    layer = ConvNN2d(3, 5, selection="window", kernel_size=kernel_size, stride=stride, padding=padding,
                     dilation=dilation, dtype=torch.float64)
    with record_neighbors(layer) as records:
        out = layer(x)
    record = records[""][0]
    pad = conv_padding(kernel_size, padding, dilation)
    assert record.padding == pad
    padded = F.pad(x, (pad, pad, pad, pad)).flatten(2)  # (1, C, (H + 2p)·(W + 2p))
    gathered = padded[0][:, record.topk_idx[0, 0]]  # (C, N_out, K)
    expected = torch.einsum("cnk,ock->on", gathered, layer.weight) + layer.bias[:, None]
    torch.testing.assert_close(out.flatten(2)[0], expected, rtol=1e-12, atol=1e-12)


def by_hand_all(x: torch.Tensor, num_neighbors: int, stride: int, pad: int, similarity: str) -> torch.Tensor:
    """The "all" rule at queries 0, s, 2s, … (padding "same") written out: the candidates are the map's cells, or
    with ``pad`` > 0 the cells of the map zero-padded by ``pad``; the query first, then the best scores (ties to the
    lower index); returns (H_out·W_out, K) indices into the candidates."""
    padded = F.pad(x, (pad, pad, pad, pad))[0]  # (C, Hc, Wc)
    height, width = padded.shape[1:]
    keys = padded.flatten(1).T  # (Nc, C)
    rows = torch.arange(pad, height - pad, stride)
    cols = torch.arange(pad, width - pad, stride)
    query_index = (rows[:, None] * width + cols[None, :]).flatten()
    queries = keys[query_index]
    if similarity == "cosine":
        unit = keys / keys.norm(dim=1, keepdim=True).clamp_min(1e-12)
        scores = unit[query_index] @ unit.T
    else:  # euclidean: −‖q − k‖²
        scores = -((queries[:, None, :] - keys[None, :, :]) ** 2).sum(-1)
    scores[torch.arange(len(query_index)), query_index] = float("inf")  # the query first
    return torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :num_neighbors]


@pytest.mark.parametrize(("similarity", "candidate_padding"),
                         [("cosine", False), ("euclidean", False), ("euclidean", True), ("cosine", True)])
def test_strided_all_selection_picks_the_queries_neighbours_among_the_candidates(similarity, candidate_padding):
    """Stride 2: queries on the cells 0, 2, 4, … (METHOD §3a); their K neighbours are those computed by hand, among
    the map's cells, or with candidate_padding (the authors' layer) among the padded map's too; the output is the
    Conv1D over the gathered values."""
    torch.manual_seed(2)
    x = torch.randn(1, 3, 7, 6, dtype=torch.float64) * 0.3
    layer = ConvNN2d(3, 4, num_neighbors=6, selection="all", similarity=similarity, stride=2, padding=1,
                     candidate_padding=candidate_padding, dtype=torch.float64)
    with record_neighbors(layer) as records:
        out = layer(x)
    assert out.shape == (1, 4, 4, 3)
    pad = 1 if candidate_padding else 0
    expected_idx = by_hand_all(x, 6, 2, pad, similarity)
    record = records[""][0]
    assert torch.equal(record.topk_idx[0, 0], expected_idx)
    assert record.padding == pad
    assert record.queries.tolist() == [[r, c] for r in (0, 2, 4, 6) for c in (0, 2, 4)]
    values = F.pad(x, (pad,) * 4)[0].flatten(1)  # (C, Nc)
    expected = torch.einsum("cnk,ock->on", values[:, expected_idx], layer.weight) + layer.bias[:, None]
    torch.testing.assert_close(out.flatten(2)[0], expected, rtol=1e-12, atol=1e-12)


def test_candidate_padding_changes_euclidean_selections():
    """A query of small norm is nearer the zero tokens of the padding than its neighbours (−‖q‖² beats −‖q − k‖²): with
    candidate_padding it picks them, without it cannot (METHOD §3a)."""
    x = torch.ones(1, 2, 4, 4, dtype=torch.float64)
    x[0, :, 1, 1] = 0.1  # near zero
    picked = {}
    for candidate_padding in (False, True):
        layer = ConvNN2d(2, 2, num_neighbors=3, similarity="euclidean", padding=1,
                         candidate_padding=candidate_padding, dtype=torch.float64)
        with record_neighbors(layer) as records:
            layer(x)
        picked[candidate_padding] = records[""][0].cells()[0, 0, 1 * 4 + 1].tolist()
    assert picked[False][0] == [1, 1] and all(0 <= r < 4 and 0 <= c < 4 for r, c in picked[False])
    assert picked[True] == [[1, 1], [-1, -1], [-1, 0]]  # itself, then padding cells in index order


def test_hybrid_with_a_stride_is_both_branches_on_the_strided_grid():
    """HybridConvNN2d(stride=2, padding=1): its convolution is F.conv2d with that geometry, its window-selection
    branch (weights copied from a Conv2d of the same geometry, METHOD §4.1) too, mixed by the 1×1."""
    torch.manual_seed(3)
    x = torch.randn(2, 3, 9, 9)
    layer = HybridConvNN2d(3, 6, branch_ratio=0.5, selection="window", stride=2, padding=1)
    source = nn.Conv2d(3, 3, 3, stride=2, padding=1)
    layer.knn.load_conv2d_weight(source)
    knn_part = F.conv2d(x, source.weight, source.bias, stride=2, padding=1)
    conv_part = F.conv2d(x, layer.conv.weight, layer.conv.bias, stride=2, padding=1)
    expected = F.conv2d(torch.cat([knn_part, conv_part], 1), layer.mix.weight, layer.mix.bias)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    assert layer(x).shape == (2, 6, 5, 5)
    assert layer.extra_repr() == "3, 6, branch_ratio=0.5, stride=2, padding=1, dilation=1"
    assert layer.knn.extra_repr() == "3, 3, selection='window', stride=2, padding=1"


@pytest.mark.parametrize("selection", ["all", "random", "blend"])
def test_feature_rules_with_a_stride_give_conv2d_output_shapes(selection):
    options = dict(num_candidates=16) if selection == "random" else {}
    for stride, padding, height in ((2, 1, 9), (2, 0, 8), (3, "same", 10)):
        layer = HybridConvNN2d(4, 6, selection=selection, stride=stride, padding=padding, **options)
        conv = nn.Conv2d(4, 6, 3, stride=stride, padding=1 if padding == "same" else padding)
        x = torch.randn(1, 4, height, height)
        assert layer(x).shape == conv(x).shape


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(kernel_size=4), "kernel_size must be odd"),
    (dict(kernel_size=(3, 5)), "pair of equal integers"),
    (dict(stride=0), "stride must be an integer in \\[1"),
    (dict(padding="full"), "padding must be one of"),
    (dict(padding=-1), "padding must be an integer in \\[0"),
    (dict(padding_mode="reflect"), "padding_mode must be one of \\('zeros',\\)"),
    (dict(kernel_size=5, window_size=3), "kernel_size and window_size both name R"),
    (dict(padding=2), "puts queries 1 cells into the zero padding"),
    (dict(selection="window", candidate_padding=True), "candidate_padding"),
    (dict(candidate_padding=True, padding=0), "candidate_padding"),
    (dict(selection="blend", dilation=2), "blend' needs dilation=1"),
])
def test_geometry_arguments_outside_their_meaning_raise_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ConvNN2d(4, 4, **kwargs)


def test_a_window_that_does_not_fit_the_map_raises():
    layer = ConvNN2d(2, 2, selection="window", kernel_size=5, padding=0)
    with pytest.raises(ValueError, match="does not fit the 3×3 map"):
        layer(torch.randn(1, 2, 3, 3))


def test_the_defaults_keep_the_layer_as_it_was():
    """No geometry argument: padding "same", stride 1, K = R² = 9; a Conv2d geometry names the same thing."""
    layer = ConvNN2d(4, 4)
    assert (layer.num_neighbors, layer.window_size, layer.stride, layer.padding, layer.dilation) == (9, 3, 1, 1, 1)
    assert window_geometry((3, 3), (1, 1), (1, 1), (1, 1)) == layer.geometry
    assert ConvNN2d(4, 4, kernel_size=5, selection="window").num_neighbors == 25
