"""Ordinary models in the ConvNN views (convnn.adapters, convnn.models.plain): a convolution's window is what
``F.conv2d`` sums over, attention's neighbours are the largest weights ``nn.MultiheadAttention`` itself returns, and
a card may name only the allow-listed torchvision constructors, with checked arguments."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from convnn import ModelCard, create_model
from convnn.adapters import as_self_attention, conv_window, describe_plain, layer_input, prefix_tokens
from convnn.budget import check_model
from convnn.card import CheckpointError
from convnn.data import CIFAR10_CLASSES
from convnn.introspect import convnn_layers

GEOMETRIES = [  # (H, W, kernel, stride, dilation, padding)
    (8, 8, 3, 1, 1, 1),
    (9, 7, 3, 2, 1, 1),
    (10, 10, 7, 2, 1, 3),  # a ResNet stem
    (12, 12, 4, 4, 1, 0),  # a ViT patch embedding
    (9, 9, 3, 1, 2, 2),
    (11, 6, 3, 3, 2, 0),
    (1, 1, 3, 1, 1, 1),
]


@pytest.mark.parametrize("height, width, kernel, stride, dilation, padding", GEOMETRIES)
def test_a_convolutions_window_is_what_conv2d_sums_at_the_output_covering_each_cell(height, width, kernel, stride,
                                                                                     dilation, padding):
    """out[o] = Σ_t W[:, :, t] · x[cell_t] over the window's k² cells (zero outside the map), for the output o that
    covers each query cell: the cells are exactly the inputs the convolution reads."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, height, width, dtype=torch.float64)
    weight = torch.randn(5, 3, kernel, kernel, dtype=torch.float64)
    out = F.conv2d(x, weight, stride=stride, padding=padding, dilation=dilation)[0]  # (5, H_out, W_out)
    cells = conv_window(height, width, kernel, stride, dilation, padding)
    assert cells.shape == (height * width, kernel * kernel, 2)
    taps = weight.flatten(2)  # (5, 3, k²), raster order of the kernel
    for query in range(height * width):
        row, col = divmod(query, width)
        o_row, o_col = min(row // stride, out.shape[1] - 1), min(col // stride, out.shape[2] - 1)
        total = torch.zeros(5, dtype=torch.float64)
        for t, (r, c) in enumerate(cells[query].tolist()):
            assert -padding <= r < height + padding and -padding <= c < width + padding
            if 0 <= r < height and 0 <= c < width:
                total += taps[:, :, t] @ x[0, :, r, c]
        torch.testing.assert_close(total, out[:, o_row, o_col])


def test_a_kernel_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="has no output on a 2×2 map"):
        conv_window(2, 2, 5)


@pytest.mark.parametrize("conv, expected", [
    (nn.Conv2d(3, 4, 3, padding=1), dict(window_size=3, stride=1, dilation=1, padding=1)),
    (nn.Conv2d(3, 4, 7, stride=2, padding=3, bias=False), dict(window_size=7, stride=2, padding=3)),
    (nn.Conv2d(3, 4, 5, padding="same", dilation=2), dict(window_size=5, dilation=2, padding=4)),
    (nn.Conv2d(3, 4, 4, stride=4, padding="valid"), dict(window_size=4, stride=4, padding=0)),
    (nn.Conv2d(4, 4, 3, padding=1, groups=4), dict(window_size=3, padding=1)),  # depthwise: the same window
    (nn.Conv2d(3, 4, 1), None),  # selects only the query
    (nn.Conv2d(3, 4, (3, 1), padding=(1, 0)), None),  # not square
    (nn.Conv2d(3, 4, 3, stride=(1, 2), padding=1), None),
    (nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), None),
    (nn.Linear(3, 4), None),
])
def test_a_plain_convolution_describes_its_window(conv, expected):
    facts = describe_plain(conv)
    if expected is None:
        assert facts is None
    else:
        assert facts["kind"] == facts["mixer"] == facts["selection"] == "conv"
        assert {key: facts[key] for key in expected} == expected


