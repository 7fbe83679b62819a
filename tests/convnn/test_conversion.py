"""convnn.convert: torchvision's ResNet-18/50, VGG-11 and VisionTransformer and a timm-shaped attention become their
ConvNN versions with the weights carried, so that at λ = 0 (window selection: any λ) and K = N they compute what the
originals computed (METHOD §4.1, §4.3)."""

import copy

import pytest
import torch
from torch import nn
from torchvision.models import resnet18, resnet50, vgg11
from torchvision.models.vgg import cfgs, make_layers
from torchvision.models.vision_transformer import VisionTransformer

from convnn import ConvNNAttention, HybridConvNN2d, KVTAttention, convert, create_model
from convnn.conversion import ConvNNMultiheadAttention, HybridDownsample, KVTMultiheadAttention

EXACT = {"rtol": 1e-10, "atol": 1e-10}


def converted_pair(model: nn.Module, **kwargs) -> tuple[nn.Module, nn.Module]:
    """(the original, its conversion), both fp64 in eval mode."""
    model = model.double().eval()
    return model, convert(copy.deepcopy(model), **kwargs).eval()


def randomise_batch_norms(model: nn.Module) -> None:
    """Running statistics and affine parameters away from their identity initialisation, so that a BatchNorm the
    conversion lost or reordered would show."""
    generator = torch.Generator().manual_seed(5)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            for tensor in (module.weight, module.bias, module.running_mean):
                tensor.data = torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
            module.running_var.data = torch.rand(module.running_var.shape, generator=generator) + 0.5


@pytest.mark.parametrize(("rule", "branch_ratio"), [("all", 0.0), ("window", 0.5), ("window", 1.0)])
def test_a_converted_resnet18_computes_the_original(rule, branch_ratio):
    """Every 3×3 (the strided ones at stride 2: queries on the strided grid) becomes a hybrid; at λ = 0 the conv
    branch holds the convolution and the mix is the identity; with window selection and K = 9 the ConvNN branch
    holds its first channels, so any λ computes the original."""
    torch.manual_seed(0)
    original = resnet18(num_classes=10)
    randomise_batch_norms(original)
    original, converted = converted_pair(original, rule=rule, branch_ratio=branch_ratio)
    hybrids = [m for m in converted.modules() if isinstance(m, HybridConvNN2d)]
    assert len(hybrids) == 16  # two per BasicBlock; the 7×7 stem and the 1×1 downsamples stay
    assert converted.layer2[0].conv1.conv is None or converted.layer2[0].conv1.conv.stride == (2, 2)
    branches = {id(m.conv) for m in hybrids}
    assert not any(type(m) is nn.Conv2d and m.kernel_size == (3, 3) and id(m) not in branches
                   for m in converted.modules())
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(converted(x), original(x), **EXACT)


def test_a_converted_resnet18_with_feature_selection_differs_from_the_original():
    """At λ = 0.5 with the all rule the ConvNN branch selects by features: the output changes (the equality above
    is the carrying, not an untouched model)."""
    torch.manual_seed(1)
    original, converted = converted_pair(resnet18(num_classes=10), rule="all", branch_ratio=0.5, num_neighbors=4)
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)  # layer4's second 3×3 sees 2×2 = 4 tokens
    with torch.no_grad():
        assert (converted(x) - original(x)).abs().max() > 1e-3


def test_a_converted_vgg11_feature_extractor_computes_the_original():
    """VGG-11's eight 3×3 convolutions (bias, padding 1) at λ = 0 compute the original feature extractor (torchvision's
    make_layers of configuration "A"); the whole torchvision vgg11, built on the meta device, gets its 8 hybrids and
    keeps its classifier."""
    torch.manual_seed(2)
    original, converted = converted_pair(make_layers(cfgs["A"]), branch_ratio=0.0)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(converted(x), original(x), **EXACT)
    with torch.device("meta"):
        whole = convert(vgg11(num_classes=10))
    assert sum(isinstance(m, HybridConvNN2d) for m in whole.features) == 8
    assert [type(m) for m in whole.classifier if isinstance(m, nn.Linear)] == [nn.Linear] * 3


def small_vit() -> VisionTransformer:
    """torchvision's ViT: 32 px, patches of 8 → N = 16 patches + the class token, 2 layers of 2 heads."""
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                             num_classes=10)


@pytest.mark.parametrize(("attention", "cls"), [("convnn", ConvNNMultiheadAttention), ("kvt", KVTMultiheadAttention)])
def test_a_converted_vision_transformer_with_k_equal_n_computes_the_original(attention, cls):
    """METHOD §4.3: softmax over all N = 17 tokens with the q, k, v and output projections carried is the original
    nn.MultiheadAttention; the patch embedding (16×16... here 8×8, stride 8) is no 3×3 and stays."""
    torch.manual_seed(3)
    original, converted = converted_pair(small_vit(), attention=attention, num_neighbors=17)
    layers = [m for m in converted.modules() if isinstance(m, ConvNNAttention)]
    assert len(layers) == 2 and all(type(m) is cls for m in layers)
    assert type(converted.conv_proj) is nn.Conv2d
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(converted(x), original(x), **EXACT)


