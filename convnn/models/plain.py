"""Ordinary torchvision models a card may name (the allow-list beside this library's own, METHOD §8), and their
conversions by :func:`convnn.convert`.

A researcher's plain CNN or ViT opens in the same views through :mod:`convnn.adapters`. A card names one of these
registered constructors (``"model": "torchvision.models.resnet18"``), never an import path: each takes only the
keyword arguments its cost function (:mod:`convnn.models.cost`) checks, builds random weights (``weights=None``:
nothing is downloaded) and gets its trained weights from the checkpoint's safetensors file. A converted model's card
names ``"convnn.convert:torchvision.models.resnet18"`` with the conversion's arguments.
"""

from __future__ import annotations

from torch import nn

from ..conversion import convert
from .cost import converted_resnet18_cost, torchvision_resnet18_cost, torchvision_vit_cost
from .registry import register_model

__all__ = ["CONVERTED_RESNET18", "converted_resnet18", "torchvision_resnet18", "torchvision_vit"]

CONVERTED_RESNET18 = "convnn.convert:torchvision.models.resnet18"  # what a converted ResNet-18's card names


@register_model(name="torchvision.models.resnet18", cost=torchvision_resnet18_cost)
def torchvision_resnet18(*, num_classes: int = 1000) -> nn.Module:
    """``torchvision.models.resnet18(weights=None, num_classes=num_classes)``: 11.7 M parameters at 1000 classes.

    Its 3×3 and 7×7 convolutions open as fixed windows (with their stride and padding), its 1×1 ones select only
    the query and are left out (:func:`convnn.adapters.describe_plain`).
    """
    from torchvision.models import resnet18

    return resnet18(weights=None, num_classes=num_classes)


@register_model(name="torchvision.models.VisionTransformer", cost=torchvision_vit_cost)
def torchvision_vit(*, image_size: int = 224, patch_size: int = 16, num_layers: int = 12, num_heads: int = 12,
                    hidden_dim: int = 768, mlp_dim: int = 3072, num_classes: int = 1000, dropout: float = 0.0,
                    attention_dropout: float = 0.0) -> nn.Module:
    """``torchvision.models.VisionTransformer(…)`` with these arguments (the defaults are ViT-B/16 at 224 px).

    Its ``nn.MultiheadAttention`` layers open as attention over every token (the K largest weights of each row), its
    patch embedding as a ``patch_size`` window of stride ``patch_size``; the class token is the prefix token.
    """
    from torchvision.models import VisionTransformer

    return VisionTransformer(image_size=image_size, patch_size=patch_size, num_layers=num_layers,
                             num_heads=num_heads, hidden_dim=hidden_dim, mlp_dim=mlp_dim, num_classes=num_classes,
                             dropout=dropout, attention_dropout=attention_dropout)


@register_model(name=CONVERTED_RESNET18, cost=converted_resnet18_cost)
def converted_resnet18(*, num_classes: int = 1000, rule: str = "all", branch_ratio: float = 0.5,
                       num_neighbors: int = 9, stride_form: str = "query", candidate_seed: int = 0,
                       **options) -> nn.Module:
    """``convnn.convert(torchvision.models.resnet18(weights=None, num_classes=…), rule=…, branch_ratio=…,
    num_neighbors=…, stride_form=…, candidate_seed=…, **options)``: the model a converted ResNet-18's card builds
    before its weights are loaded (its cost is checked first, :func:`convnn.models.cost.converted_resnet18_cost`;
    METHOD §5, §8).

    Raises:
        ValueError: an argument :func:`convnn.convert` or the layers refuse.
        TypeError: an option no ConvNN layer takes.
    """
    return convert(torchvision_resnet18(num_classes=num_classes), rule=rule, branch_ratio=branch_ratio,
                   num_neighbors=num_neighbors, stride_form=stride_form, candidate_seed=candidate_seed, **options)
