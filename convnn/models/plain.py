"""Ordinary torchvision models a card may name (the allow-list beside this library's own, METHOD §8).

A researcher's plain CNN or ViT opens in the same views through :mod:`convnn.adapters`. A card names one of these
registered constructors (``"model": "torchvision.models.resnet18"``), never an import path: each takes only the
keyword arguments its cost function (:mod:`convnn.models.cost`) checks, builds random weights (``weights=None``:
nothing is downloaded) and gets its trained weights from the checkpoint's safetensors file.
"""

from __future__ import annotations

from torch import nn

from .cost import torchvision_resnet18_cost, torchvision_vit_cost
from .registry import register_model

__all__ = ["torchvision_resnet18", "torchvision_vit"]


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