def test_a_converted_vision_transformer_with_fewer_neighbours_is_top_k_attention():
    """K = 5 < N: each query's softmax over its 5 highest q·k/√d, the rest masked (METHOD §4.4), written out here
    from the original layer's projections on the first block's input."""
    torch.manual_seed(4)
    original, converted = converted_pair(small_vit(), attention="kvt", num_neighbors=5)
    attention = original.encoder.layers[0].self_attention
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    q, k, v = (x @ w.T + b for w, b in zip(attention.in_proj_weight.chunk(3), attention.in_proj_bias.chunk(3),
                                          strict=True))
    heads = [t.view(2, 17, 2, 8).transpose(1, 2) for t in (q, k, v)]  # (B, h, N, d)
    scores = heads[0] @ heads[1].transpose(-1, -2) / 8**0.5
    kept = scores >= scores.topk(5, dim=-1).values[..., -1:]
    mixed = (scores.masked_fill(~kept, float("-inf")).softmax(-1) @ heads[2]).transpose(1, 2).reshape(2, 17, 16)
    expected = mixed @ attention.out_proj.weight.T + attention.out_proj.bias
    with torch.no_grad():
        got, weights = converted.encoder.layers[0].self_attention(x, x, x, need_weights=False)
    assert weights is None
    torch.testing.assert_close(got, expected, **EXACT)


class TimmAttention(nn.Module):
    """timm's Attention, written out: a fused qkv linear, num_heads, identity q/k norms, scaled dot product."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        attention = (q @ k.transpose(-2, -1) * self.head_dim**-0.5).softmax(-1)
        return self.proj((attention @ v).transpose(1, 2).reshape(B, N, C))


@pytest.mark.parametrize(("attention", "cls"), [("convnn", ConvNNAttention), ("kvt", KVTAttention)])
def test_a_timm_shaped_attention_with_k_equal_n_computes_the_original(attention, cls):
    torch.manual_seed(6)
    original, converted = converted_pair(nn.Sequential(nn.LayerNorm(24), TimmAttention(24, 3)), attention=attention,
                                         num_neighbors=10)
    assert type(converted[1]) is cls
    x = torch.randn(2, 10, 24, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(converted(x), original(x), **EXACT)


def test_convnn_resnet50_is_the_conversion_in_the_papers_stride_form():
    """The preset: torchvision's ResNet-50, its strided 3×3s a stride-1 hybrid then 2×2 average pooling."""
    with torch.device("meta"):
        preset = create_model("convnn_resnet50", num_classes=10)
        converted = convert(resnet50(num_classes=10), num_neighbors=16, stride_form="pool", carry_weights=False)
    assert preset.state_dict().keys() == converted.state_dict().keys()
    strided = [name for name, m in preset.named_modules() if isinstance(m, HybridDownsample)]
    assert strided == ["layer2.0.conv2", "layer3.0.conv2", "layer4.0.conv2"]
    assert preset.layer2[0].conv2[0].conv.stride == (1, 1) and preset.layer2[0].conv2[1].kernel_size == 2


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    (dict(attention="mhsa"), ValueError, "attention must be one of"),
    (dict(stride_form="max"), ValueError, "stride_form must be one of"),
    (dict(stride=2), TypeError, "convert takes no option 'stride'"),
    (dict(seed=3), TypeError, "convert takes no option 'seed'"),
    (dict(num_neighbours=9), TypeError, "convert takes no option 'num_neighbours'"),
    (dict(branch_ratio=5), ValueError, "branch_ratio must be a number in"),
    (dict(branch_ratio=True), ValueError, "branch_ratio must be a number in"),
    (dict(num_neighbors=0), ValueError, "num_neighbors must be an integer"),
    (dict(rule="bogus"), ValueError, "rule must be one of"),
])
@pytest.mark.parametrize("model", ["conv", "nothing to convert"])
def test_bad_conversion_arguments_raise(kwargs, error, message, model):
    """Whatever the model holds: a model with no layer to convert is no reason to accept a wrong argument."""
    with pytest.raises(error, match=message):
        convert(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1) if model == "conv" else nn.Linear(2, 2)), **kwargs)


@pytest.mark.parametrize("nesting", ["siblings", "in two blocks"])
def test_a_layer_shared_by_two_places_is_refused(nesting):
    """Two replacements of one shared convolution would no longer share weights: refused, naming both places."""
    conv = nn.Conv2d(4, 4, 3, padding=1)
    model = (nn.Sequential(conv, nn.ReLU(), conv) if nesting == "siblings"
             else nn.Sequential(nn.Sequential(conv), nn.Sequential(conv)))
    with pytest.raises(ValueError, match="is the same module as"):
        convert(model)
    assert model[0] is conv or model[0][0] is conv  # nothing was replaced


def test_a_convolution_converts_to_its_hybrid_and_keeps_computing_the_same():
    """A model that is itself one 3×3 convolution comes back as its replacement; at λ = 0 it computes the
    convolution."""
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, padding=1).double()
    x = torch.randn(2, 4, 7, 7, dtype=torch.float64)
    expected = conv(x)
    hybrid = convert(conv, branch_ratio=0.0)
    assert isinstance(hybrid, HybridConvNN2d)
    torch.testing.assert_close(hybrid(x), expected, rtol=0, atol=1e-12)


def test_a_sequence_first_multihead_attention_is_refused():
    with pytest.raises(ValueError, match="batch_first=True"):
        convert(nn.Sequential(nn.MultiheadAttention(8, 2)))