class TimmStyleAttention(nn.Module):
    """timm's (and vit-pytorch's) attention as they write it: fused qkv, F.scaled_dot_product_attention, proj."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.q_norm = self.k_norm = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C))


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_is_read_as_its_own_weights(batch_first):
    """The equivalent MHSA gives nn.MultiheadAttention's output, and its q·k ranks keys as the attention weights
    nn.MultiheadAttention returns (per head): the K largest weights of a row are the K keys of largest q·k."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=batch_first).eval()
    tokens = torch.randn(2, 10, 16)
    x = tokens if batch_first else tokens.transpose(0, 1)
    expected, weights = mha(x, x, x, need_weights=True, average_attn_weights=False)  # weights (B, h, N, N)
    assert describe_plain(mha)["num_heads"] == 4
    assert torch.equal(layer_input(mha, (x, x, x), {}), tokens)
    mhsa = as_self_attention(mha)
    torch.testing.assert_close(mhsa(tokens), expected if batch_first else expected.transpose(0, 1))
    q, k, _ = mhsa.project_qkv(tokens)
    top_by_score = (q @ k.transpose(-1, -2)).topk(4, dim=-1).indices
    assert torch.equal(top_by_score, weights.topk(4, dim=-1).indices)


def test_timm_style_attention_is_read_as_its_own_weights():
    torch.manual_seed(1)
    attention = TimmStyleAttention(16, 2).eval()
    tokens = torch.randn(1, 7, 16)
    assert describe_plain(attention)["num_heads"] == 2
    torch.testing.assert_close(as_self_attention(attention)(tokens), attention(tokens))
    attention.q_norm = nn.LayerNorm(8)  # q/k normalisation changes the scores: not read
    assert describe_plain(attention) is None
    with pytest.raises(ValueError, match="not an attention layer"):
        as_self_attention(attention)


def test_prefix_tokens_follow_the_class_token_names():
    assert prefix_tokens(create_model("torchvision.models.VisionTransformer", image_size=32, patch_size=8,
                                      num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=8)) == 1
    assert prefix_tokens(nn.Sequential()) == 0
    timm_like = nn.Module()
    timm_like.num_prefix_tokens = 5  # e.g. CLS + 4 register tokens
    assert prefix_tokens(timm_like) == 5


def test_a_resnet18_opens_through_its_windowed_convolutions():
    """At 32 px every 3×3 and 7×7 convolution is a layer, with its input grid; the 1×1 downsampling convolutions
    are not. At 224 px the stem's 224×224 input (50,176 tokens) is over the views' budget and is left out."""
    model = create_model("torchvision.models.resnet18", num_classes=10).eval()
    layers = convnn_layers(model, 32)
    convs = [name for name, m in model.named_modules() if isinstance(m, nn.Conv2d) and m.kernel_size[0] > 1]
    assert [layer.name for layer in layers] == convs and len(convs) == 17
    stem, first, strided = layers[0], layers[1], layers[5]
    assert (stem.height, stem.window_size, stem.stride, stem.padding) == (32, 7, 2, 3)
    assert (first.name, first.height, first.stride) == ("layer1.0.conv1", 8, 1)
    assert (strided.name, strided.height, strided.stride) == ("layer2.0.conv1", 8, 2)
    assert all(layer.conv_only and layer.record_name is None for layer in layers)
    assert convnn_layers(model, 224)[0].name == "layer1.0.conv1"


def test_a_torchvision_vit_opens_through_its_attention_and_patch_embedding():
    model = create_model("torchvision.models.VisionTransformer", image_size=32, patch_size=4, num_layers=2,
                         num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10).eval()
    layers = convnn_layers(model, 32)
    assert [layer.name for layer in layers] == ["conv_proj", "encoder.layers.encoder_layer_0.self_attention",
                                                "encoder.layers.encoder_layer_1.self_attention"]
    attention = layers[1]
    assert (attention.height, attention.width, attention.num_prefix_tokens, attention.num_heads) == (8, 8, 1, 4)
    assert attention.dense and attention.is_attention


def _card(model: str, **model_args) -> ModelCard:
    return ModelCard(name="mine", model=model, model_args=model_args, classes=list(CIFAR10_CLASSES), input_size=32,
                     mean=[0.5] * 3, std=[0.25] * 3)


