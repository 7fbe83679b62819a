"""The hybrid branch layer: a ConvNN branch and a 3×3 convolution side by side, mixed by a 1×1 convolution."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..functional import window_geometry
from ..validation import check_int, check_ratio
from .convnn2d import ConvNN2d

__all__ = ["HybridConvNN2d"]


class HybridConvNN2d(nn.Module):
    """ConvNN branch (``round(λ·C_out)`` channels) ∥ ``kernel_size`` Conv2d branch (the rest) → concat → 1×1 mix.

    Implements METHOD §5 (the paper's hybrid branch layer, §6). Both branches see the whole input. λ =
    ``branch_ratio`` = 0 is "conv + 1×1", the matched convolutional baseline; λ = 1 is pure ConvNN (+ 1×1); the
    paper uses λ = 0.5. Output channels ``[0, C_knn)`` of the concatenation come from the ConvNN branch,
    ``[C_knn, C_out)`` from the convolution.

    ``kernel_size``, ``stride``, ``padding``, ``dilation`` and ``padding_mode`` are ``nn.Conv2d``'s and apply to both
    branches (METHOD §3a): the convolution is ``nn.Conv2d`` with them, the ConvNN branch's window is ``kernel_size``
    (unless ``window_size`` says otherwise, with ``padding="same"``) and its queries sit on the same strided grid,
    so both make (H_out, W_out) outputs.

    Args:
        in_channels (int): C_in.
        out_channels (int): C_out.
        branch_ratio (float): λ ∈ [0, 1], the ConvNN branch's share of C_out (rounded with Python's ``round``).
            Default: 0.5
        kernel_size (int or tuple[int, int]): odd kernel size of the convolution branch, and R of the ConvNN
            branch. Default: 3
        bias (bool): bias of the two branches (the 1×1 mix always has one). Default: True
        stride (int or tuple[int, int]): s of both branches. Default: 1
        padding (int, tuple[int, int] or str): p of both branches, ``"same"`` (d·(R − 1)/2 with any stride, each
            branch its own R) or ``"valid"``. Default: ``"same"``
        dilation (int or tuple[int, int]): d of both branches. Default: 1
        padding_mode (str): ``"zeros"`` only. Default: ``"zeros"``
        **convnn_options: keyword arguments of :class:`ConvNN2d` (``num_neighbors``, ``selection``,
            ``candidate_padding``, ...), checked against its signature even when λ = 0.

    Shape:
        Input (B, C_in, H, W) → output (B, C_out, H_out, W_out) as ``nn.Conv2d``'s (H, W with the defaults), same
        dtype.

    Attributes:
        knn (ConvNN2d or None): the ConvNN branch, None when λ·C_out rounds to 0.
        conv (nn.Conv2d or None): the convolution branch, None when λ·C_out rounds to C_out.
        mix (nn.Conv2d): the 1×1 mix, weight (C_out, C_out, 1, 1).
        geometry (WindowGeometry): the kernel size, stride, padding (cells) and dilation of the conv branch.

    Raises:
        ValueError: λ outside [0, 1], an even ``kernel_size``, a geometry value outside its range, a
            ``window_size`` other than ``kernel_size`` without ``padding="same"``, or an invalid ConvNN option.
        TypeError: an unknown ConvNN option name.

    Example:
        >>> HybridConvNN2d(16, 32, branch_ratio=0.5, num_neighbors=9)(torch.randn(2, 16, 8, 8)).shape
        torch.Size([2, 32, 8, 8])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        branch_ratio: float = 0.5,
        kernel_size: int | tuple[int, int] = 3,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = "same",
        dilation: int | tuple[int, int] = 1,
        padding_mode: str = "zeros",
        **convnn_options,
    ) -> None:
        super().__init__()
        check_ratio("branch_ratio", branch_ratio)
        check_int("in_channels", in_channels, 1)
        check_int("out_channels", out_channels, 1)
        geometry = window_geometry(kernel_size, stride, padding, dilation, padding_mode)
        window = convnn_options.pop("window_size", None)
        if window is not None and window != geometry.window_size and padding != "same":
            raise ValueError(f"window_size={window} differs from kernel_size={geometry.window_size}: the branches' "
                             "outputs agree in size only with padding='same'")
        factory = {"device": device, "dtype": dtype}
        self.in_channels, self.out_channels, self.branch_ratio = in_channels, out_channels, branch_ratio
        self.geometry = geometry  # the conv branch's (METHOD §3a)
        self.knn_channels = round(branch_ratio * out_channels)
        self.conv_channels = out_channels - self.knn_channels
        # Built even at λ = 0 (then with one channel, discarded) so that invalid options raise either way.
        knn = ConvNN2d(in_channels, max(self.knn_channels, 1), bias=bias, kernel_size=window or geometry.window_size,
                       stride=geometry.stride, padding="same" if padding == "same" else geometry.padding,
                       dilation=geometry.dilation, **factory, **convnn_options)
        self.knn = knn if self.knn_channels else None
        self.conv = (nn.Conv2d(in_channels, self.conv_channels, geometry.window_size, stride=geometry.stride,
                               padding=geometry.padding, dilation=geometry.dilation, bias=bias, **factory)
                     if self.conv_channels else None)
        self.mix = nn.Conv2d(out_channels, out_channels, 1, **factory)

    def branches(self, x: Tensor) -> Tensor:
        """The concatenated branch outputs before the 1×1 mix: (B, C_out, H, W), ConvNN channels first."""
        parts = [branch(x) for branch in (self.knn, self.conv) if branch is not None]
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def forward(self, x: Tensor) -> Tensor:
        return self.mix(self.branches(x))

    def describe(self, name: str) -> dict:
        """What this layer is, for :func:`convnn.introspect.convnn_layers` (``name``: its qualified name): its
        ConvNN branch's selection, or, when it has none, a convolution over its kernel's window."""
        if self.knn is None:
            return {"kind": "hybrid", "mixer": "conv", "record_name": None, "num_neighbors": None,
                    "selection": "conv", "similarity": "cosine", "window_size": self.conv.kernel_size[0],
                    "stride": self.conv.stride[0], "dilation": self.conv.dilation[0],
                    "padding": self.conv.padding[0], "branch_ratio": self.branch_ratio}
        return {**self.knn.describe(f"{name}.knn"), "kind": "hybrid", "branch_ratio": self.branch_ratio}

    def extra_repr(self) -> str:
        geometry = self.geometry
        extra = f", kernel_size={geometry.window_size}" if geometry.window_size != 3 else ""
        if not geometry.every_cell or geometry.dilation != 1:
            extra += f", stride={geometry.stride}, padding={geometry.padding}, dilation={geometry.dilation}"
        return f"{self.in_channels}, {self.out_channels}, branch_ratio={self.branch_ratio}{extra}"
