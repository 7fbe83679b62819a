"""The hybrid branch layer (METHOD §5)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from convnn import HybridConvNN2d
from tests.tolerances import FP32_EXACT


@pytest.mark.parametrize("ratio, knn_channels", [(0.0, 0), (0.25, 2), (0.5, 4), (0.75, 6), (1.0, 8)])
def test_channel_split_is_round_lambda_times_c_out(ratio, knn_channels):
    layer = HybridConvNN2d(4, 8, branch_ratio=ratio)
    assert layer.knn_channels == knn_channels and layer.conv_channels == 8 - knn_channels
    assert (layer.knn is None) == (knn_channels == 0) and (layer.conv is None) == (knn_channels == 8)
    assert layer(torch.randn(2, 4, 5, 5)).shape == (2, 8, 5, 5)


def test_lambda_zero_is_conv_then_one_by_one_mix():
    """METHOD §5: λ = 0 is the matched baseline, a 3×3 convolution (padding 1) followed by the 1×1 mix."""
    torch.manual_seed(0)
    layer = HybridConvNN2d(3, 6, branch_ratio=0.0)
    x = torch.randn(2, 3, 7, 7)
    conv_w, conv_b = layer.conv.weight, layer.conv.bias  # (6, 3, 3, 3), (6,)
    mix_w, mix_b = layer.mix.weight[:, :, 0, 0], layer.mix.bias  # (6, 6), (6,)
    expected = torch.einsum("oc,bchw->bohw", mix_w, F.conv2d(x, conv_w, conv_b, padding=1)) + mix_b.view(1, 6, 1, 1)
    torch.testing.assert_close(layer(x), expected, **FP32_EXACT)
    assert sum(p.numel() for p in layer.parameters()) == 6 * 3 * 9 + 6 + 6 * 6 + 6  # no ConvNN branch


def test_branches_put_convnn_channels_first():
    """The ConvNN branch (here window selection with a conv's weights, METHOD §4.1) fills channels [0, C_knn),
    the convolution [C_knn, C_out), then the 1×1 mix: each checked against F.conv2d."""
    torch.manual_seed(1)
    layer = HybridConvNN2d(3, 6, branch_ratio=0.5, num_neighbors=9, selection="window")
    knn_conv = nn.Conv2d(3, 3, 3, padding=1)
    layer.knn.load_conv2d_weight(knn_conv)
    x = torch.randn(1, 3, 5, 5)
    knn_part = F.conv2d(x, knn_conv.weight, knn_conv.bias, padding=1)
    conv_part = F.conv2d(x, layer.conv.weight, layer.conv.bias, padding=1)
    torch.testing.assert_close(layer.branches(x), torch.cat([knn_part, conv_part], dim=1), **FP32_EXACT)
    expected = F.conv2d(torch.cat([knn_part, conv_part], dim=1), layer.mix.weight, layer.mix.bias)
    torch.testing.assert_close(layer(x), expected, **FP32_EXACT)


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_lambda_outside_unit_interval_raises(ratio):
    with pytest.raises(ValueError, match="branch_ratio"):
        HybridConvNN2d(4, 8, branch_ratio=ratio)


def test_unknown_convnn_option_raises_even_without_a_convnn_branch():
    with pytest.raises(TypeError):
        HybridConvNN2d(4, 8, branch_ratio=0.0, num_neighbours=9)


def test_invalid_convnn_options_raise_even_without_a_convnn_branch():
    with pytest.raises(ValueError, match="selection"):
        HybridConvNN2d(4, 8, branch_ratio=0.0, selection="bogus")
    with pytest.raises(ValueError, match="out_channels"):
        HybridConvNN2d(4, 0)


@pytest.mark.parametrize(("ratio", "selection", "expected"), [(0.0, "all", set()), (0.5, "all", {"reference"}),
                                                               (0.5, "blend", {"reference"}),
                                                               (0.5, "window", {"reference"})])
def test_a_forward_records_the_aggregation_path_it_took(ratio, selection, expected):
    """λ = 0 runs no ConvNN aggregation; on CPU every selection aggregates in PyTorch (window also on CUDA)."""
    from kernels import record_backends

    layer = HybridConvNN2d(4, 4, branch_ratio=ratio, num_neighbors=9, selection=selection)
    with record_backends() as used:
        layer(torch.randn(1, 4, 6, 6))
    assert used == expected
