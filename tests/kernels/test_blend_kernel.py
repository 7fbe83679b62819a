"""The blend rule in the fused kernel equals the reference (METHOD §3) on every row (``every_row.check_every_row``:
fp64 feature scores against the zero-padded map, min–max normalised, mixed with the spatial profile, the query
first): the selected padded cells, the weights, the output and the gradients of v, weight and bias (none for q, k);
and a blend ConvNN2d gives the same output and records on both backends.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from convnn import ConvNN2d, record_neighbors
from kernels import knn_aggregate
from kernels.checks import FUSED_MAX_BLEND_CELLS
from kernels.knn_triton import forward, function
from kernels.reference import BlendGrid
from tests.kernels.every_row import DEVICE, check_every_row


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
    check_every_row(result, *leaves, **options)


def test_blend_with_softmax_weighting_stays_on_the_reference():
    q = torch.randn(1, 1, 12, 4, device=DEVICE)
    weight = torch.randn(3, 4, 5, device=DEVICE)
    with pytest.raises(ValueError, match="blend selection with softmax"):
        knn_aggregate(q, q, q, weight, num_neighbors=5, weighting="softmax", self_first=True,
                      blend=BlendGrid(3, 4, 3, 0.5), backend="triton")


def test_blend_layer_gives_the_same_output_and_records_on_both_backends(monkeypatch):
    """The triton layer's kernel call is the reference's on every row, and it records what the kernel returned."""
    calls = []
    entry = function.aggregate_prechecked

    def spy(*args, originals=None, **options):
        calls.append((entry(*args, originals=originals, **options), args, options))
        return calls[-1][0]

    monkeypatch.setattr(function, "aggregate_prechecked", spy)
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
    (result, args, options), = calls
    check_every_row(result, *args, **options)
    torch.testing.assert_close(outs["triton"], outs["reference"], rtol=1e-4, atol=1e-4)
    assert records["triton"].padding == records["reference"].padding == 1
    assert torch.equal(records["triton"].topk_idx, result.topk_idx)


@pytest.mark.parametrize("warm", [1, 4])
def test_a_warm_start_selects_the_reference_blend_cells(warm):
    """With the blend rule's floors from the tiles around each query block (default 4 tiles; 1 leaves most tiles
    outside) the kernel selects exactly the reference's cells on every row, on 16×16 tiles over a 9×7 map (a 5×5
    window: 143 padded cells, 9 tiles; 63 queries, 4 blocks), on one sample (batches of the blend rule: the test
    above). Integer features with dot similarity give exact feature scores and many exact ties at the floor; the
    5×5 window's spatial profile keeps the far cells' spatial terms above fp32 rounding (a 3×3 window's are below
    it from 6 cells on, so fp32 ties what fp64 orders by distance: 2–8 % of the rows of a 13×11 map)."""
    gen = torch.Generator().manual_seed(warm)
    grid, K = (9, 7), 9
    N = grid[0] * grid[1]
    q, k = (torch.randint(-2, 3, (1, 1, N, 4), generator=gen).float().to(DEVICE) for _ in range(2))
    v = torch.randn(1, 1, N, 5, generator=gen).to(DEVICE)
    weight = torch.randn(6, 5, K, generator=gen).to(DEVICE)
    options = dict(num_neighbors=K, similarity="dot", weighting="none", temperature=1.0, groups=1,
                   candidates=None, self_first=True, blend=BlendGrid(*grid, 5, 0.5))
    warmed = function.launch_forward(q, k, v, weight, None, *options.values(),
                                     config=dict(BLOCK_M=16, BLOCK_N=16, LANES=False, WARM=warm))
    check_every_row(warmed, q, k, v, weight, **options, max_tie_share=0)


@triton.jit
def _positions(Cols, Rows, Out, n, width, pad, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.load(Cols + offs, mask=offs < n, other=0)
    row, col = forward.padded_position(cols, width, pad)
    tl.store(Rows + offs, row, mask=offs < n)
    tl.store(Out + offs, col, mask=offs < n)


@pytest.mark.parametrize("width, pad", [(1, 0), (2, 0), (5, 1), (32, 1), (33, 2), (251, 2), (1443, 2), (2047, 0)])
def test_padded_positions_are_the_integer_quotient_and_remainder_below_the_bound(width, pad):
    """forward.padded_position finds a padded cell's row in fp32; it equals torch's integer division for the cells
    below FUSED_MAX_BLEND_CELLS where fp32 is closest to misplacing one — the last cell of a row and the next row's
    first, whose quotients' error grows with the cell: every row's in the top 65,536 cells — and for the first
    4,096 cells and a sample of the others, for padded rows 1 to 2,047 cells wide."""
    padded = width + 2 * pad
    ends = torch.arange(padded - 1, FUSED_MAX_BLEND_CELLS, padded)  # the last cell of each row, then the next row's
    ends = ends[ends >= FUSED_MAX_BLEND_CELLS - 2**16]
    cols = torch.cat([ends, (ends + 1)[ends + 1 < FUSED_MAX_BLEND_CELLS], torch.arange(0, 4096),
                      torch.arange(FUSED_MAX_BLEND_CELLS - 4096, FUSED_MAX_BLEND_CELLS),
                      torch.randint(0, FUSED_MAX_BLEND_CELLS, (20000,), generator=torch.Generator().manual_seed(0))])
    cols = cols.to(torch.int32).to(DEVICE)
    rows, rest = torch.empty_like(cols), torch.empty_like(cols)
    _positions[(triton.cdiv(cols.numel(), 4096),)](cols, rows, rest, cols.numel(), width, pad, BLOCK=4096)
    expected = cols.long()
    assert torch.equal(rows.long(), torch.div(expected, padded, rounding_mode="floor"))
    assert torch.equal(rest.long(), expected % padded)


def test_a_blend_map_at_the_bound_stays_on_the_reference():
    """A padded map of FUSED_MAX_BLEND_CELLS cells or more is refused by the kernel with a message (the dispatch
    then runs the reference), instead of finding rows that fp32 can no longer tell apart."""
    side = int(FUSED_MAX_BLEND_CELLS ** 0.5) - 1  # (side + 2)² ≥ the bound for a 3×3 window
    q = torch.randn(1, 1, side * side, 1, device=DEVICE)
    weight = torch.randn(2, 1, 3, device=DEVICE)
    with pytest.raises(ValueError, match="padded map must have fewer than"):
        knn_aggregate(q, q, q, weight, num_neighbors=3, self_first=True, blend=BlendGrid(side, side, 3, 0.5),
                      backend="triton")
