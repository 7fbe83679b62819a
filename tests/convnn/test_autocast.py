"""Autocast: inside ``torch.autocast`` every ConvNN layer computes in the autocast dtype with fp32 scores and sums,
as ``nn.Conv2d`` and SDPA do (kernels.autocast); outside it fp32 stays fp32. CPU autocast here; the fused kernel
under autocast is tested in tests/kernels/test_layers_autocast.py."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from convnn import ConvNN2d, HybridConvNN2d
from convnn.layers.attention import ConvNNAttention, KVTAttention
from kernels import knn_aggregate

BF16 = {"rtol": 2e-2, "atol": 2e-2}  # a few bf16 roundings (2**-8 relative each) of O(1) values


def bf16_exact(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest bf16 value, kept in fp32: the cast autocast makes is then exact."""
    return x.to(torch.bfloat16).float()


def round_parameters(module: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(bf16_exact(p))
    return module


def autocast_and_fp64(layer: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, nn.Module]:
    """The layer's output inside CPU bf16 autocast, and a copy's output in fp64 on the same (bf16-exact) numbers."""
    exact = copy.deepcopy(layer).double()
    with torch.autocast("cpu", torch.bfloat16):
        out = layer(x)
    return out, exact(x.double()), exact


@pytest.mark.parametrize("selection", ["all", "random", "blend"])
@pytest.mark.parametrize("weighting", ["none", "softmax"])
def test_convnn2d_under_autocast_computes_in_bf16_with_the_fp64_selection(selection, weighting):
    torch.manual_seed(0)
    x = bf16_exact(torch.randn(2, 4, 6, 6))
    layer = round_parameters(ConvNN2d(4, 5, num_neighbors=5, selection=selection, weighting=weighting,
                                      num_candidates=12 if selection == "random" else None, blend_alpha=0.5))
    layer.train(selection == "random")  # training draws: the copy's stream repeats the same candidates
    out, expected, _ = autocast_and_fp64(layer, x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, **BF16)
    out.float().sum().backward()  # gradients come back in the parameters' own dtype
    assert layer.weight.grad.dtype == torch.float32 and layer.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("window_size", [3, 5])
def test_window_convnn2d_under_autocast_is_conv2d_on_bf16_operands(window_size):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 7, 8)
    conv = nn.Conv2d(3, 4, window_size, padding=window_size // 2)
    knn = ConvNN2d(3, 4, num_neighbors=window_size**2, selection="window", window_size=window_size)
    knn.load_conv2d_weight(conv)
    with torch.autocast("cpu", torch.bfloat16):
        out = knn(x)
    expected = F.conv2d(bf16_exact(x).double(), bf16_exact(conv.weight).double(), bf16_exact(conv.bias).double(),
                        padding=window_size // 2)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, **BF16)


def test_hybrid_under_autocast_is_bf16_and_matches_fp64():
    torch.manual_seed(2)
    x = bf16_exact(torch.randn(2, 4, 6, 6))
    layer = round_parameters(HybridConvNN2d(4, 6, branch_ratio=0.5, num_neighbors=5)).eval()
    out, expected, _ = autocast_and_fp64(layer, x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, rtol=4e-2, atol=4e-2)  # two layers, each rounded to bf16


@pytest.mark.parametrize("cls", [ConvNNAttention, KVTAttention])
def test_attention_under_autocast_is_bf16_and_matches_fp64(cls):
    """Small-integer tokens and ±1 projections: q, k, v are exact in bf16, so both runs select the same sets."""
    torch.manual_seed(3)
    layer = cls(8, num_heads=2, num_neighbors=4, weighting="softmax").eval()
    with torch.no_grad():
        layer.qkv.weight.copy_(torch.randint(-1, 2, layer.qkv.weight.shape).float())
        layer.qkv.bias.zero_()
        round_parameters(layer)
    x = torch.randint(-2, 3, (2, 10, 8)).float()
    out, expected, _ = autocast_and_fp64(layer, x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, **BF16)


def test_knn_aggregate_casts_every_operand_and_keeps_fp32_weights():
    """q, k in bf16 (a projection under autocast) and v, weight in fp32 (the input, a parameter) all go in as bf16;
    outside autocast the same call in fp32 returns fp32."""
    torch.manual_seed(4)
    q = k = torch.randn(1, 1, 20, 8)
    v, weight = torch.randn(1, 1, 20, 6), torch.randn(5, 6, 3)
    with torch.autocast("cpu", torch.bfloat16):
        result = knn_aggregate(q.bfloat16(), k.bfloat16(), v, weight, num_neighbors=3, weighting="softmax")
    assert result.out.dtype == torch.bfloat16 and result.topk_weights.dtype == torch.float32
    plain = knn_aggregate(bf16_exact(q), bf16_exact(k), bf16_exact(v), bf16_exact(weight), num_neighbors=3,
                          weighting="softmax")
    assert plain.out.dtype == torch.float32
    assert torch.equal(result.topk_idx, plain.topk_idx)
    torch.testing.assert_close(result.out.float(), plain.out, **BF16)