@pytest.mark.parametrize("model, args, message", [
    ("os.system", {}, "unknown model 'os.system'"),
    ("torchvision.models.resnet50", {}, "unknown model"),  # not on the allow-list
    ("torchvision.models.resnet18", dict(num_classes=10, weights="IMAGENET1K_V1"),
     "takes no argument 'weights'; it takes \\['num_classes'\\]"),
    ("torchvision.models.resnet18", dict(num_classes=10.5), "num_classes must be an integer"),
    ("torchvision.models.VisionTransformer", dict(image_size=32, patch_size=5, num_classes=10), "multiple of patch"),
    ("torchvision.models.VisionTransformer", dict(image_size=64, patch_size=8, num_classes=10), "equal the card"),
    ("torchvision.models.VisionTransformer", dict(image_size=32, patch_size=4, hidden_dim=30, num_heads=4,
                                                  num_classes=10), "hidden_dim must be a multiple of num_heads"),
    ("torchvision.models.VisionTransformer", dict(image_size=32, patch_size=4, num_classes=10,
                                                  norm_layer="torch.nn.Identity"), "takes no argument 'norm_layer'"),
    ("torchvision.models.VisionTransformer", dict(image_size=32, patch_size=4, num_classes=10, hidden_dim=8192,
                                                  mlp_dim=8192, num_heads=8), "more than the 100,000,000"),
    ("torchvision.models.resnet18", dict(num_classes=7), "outputs \\(1, 7\\)"),
    # the seven unclear errors of issue 37 that are the model's: a count of 600 digits, and an argument named as
    # the registry's own parameter ("model_cost() got multiple values for argument 'name'")
    ("torchvision.models.VisionTransformer", dict(image_size=32, patch_size=4, num_classes=10, num_heads=1,
                                                  hidden_dim=10**300), "would have about 10\\^60\\d parameters"),
    ("torchvision.models.resnet18", dict(num_classes=10, name="resnet18"),
     "^mine.json: cannot build model 'torchvision.models.resnet18' \\(model 'torchvision.models.resnet18' takes no "
     "argument 'name'; it takes \\['num_classes'\\]\\)$"),
])
def test_a_card_names_only_an_allowed_constructor_with_checked_arguments(model, args, message):
    """Refused with a CheckpointError before any real model is built: no import path, no download, no callable."""
    with pytest.raises(CheckpointError, match=message):
        check_model(_card(model, **args), "mine.json")


def test_a_card_may_not_place_its_model():
    """``model_args: {"device": "meta"}`` built the model on the meta device: loading it raised PyTorch's
    NotImplementedError ("Cannot copy out of meta tensor"), which no message explained."""
    card = _card("torchvision.models.resnet18", num_classes=10)
    for placed in ({"device": "meta"}, {"dtype": "float64"}):
        with pytest.raises(CheckpointError, match=f"^mine.json: model_args may not set {next(iter(placed))}: where"):
            ModelCard(**{**card.__dict__, "model_args": {**card.model_args, **placed}}).check("mine.json")


def test_allowed_cards_pass_the_checks():
    check_model(_card("torchvision.models.resnet18", num_classes=10), "mine.json")
    check_model(_card("torchvision.models.VisionTransformer", image_size=32, patch_size=4, num_layers=1, num_heads=2,
                      hidden_dim=16, mlp_dim=16, num_classes=10), "mine.json")


class OddTokens(nn.Module):
    """Attention over tokens the views cannot place (8 × 4 patches, no class token) and over a square grid, the
    second attention called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.MultiheadAttention(8, 2, batch_first=True)
        self.square = TimmStyleAttention(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.flatten(2).transpose(1, 2)  # (B, H·W, 8)
        wide = self.wide(tokens[:, :32], tokens[:, :32], tokens[:, :32], need_weights=False)[0]
        return self.square(self.square(tokens[:, :16])).mean() + wide.mean()


def test_plain_layers_the_views_cannot_place_are_left_out_and_a_module_used_twice_is_one_layer():
    layers = convnn_layers(OddTokens().eval(), 8, in_chans=8)
    assert [(layer.name, layer.height, layer.width) for layer in layers] == [("square", 4, 4)]

