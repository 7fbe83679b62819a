"""Property tests over shapes and options (issue: output shape, determinism, valid candidates)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from convnn import ConvNN2d, record_neighbors


@st.composite
def layer_and_input(draw):
    height, width = draw(st.sampled_from([(1, 9), (9, 1), (3, 5), (6, 6), (4, 7)]))
    num_tokens = height * width
    selection = draw(st.sampled_from(["all", "random", "window", "blend"]))
    window_size = draw(st.sampled_from([1, 3, 5]))
    if selection == "window":
        num_neighbors = draw(st.integers(1, window_size**2))
    else:
        num_neighbors = draw(st.integers(1, min(num_tokens, 9)))
    num_candidates = draw(st.integers(num_neighbors, num_tokens + 3)) if selection == "random" else None
    layer = ConvNN2d(draw(st.integers(1, 4)), draw(st.integers(1, 5)), num_neighbors=num_neighbors,
                     selection=selection, num_candidates=num_candidates, window_size=window_size,
                     weighting=draw(st.sampled_from(["none", "softmax", "uniform"])),
                     candidate_sampling=draw(st.sampled_from(["batch", "sample"])), seed=draw(st.integers(0, 9)))
    batch = draw(st.integers(1, 3))
    return layer.eval(), torch.randn(batch, layer.in_channels, height, width)


@settings(max_examples=60, deadline=None)
@given(layer_and_input())
def test_shape_determinism_and_valid_indices(case):
    layer, x = case
    B, _, H, W = x.shape
    with record_neighbors(layer) as records:
        first, second = layer(x), layer(x)
    assert first.shape == (B, layer.out_channels, H, W)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    record = records[""][0]
    assert record.topk_idx.shape == (B, 1, H * W, layer.num_neighbors)
    cells = record.cells()  # (B, 1, N, K, 2)
    query = torch.stack(torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij"), -1).view(1, 1, -1, 1, 2)
    if layer.selection in ("all", "random"):
        assert ((cells >= 0) & (cells < torch.tensor([H, W]))).all()
        assert torch.equal(cells[..., 0, :], query[..., 0, :].expand(B, 1, H * W, 2))
    if layer.selection == "window":
        assert ((cells - query).abs() <= layer.window_size // 2).all()
    if layer.selection == "random" and record.candidates is not None:
        idx = record.topk_idx[:, 0]
        cand = record.candidates.expand(B, -1)
        own = idx == torch.arange(H * W).view(1, -1, 1)
        assert (own | (idx[..., None] == cand[:, None, None, :]).any(-1)).all()
    for row in record.topk_idx.flatten(0, 2):
        assert len(set(row.tolist())) == len(row)
