"""ResNet-style CNNs whose 3×3 convolutions are hybrid branch layers (METHOD §5): CIFAR and ImageNet sizes."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn
from torchvision.models.resnet import Bottleneck, ResNet

from ..candidates import assign_candidate_seeds
from ..conversion import convert
from ..layers import HybridConvNN2d
from .cost import resnet50_cost, resnet_cifar_cost
from .registry import register_model

__all__ = ["ResNetCifar", "convnn_resnet50", "convnn_resnet_cifar"]


def _refuse_layer_seed(options: dict) -> None:
    """Raise ``ValueError`` if a model is given one ``seed`` for all its layers (each derives its own)."""
    if "seed" in options:
        raise ValueError(f"seed is derived per layer from candidate_seed; pass candidate_seed={options['seed']!r} "
                         "instead")


def _norm_act(channels: int) -> nn.Sequential:
    return nn.Sequential(nn.BatchNorm2d(channels), nn.GELU())


class ResidualBlock(nn.Module):
    """x + BN(hybrid(GELU(BN(hybrid(x))))), then GELU: two hybrid 3×3 layers at constant width and resolution."""

    def __init__(self, channels: int, branch_ratio: float, **convnn_options) -> None:
        super().__init__()
        self.conv1 = HybridConvNN2d(channels, channels, branch_ratio, bias=False, **convnn_options)
        self.act1 = _norm_act(channels)
        self.conv2 = HybridConvNN2d(channels, channels, branch_ratio, bias=False, **convnn_options)
        self.bn2 = nn.BatchNorm2d(channels)
        self.act2 = nn.GELU()

    def forward(self, x: Tensor) -> Tensor:
        return self.act2(x + self.bn2(self.conv2(self.act1(self.conv1(x)))))


class DownBlock(nn.Sequential):
    """hybrid 3×3 (C_in → C_out) at the input resolution → 2×2 max-pool → BN → GELU."""

    def __init__(self, in_channels: int, out_channels: int, branch_ratio: float, **convnn_options) -> None:
        super().__init__(HybridConvNN2d(in_channels, out_channels, branch_ratio, bias=False, **convnn_options),
                         nn.MaxPool2d(2), *_norm_act(out_channels))


class ResNetCifar(nn.Module):
    """A small ResNet for 32×32 images in which every 3×3 convolution after the stem is a hybrid layer.

    Layout: stem 3×3 conv (C_0) → for each stage s: ``depths[s]`` residual blocks at width C_s, then (except after
    the last stage) a down block to C_{s+1} at half the resolution → global average pool → linear. With the
    defaults the stages run at 32×32, 16×16 and 8×8 tokens, so ConvNN selection sees N = 1024, 256 and 64.
    λ = 0 gives the matched "conv + 1×1" baseline with the same depth and width.

    Args:
        widths (Sequence[int]): C_s per stage. Default: (64, 128, 256)
        depths (Sequence[int]): residual blocks per stage. Default: (1, 1, 1)
        branch_ratio (float): λ of every hybrid layer. Default: 0.5
        num_classes (int): classifier outputs. Default: 10
        in_chans (int): input channels. Default: 3
        candidate_seed (int): the model seed of random candidate draws: each random layer's seed is derived from it
            and the layer's name (:func:`convnn.candidates.assign_candidate_seeds`). Default: 0
        **convnn_options: :class:`~convnn.layers.ConvNN2d` options of the ConvNN branches (``num_neighbors``,
            ``selection``, ``num_candidates``, ``blend_alpha``, ``backend``, ...; not ``seed``).

    Shape:
        Input (B, in_chans, H, W) with H, W divisible by 2^(stages − 1) → logits (B, num_classes).

    Raises:
        ValueError: widths and depths of different or zero length, ``seed`` among the ConvNN options (layers get
            theirs from ``candidate_seed``), or an invalid option.
    """

    family = "ResNet"  # convnn.introspect.model_family

    def __init__(self, *, widths: Sequence[int] = (64, 128, 256), depths: Sequence[int] = (1, 1, 1),
                 branch_ratio: float = 0.5, num_classes: int = 10, in_chans: int = 3, candidate_seed: int = 0,
                 **convnn_options) -> None:
        super().__init__()
        if len(widths) != len(depths) or not widths:
            raise ValueError(f"widths and depths must have the same non-zero length, got {widths}, {depths}")
        _refuse_layer_seed(convnn_options)
        self.stem = nn.Sequential(nn.Conv2d(in_chans, widths[0], 3, padding=1, bias=False), *_norm_act(widths[0]))
        stages: list[nn.Module] = []
        for s, (width, depth) in enumerate(zip(widths, depths, strict=True)):
            blocks = [ResidualBlock(width, branch_ratio, **convnn_options) for _ in range(depth)]
            if s + 1 < len(widths):
                blocks.append(DownBlock(width, widths[s + 1], branch_ratio, **convnn_options))
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(widths[-1], num_classes)
        assign_candidate_seeds(self, candidate_seed)

    def forward_features(self, x: Tensor) -> Tensor:
        """(B, in_chans, H, W) → (B, C_last, H / 2^(S−1), W / 2^(S−1)) final feature map."""
        return self.stages(self.stem(x))

    def forward_head(self, features: Tensor) -> Tensor:
        """Global average pool and linear classifier: (B, C, h, w) → (B, num_classes)."""
        return self.head(features.mean(dim=(2, 3)))

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


@register_model(cost=resnet_cifar_cost)
def convnn_resnet_cifar(**kwargs) -> ResNetCifar:
    """The CIFAR ResNet of :class:`ResNetCifar` (λ = 0.5, exhaustive K = 9 unless overridden)."""
    return ResNetCifar(**kwargs)


@register_model(cost=resnet50_cost)
def convnn_resnet50(*, branch_ratio: float = 0.5, num_classes: int = 1000, num_neighbors: int = 16,
                    candidate_seed: int = 0, **convnn_options) -> ResNet:
    """torchvision's ResNet-50 with each bottleneck's 3×3 convolution replaced by a hybrid layer (paper, §7):
    :func:`convnn.convert` in the paper's stride form.

    Strided 3×3 convolutions become a stride-1 hybrid layer followed by 2×2 average pooling
    (``stride_form="pool"``); the hybrids keep their own initialisation (``carry_weights=False``: the ResNet is
    random). Defaults follow the paper's best ImageNet model: λ = 0.5, K = 16, exhaustive selection.
    ``candidate_seed`` as in :class:`ResNetCifar`.
    """
    _refuse_layer_seed(convnn_options)
    model = ResNet(Bottleneck, [3, 4, 6, 3], num_classes=num_classes)
    model.family = "ResNet"  # convnn.introspect.model_family
    return convert(model, rule=convnn_options.pop("selection", "all"), branch_ratio=branch_ratio,
                   num_neighbors=num_neighbors, stride_form="pool", carry_weights=False,
                   candidate_seed=candidate_seed, **convnn_options)
