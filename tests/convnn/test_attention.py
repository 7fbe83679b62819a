"""ConvNN-attention and its baselines: the attention special cases of METHOD §4.3–4.6."""

import math

import pytest
import torch

from convnn import ConvNNAttention, KVTAttention, MultiheadSelfAttention
from convnn.functional import block_sparse_mask, causal_mask
from tests.tolerances import FP32_EXACT


def _mhsa_by_hand(layer: MultiheadSelfAttention, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head self-attention written out (METHOD §4.3, §4.6): fused q, k, v projection, each head's slice of
    d = dim / h channels, softmax(q kᵀ / √d) with forbidden pairs at −∞, heads concatenated, output projection."""
    dim = x.shape[-1]
    h = layer.num_heads
    d = dim // h
    qkv = x @ layer.qkv.weight.T + layer.qkv.bias  # (B, N, 3·dim): [q | k | v], each head-major
    heads = []
    for head in range(h):
        q, k, v = (qkv[..., part * dim + head * d: part * dim + (head + 1) * d] for part in range(3))  # (B, N, d)
        scores = q @ k.transpose(1, 2) / math.sqrt(d)  # (B, N, N)
        if mask is not None:
            scores = scores.masked_fill(~mask, -math.inf)
        heads.append(torch.softmax(scores, dim=-1) @ v)
    return torch.cat(heads, dim=-1) @ layer.proj.weight.T + layer.proj.bias


def _pair(cls, dim=16, num_heads=4, **options):
    """An MHSA and a k-NN layer sharing the same q, k, v and output projections."""
    torch.manual_seed(0)
    mhsa = MultiheadSelfAttention(dim, num_heads)
    knn = cls(dim, num_heads, **options)
    knn.load_state_dict(mhsa.state_dict(), strict=False)
    return mhsa, knn


@pytest.mark.parametrize("num_heads", [1, 4])
def test_convnn_attention_with_k_equal_n_is_scaled_dot_product_attention(num_heads):
    """METHOD §4.3 and §4.6: learned projections, scaled dot product, K = N, softmax, sum over slots ⇒ SDPA."""
    x = torch.randn(2, 13, 16)
    mhsa, knn = _pair(ConvNNAttention, num_heads=num_heads, num_neighbors=13)
    torch.testing.assert_close(knn(x), _mhsa_by_hand(mhsa, x), **FP32_EXACT)


def test_kvt_is_softmax_over_the_top_k_scores_then_values():
    """METHOD §4.4: K < N ⇒ softmax over the top-K scores with the rest masked to −∞, then @ V."""
    x = torch.randn(2, 20, 16)
    mhsa, kvt = _pair(KVTAttention, num_neighbors=5)
    q, k, v = mhsa.project_qkv(x)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    kth = scores.topk(5, dim=-1).values[..., -1:]
    expected = torch.softmax(scores.masked_fill(scores < kth, -math.inf), -1) @ v
    torch.testing.assert_close(kvt(x), mhsa.proj(expected.transpose(1, 2).flatten(2)), **FP32_EXACT)


def test_convnn_attention_starts_equal_to_kvt_and_only_its_kernel_is_learnable():
    x = torch.randn(2, 20, 16)
    _, kvt = _pair(KVTAttention, num_neighbors=5)
    _, convnn = _pair(ConvNNAttention, num_neighbors=5)
    torch.testing.assert_close(convnn(x), kvt(x), rtol=0, atol=0)
    assert "weight" in dict(convnn.named_parameters()) and "weight" not in dict(kvt.named_parameters())


@pytest.mark.parametrize("mask_name", ["causal", "block"])
def test_masked_convnn_attention_equals_sdpa_with_the_same_mask(mask_name):
    """METHOD §4.5: causal and BigBird-style block masks on S ⇒ SDPA with the same boolean mask."""
    N = 24
    mask = causal_mask(N) if mask_name == "causal" else block_sparse_mask(
        N, block_size=4, generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, N, 16)
    mhsa, knn = _pair(ConvNNAttention, num_neighbors=N)
    torch.testing.assert_close(knn(x, attn_mask=mask), _mhsa_by_hand(mhsa, x, mask), **FP32_EXACT)


@pytest.mark.parametrize("masked", [False, True])
def test_mhsa_is_multi_head_attention_written_out(masked):
    torch.manual_seed(1)
    x = torch.randn(2, 10, 16)
    mhsa = MultiheadSelfAttention(16, 2)
    mask = causal_mask(10) if masked else None
    torch.testing.assert_close(mhsa(x, attn_mask=mask), _mhsa_by_hand(mhsa, x, mask), **FP32_EXACT)


def test_block_sparse_mask_has_local_global_and_random_blocks():
    mask = block_sparse_mask(16, block_size=4, num_global_blocks=1, num_random_blocks=0, window_blocks=0)
    blocks = mask[::4, ::4]
    expected = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(blocks, expected)
    with_random = block_sparse_mask(16, 4, 0, 1, 0, generator=torch.Generator().manual_seed(1))[::4, ::4]
    assert (with_random.sum(1) >= 1).all() and (with_random.sum(1) <= 2).all()


def test_random_candidate_attention_uses_only_the_query_and_its_candidates():
    from convnn import record_neighbors

    layer = ConvNNAttention(16, 2, num_neighbors=4, selection="random", num_candidates=8)
    with record_neighbors(layer) as records:
        layer(torch.randn(3, 30, 16))
    record = records[""][0]
    idx, cand = record.topk_idx, record.candidates  # (B, h, N, K), (1, r)
    query = torch.arange(30).view(1, 1, 30, 1)
    allowed = (idx == query) | (idx[..., None] == cand.view(1, 1, 1, 1, -1)).any(-1)
    assert allowed.all()


@pytest.mark.parametrize("kwargs, message", [
    ({"num_heads": 3}, "num_heads"),
    ({"selection": "random", "num_candidates": 2}, "num_candidates"),
    ({"selection": "window"}, "selection"),
    ({"weighting": "max"}, "weighting"),
])
def test_attention_configuration_errors(kwargs, message):
    options = {"num_heads": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        ConvNNAttention(16, **options)


def test_more_neighbors_than_tokens_raises():
    with pytest.raises(ValueError, match="num_neighbors"):
        ConvNNAttention(16, 4, num_neighbors=20)(torch.randn(1, 10, 16))


@pytest.mark.parametrize("cls", [MultiheadSelfAttention, ConvNNAttention])
@pytest.mark.parametrize("shape, mask_shape, message", [
    ((10, 16), None, "dim=16"),
    ((1, 10, 8), None, "dim=16"),
    ((1, 10, 16), (3, 3), "attn_mask"),
])
def test_attention_inputs_and_masks_of_the_wrong_shape_raise(cls, shape, mask_shape, message):
    layer = cls(16, 4) if cls is MultiheadSelfAttention else cls(16, 4, num_neighbors=4)
    mask = None if mask_shape is None else torch.ones(mask_shape, dtype=torch.bool)
    with pytest.raises(ValueError, match=message):
        layer(torch.randn(shape), attn_mask=mask)
