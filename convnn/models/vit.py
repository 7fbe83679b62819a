"""Vision transformers whose token mixer is MHSA, KVT or ConvNN-attention (METHOD §5): CIFAR and ImageNet sizes."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..candidates import assign_candidate_seeds
from ..layers import create_attention
from .cost import ModelCost, vit_cost
from .registry import register_model

__all__ = ["VisionTransformer", "convnn_vit_b16", "convnn_vit_cifar"]


class DropPath(nn.Module):
    """Stochastic depth: drop a residual branch per sample with probability ``p`` in training, rescale the rest."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape[0], *([1] * (x.dim() - 1)), device=x.device) >= self.p
        return x * keep.to(x.dtype) / (1 - self.p)


class Block(nn.Module):
    """Pre-norm transformer block: x + mixer(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, attention: str, drop_path: float,
                 **knn_options) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = create_attention(attention, dim, num_heads, **knn_options)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class VisionTransformer(nn.Module):
    """ViT with a CLS token and learned position embeddings; the token mixer is chosen by ``attention``.

    Args:
        img_size (int): square input side in pixels. Default: 32
        patch_size (int): patch side; tokens N = (img_size / patch_size)² + 1 (CLS). Default: 4
        in_chans (int): input channels. Default: 3
        num_classes (int): classifier outputs. Default: 10
        dim (int): token width. Default: 128
        depth (int): blocks. Default: 6
        num_heads (int): heads per block. Default: 4
        mlp_ratio (float): MLP hidden width / dim. Default: 4.0
        attention (str): ``"mhsa"``, ``"kvt"`` or ``"convnn"``. Default: ``"mhsa"``
        drop_path_rate (float): stochastic depth, linearly increasing to this rate over the blocks. Default: 0.0
        candidate_seed (int): the model seed of random candidate draws: each random block's seed is derived from it
            and the block's name (:func:`convnn.candidates.assign_candidate_seeds`). Default: 0
        **knn_options: options of :class:`~convnn.layers.ConvNNAttention` for ``"kvt"`` / ``"convnn"``
            (``num_neighbors``, ``selection``, ``num_candidates``, ...; not ``seed``).

    Shape:
        Input (B, in_chans, img_size, img_size) → logits (B, num_classes).
    """

    family = "ViT"  # convnn.introspect.model_family

    def __init__(self, *, img_size: int = 32, patch_size: int = 4, in_chans: int = 3, num_classes: int = 10,
                 dim: int = 128, depth: int = 6, num_heads: int = 4, mlp_ratio: float = 4.0, attention: str = "mhsa",
                 drop_path_rate: float = 0.0, candidate_seed: int = 0, **knn_options) -> None:
        super().__init__()
        if img_size % patch_size:
            raise ValueError(f"img_size={img_size} must be a multiple of patch_size={patch_size}")
        if "seed" in knn_options:
            raise ValueError(f"seed is derived per block from candidate_seed; pass "
                             f"candidate_seed={knn_options['seed']!r} instead")
        self.img_size, self.patch_size = img_size, patch_size
        self.patch_embed = nn.Conv2d(in_chans, dim, patch_size, stride=patch_size)
        num_patches = (img_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, dim) * 0.02)
        rates = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()  # also when built on "meta"
        self.blocks = nn.Sequential(*[Block(dim, num_heads, mlp_ratio, attention, rate, **knn_options)
                                      for rate in rates])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        assign_candidate_seeds(self, candidate_seed)

    def forward_features(self, x: Tensor) -> Tensor:
        """(B, C, H, W) → (B, N, dim) tokens after the final norm; token 0 is CLS, then patches in raster order."""
        if x.shape[-2:] != (self.img_size, self.img_size):
            raise ValueError(f"input must be {self.img_size}×{self.img_size} (img_size), got {tuple(x.shape[-2:])} "
                             f"(with --data synthetic or imagefolder, pass --image-size {self.img_size})")
        patches = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, num_patches, dim)
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), patches], dim=1) + self.pos_embed
        return self.norm(self.blocks(tokens))

    def forward_head(self, tokens: Tensor) -> Tensor:
        """CLS token → logits (B, num_classes)."""
        return self.head(tokens[:, 0])

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


@register_model(cost=vit_cost)
def convnn_vit_cifar(**kwargs) -> VisionTransformer:
    """ViT for 32×32 CIFAR: patch 4 (64 patches + CLS), dim 128, depth 6, 4 heads (≈1.2 M parameters)."""
    return VisionTransformer(**kwargs)


_VIT_B16 = dict(img_size=224, patch_size=16, num_classes=1000, dim=768, depth=12, num_heads=12)


def _vit_b16_cost(input_size: int, *, attention: str = "convnn", num_neighbors: int = 25, **kwargs) -> ModelCost:
    return vit_cost(input_size, **{**_VIT_B16, **kwargs}, attention=attention, num_neighbors=num_neighbors)


@register_model(cost=_vit_b16_cost)
def convnn_vit_b16(*, attention: str = "convnn", num_neighbors: int = 25, **kwargs) -> VisionTransformer:
    """ViT-Base/16 at 224 px (dim 768, depth 12, 12 heads); ConvNN-attention with K = 25 as in the paper (§7)."""
    knn = {} if attention == "mhsa" else {"num_neighbors": num_neighbors}
    return VisionTransformer(**{**_VIT_B16, **kwargs}, attention=attention, **knn)
