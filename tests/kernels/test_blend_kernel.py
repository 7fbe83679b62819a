"""The blend rule in the fused kernel equals the reference (METHOD §3): the selected padded cells (near-tie-aware),
the weights, the output and the gradients of v, weight and bias; and a blend ConvNN2d gives the same output and
records on both backends.

The reference is ``kernels.reference.select_neighbors(blend=...)`` in fp64 (feature scores against the zero-padded
map, min–max normalised, mixed with the spatial profile, the query first); gradients are autograd of the
reference aggregation over the zero-padded values at the kernel's own indices.
"""

from __future__ import annotations

import pytest
import torch

from convnn import ConvNN2d, record_neighbors
from kernels import knn_aggregate
from kernels.reference import (
    BlendGrid,
    aggregate_neighbors,
    blend_scores,
    neighbor_weights,
    padded_tokens,
    similarity_scores,
    spatial_scores,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SELECT_GAP = 1e-5


def _blended64(q, k, blend, similarity):
    grid = (blend.height, blend.width)
    feature = similarity_scores(q.double(), padded_tokens(k.double(), grid, blend.pad), similarity)
    return blend_scores(feature, spatial_scores(*grid, blend.window_size, q.device).double(), blend.alpha)


@pytest.mark.parametrize("similarity, weighting, depthwise, grid, window_size, alpha", [
    ("cosine", "none", False, (7, 9), 3, 0.5),
    ("dot", "uniform", True, (5, 13), 5, 0.3),
    ("cosine", "uniform", False, (11, 6), 3, 0.8),
    ("dot", "none", True, (9, 9), 3, 0.6),
])
def test_fused_blend_equals_the_reference(similarity, weighting, depthwise, grid, window_size, alpha):
    gen = torch.Generator().manual_seed(window_size)
    B, C, K = 2, 6, 9
    N = grid[0] * grid[1]
    heads, dv = (2, 3) if depthwise else (1, C)
    q = torch.randn(B, heads, N, 4, generator=gen)
    k = torch.randn(B, heads, N, 4, generator=gen)
    v = torch.randn(B, heads, N, dv, generator=gen)
    weight = torch.randn(heads * dv if depthwise else 5, 1 if depthwise else dv, K, generator=gen)
    bias = torch.randn(weight.shape[0], generator=gen)
    leaves = [x.to(DEVICE).requires_grad_() for x in (q, k, v, weight, bias)]
    blend = BlendGrid(*grid, window_size, alpha)
    options = dict(num_neighbors=K, similarity=similarity, weighting=weighting, groups=heads * dv if depthwise else 1,
                   self_first=True, blend=blend)
    result = knn_aggregate(*leaves, backend="triton", **options)

    scores64 = _blended64(leaves[0].detach(), leaves[1].detach(), blend, similarity)
    expected = knn_aggregate(*(x.detach().double() for x in leaves), backend="reference", **options)
    top = scores64.topk(K + 1, dim=-1).values[..., 1:]  # rank 0 is the forced query
    gaps = top[..., :-1] - top[..., 1:]
    safe = ((gaps > SELECT_GAP) | (gaps == 0)).all(-1)  # exact ties (padding cells at one distance) are exact here too
    assert safe.float().mean() > 0.8
    assert torch.equal(result.topk_idx[safe], expected.topk_idx[safe])
    assert torch.equal(result.topk_idx[..., 0], expected.topk_idx[..., 0])  # the query itself, in padded cells

    leaves64 = [x.detach().double().requires_grad_() for x in leaves]
    weights64 = neighbor_weights(scores64.gather(-1, result.topk_idx), weighting)
    values64 = padded_tokens(leaves64[2], grid, blend.pad)
    out64 = aggregate_neighbors(values64, result.topk_idx, weights64, leaves64[3], leaves64[4], options["groups"])
    grad_out = torch.randn(out64.shape, generator=gen).to(DEVICE)
    (result.out * grad_out).sum().backward()
    (out64 * grad_out.double()).sum().backward()
    torch.testing.assert_close(result.out.double(), out64.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(result.topk_weights.double(), weights64, rtol=1e-5, atol=1e-6)
    for name, leaf, leaf64 in zip(("v", "weight", "bias"), leaves[2:], leaves64[2:], strict=True):
        torch.testing.assert_close(leaf.grad.double(), leaf64.grad, rtol=1e-4, atol=1e-4, msg=name)
    assert leaves[0].grad is None and leaves[1].grad is None  # indices and none/uniform weights: no q, k gradient


def test_blend_with_softmax_weighting_stays_on_the_reference():
    q = torch.randn(1, 1, 12, 4, device=DEVICE)
    weight = torch.randn(3, 4, 5, device=DEVICE)
    with pytest.raises(ValueError, match="blend selection with softmax"):
        knn_aggregate(q, q, q, weight, num_neighbors=5, weighting="softmax", self_first=True,
                      blend=BlendGrid(3, 4, 3, 0.5), backend="triton")


def test_blend_layer_gives_the_same_output_and_records_on_both_backends():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6, 7, device=DEVICE)
    layers = {backend: ConvNN2d(5, 4, num_neighbors=7, selection="blend", blend_alpha=0.4, window_size=3,
                                backend=backend).to(DEVICE) for backend in ("triton", "reference")}
    layers["reference"].load_state_dict(layers["triton"].state_dict())
    outs, records = {}, {}
    for backend, layer in layers.items():
        with record_neighbors(layer) as recorded:
            outs[backend] = layer(x)
        records[backend] = recorded[""][0]
    torch.testing.assert_close(outs["triton"], outs["reference"], rtol=1e-4, atol=1e-4)
    assert records["triton"].padding == records["reference"].padding == 1
    agree = (records["triton"].topk_idx == records["reference"].topk_idx).all(-1).float().mean()
    assert agree > 0.95  # rows may differ only at fp32 near-ties


@pytest.mark.parametrize("warm", [1, 4])
def test_a_warm_start_selects_the_blend_rules_cells_as_the_plain_stream(warm):
    """The blend rule's floors from the tiles around each query block (default 4 tiles; 1 leaves most tiles
    outside) change no selection and no output bit against the stream without them, on 16×16 tiles over a 13×11
    map (195 padded cells, 13 tiles), on one sample (batches of the blend rule: the test against the reference
    above). Integer features give exact feature scores and many ties at the floor."""
    from kernels.knn_triton import function

    gen = torch.Generator().manual_seed(warm)
    grid, K = (13, 11), 9
    N = grid[0] * grid[1]
    q, k = (torch.randint(-2, 3, (1, 1, N, 4), generator=gen).float().to(DEVICE) for _ in range(2))
    v = torch.randn(1, 1, N, 5, generator=gen).to(DEVICE)
    weight = torch.randn(6, 5, K, generator=gen).to(DEVICE)
    args = (q, k, v, weight, None, K, "cosine", "none", 1.0, 1, None, True, BlendGrid(*grid, 3, 0.5))
    tiles = dict(BLOCK_M=16, BLOCK_N=16)
    plain = function.launch_forward(*args, config=dict(tiles, LANES=False, WARM=0))
    warmed = function.launch_forward(*args, config=dict(tiles, LANES=False, WARM=warm))
    for got, expected in zip(warmed, plain, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
