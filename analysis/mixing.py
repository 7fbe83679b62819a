"""The λ mix of a hybrid layer: how much of the 1×1 mix output comes from each branch, per pixel (METHOD §5).

The hybrid layer concatenates ``z = [z_knn ; z_conv]`` (ConvNN channels first) and mixes with a 1×1 convolution
``y = M z + b``. Splitting ``M = [M_knn  M_conv]`` gives ``y − b = M_knn z_knn + M_conv z_conv``; the ConvNN share of a
pixel is ``‖M_knn z_knn‖ / (‖M_knn z_knn‖ + ‖M_conv z_conv‖)`` (L2 over output channels), in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .caching import bounded_cache
from .checkpoints import LoadedModel
from .images import InputImage
from .probes import probe_module
from .tracing import trace_image

__all__ = ["BranchMix", "branch_mix", "mix_summary"]


@dataclass(frozen=True)
class BranchMix:
    """Per-pixel branch shares of a hybrid layer's output.

    Attributes:
        branch_ratio (float): λ.
        knn_channels (int): channels of the ConvNN branch (``round(λ·C_out)``).
        conv_channels (int): channels of the convolution branch.
        knn_norm (np.ndarray): (H, W) float32 ``‖M_knn z_knn‖`` per pixel.
        conv_norm (np.ndarray): (H, W) float32 ``‖M_conv z_conv‖`` per pixel.
        share (np.ndarray): (H, W) float32 ConvNN share in [0, 1] (0.5 where both norms are 0).
    """

    branch_ratio: float
    knn_channels: int
    conv_channels: int
    knn_norm: np.ndarray
    conv_norm: np.ndarray
    share: np.ndarray


@bounded_cache(32)
def branch_mix(loaded: LoadedModel, image: InputImage, layer: str) -> BranchMix:
    """The ConvNN vs convolution share of ``layer``'s 1×1 mix output at every pixel (cached).

    Raises:
        ValueError: ``layer`` is not a hybrid layer.
    """
    probe = loaded.probe(layer)
    if probe.kind != "hybrid":
        raise ValueError(f"{probe.name} is not a hybrid layer: the λ mix exists only in HybridConvNN2d layers")
    module = probe_module(loaded.model, probe)
    x = trace_image(loaded, image).inputs[probe.name]
    with torch.no_grad(), loaded.lock:
        z = module.branches(x)  # (1, C_out, H, W), ConvNN channels first
        split = module.knn_channels
        weight = module.mix.weight  # (C_out, C_out, 1, 1)
        knn_part = F.conv2d(z[:, :split], weight[:, :split]) if split else torch.zeros_like(z)
        conv_part = F.conv2d(z[:, split:], weight[:, split:]) if module.conv_channels else torch.zeros_like(z)
        knn_norm, conv_norm = knn_part.norm(dim=1)[0], conv_part.norm(dim=1)[0]
        total = knn_norm + conv_norm
        share = torch.where(total > 0, knn_norm / total.clamp_min(torch.finfo(total.dtype).tiny), 0.5)
    return BranchMix(module.branch_ratio, module.knn_channels, module.conv_channels, knn_norm.cpu().numpy(),
                     conv_norm.cpu().numpy(), share.cpu().numpy())


def mix_summary(mix: BranchMix, cell: tuple[int, int]) -> str:
    """The channel split, and at ``cell`` = ``(row, col)`` the two branches' norms and the ConvNN share, as text."""
    row, col = cell
    return (f"λ = {mix.branch_ratio}: {mix.knn_channels} ConvNN channels + {mix.conv_channels} conv channels. "
            f"At cell ({row}, {col}): ‖ConvNN part‖ = {mix.knn_norm[row, col]:.3f}, ‖conv part‖ = "
            f"{mix.conv_norm[row, col]:.3f}, ConvNN share = {100 * mix.share[row, col]:.1f}% "
            f"(image mean {100 * mix.share.mean():.1f}%).")
