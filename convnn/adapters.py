"""Ordinary models in the ConvNN views: the neighbour sets of plain convolutions and attention (METHOD §8).

A model with no layer of this library (a torchvision ResNet or ViT, a researcher's own CNN) is opened through its
plain layers, each read as the k-NN selection it is:

* ``nn.Conv2d`` with a square kernel k > 1: the output at cell ``o`` aggregates the input cells
  ``s·o − p + d·(0 … k − 1)`` (stride s, padding p, dilation d, on each axis): a fixed window, :func:`conv_window`.
  A query cell ``i`` of the input map is shown with the window of the output that covers it, ``o = ⌊i / s⌋``.
* ``nn.MultiheadAttention`` and timm-style attention (a fused ``qkv`` linear and ``num_heads``, as in timm and
  vit-pytorch): every token is a candidate; the explorer shows the K largest weights of each attention row, which are
  the K keys of largest ``q·k`` (softmax is monotone), as for this library's own MHSA. :func:`as_self_attention`
  gives the equivalent :class:`~convnn.MultiheadSelfAttention` (the same weights), whose q, k the views score.

:func:`describe_plain` says what such a layer is, in the terms :func:`convnn.introspect.convnn_layers` uses for the
library's own layers (its ``describe()``); :func:`layer_input` reads the tokens a forward pre-hook sees.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .layers import MultiheadSelfAttention

__all__ = ["as_self_attention", "attention_weights", "conv_window", "describe_plain", "layer_input",
           "load_attention_weights", "prefix_tokens"]


def _square(value: int | tuple[int, ...]) -> int | None:
    """The common value of a per-axis size (an int, or a pair of equal ints), else None."""
    values = (value,) if isinstance(value, int) else tuple(value)
    return values[0] if len(set(values)) == 1 and isinstance(values[0], int) else None


def _conv_geometry(conv: nn.Conv2d) -> tuple[int, int, int, int] | None:
    """(kernel, stride, dilation, padding) of a convolution that is the same on both axes, with zero padding and a
    kernel wider than one cell, else None (a 1×1 convolution selects only the query)."""
    kernel, stride, dilation = _square(conv.kernel_size), _square(conv.stride), _square(conv.dilation)
    if conv.padding == "same":
        padding = None if dilation is None or kernel is None or (dilation * (kernel - 1)) % 2 else \
            dilation * (kernel - 1) // 2
    elif conv.padding == "valid":
        padding = 0
    else:
        padding = _square(conv.padding)
    if None in (kernel, stride, dilation, padding) or kernel < 2 or conv.padding_mode != "zeros":
        return None
    return kernel, stride, dilation, padding


def _timm_style(module: nn.Module) -> bool:
    """A timm-style attention: a fused ``qkv`` linear of width 3·dim, ``num_heads``, no q/k normalisation."""
    qkv = getattr(module, "qkv", None)
    heads = getattr(module, "num_heads", None)
    plain_norms = all(isinstance(getattr(module, name, nn.Identity()), nn.Identity) for name in ("q_norm", "k_norm"))
    return (isinstance(qkv, nn.Linear) and isinstance(heads, int) and heads > 0 and plain_norms
            and qkv.out_features == 3 * qkv.in_features and qkv.in_features % heads == 0
            and isinstance(getattr(module, "proj", None), nn.Linear))


def describe_plain(module: nn.Module) -> dict | None:
    """What a plain layer is as a neighbour selection, in the fields of :class:`convnn.introspect.LayerInfo`, or
    None for a module that is neither a convolution with a window nor attention (module docstring).

    Returns:
        dict or None: for a convolution ``kind="conv"``, ``mixer="conv"``, ``selection="conv"``, its kernel as
        ``window_size`` and its ``stride``, ``dilation`` and ``padding`` (cells); for attention ``kind="attention"``,
        ``mixer="mhsa"``, ``selection="dense"`` and its ``num_heads``. Both select nothing learned beyond that:
        ``record_name`` and ``num_neighbors`` are None.
    """
    if isinstance(module, nn.Conv2d):
        geometry = _conv_geometry(module)
        if geometry is None:
            return None
        kernel, stride, dilation, padding = geometry
        return {"kind": "conv", "mixer": "conv", "record_name": None, "num_neighbors": None, "selection": "conv",
                "similarity": "cosine", "window_size": kernel, "stride": stride, "dilation": dilation,
                "padding": padding}
    if (isinstance(module, nn.MultiheadAttention) and module._qkv_same_embed_dim) or _timm_style(module):
        return {"kind": "attention", "mixer": "mhsa", "record_name": None, "num_neighbors": None,
                "selection": "dense", "similarity": "dot", "num_heads": module.num_heads}
    return None


def prefix_tokens(model: nn.Module) -> int:
    """Tokens before a ViT's patch grid: timm's ``num_prefix_tokens``, else 1 for a class token (``cls_token``, as
    in timm and this library, or torchvision's ``class_token``), else 0."""
    count = getattr(model, "num_prefix_tokens", None)
    if isinstance(count, int) and count >= 0:
        return count
    return 1 if hasattr(model, "cls_token") or hasattr(model, "class_token") else 0


def layer_input(module: nn.Module, args: tuple, kwargs: dict) -> Tensor:
    """The input a forward pre-hook (``with_kwargs=True``) sees: (B, C, H, W) for maps, (B, N, dim) for tokens
    (an ``nn.MultiheadAttention`` query, batch first whatever its ``batch_first``)."""
    x = args[0] if args else kwargs.get("query", kwargs.get("x", kwargs.get("input")))
    if isinstance(module, nn.MultiheadAttention) and not module.batch_first:
        x = x.transpose(0, 1)
    return x


def attention_weights(module: nn.Module) -> tuple[int, tuple[Tensor, Tensor | None], tuple[Tensor, Tensor | None]]:
    """The heads and weights of a self-attention layer these views read: ``(num_heads, (qkv weight, bias), (output
    projection weight, bias))``, the fused q, k, v projection (3·dim, dim) in the order q, k, v, each head a
    contiguous slice of dim / h (the layout of :meth:`~convnn.MultiheadSelfAttention.project_qkv`; METHOD §8).

    Args:
        module (nn.Module): an ``nn.MultiheadAttention`` (packed in-projection, q, k, v of one width) or a
            timm-style attention (fused ``qkv``, ``proj``; :func:`describe_plain`).

    Raises:
        ValueError: another module.
    """
    if isinstance(module, nn.MultiheadAttention) and module._qkv_same_embed_dim:
        return (module.num_heads, (module.in_proj_weight, module.in_proj_bias),
                (module.out_proj.weight, module.out_proj.bias))
    if _timm_style(module):
        return module.num_heads, (module.qkv.weight, module.qkv.bias), (module.proj.weight, module.proj.bias)
    raise ValueError(f"{type(module).__name__} is not an attention layer these views read (nn.MultiheadAttention "
                     "or a timm-style attention with a fused qkv linear)")


@torch.no_grad()
def load_attention_weights(target: MultiheadSelfAttention, module: nn.Module) -> None:
    """Copy ``module``'s q, k, v and output projections (:func:`attention_weights`) into ``target`` (METHOD §4.3: with
    them, ConvNN-attention with K = N computes ``module``).

    Raises:
        ValueError: ``module`` is not read (:func:`attention_weights`), or its width, heads or biases differ from
            ``target``'s.
    """
    heads, qkv, proj = attention_weights(module)
    shape = (target.num_heads, target.dim, target.qkv.bias is not None, target.proj.bias is not None)
    if (heads, qkv[0].shape[1], qkv[1] is not None, proj[1] is not None) != shape:
        raise ValueError(f"{type(module).__name__} has {heads} heads of width {qkv[0].shape[1]}, qkv bias "
                         f"{qkv[1] is not None}, proj bias {proj[1] is not None}; the target has (heads, dim, qkv "
                         f"bias, proj bias) = {shape}")
    for layer, (w, b) in ((target.qkv, qkv), (target.proj, proj)):
        layer.weight.copy_(w)
        if b is not None:
            layer.bias.copy_(b)


def as_self_attention(module: nn.Module) -> MultiheadSelfAttention:
    """The :class:`~convnn.MultiheadSelfAttention` that computes what ``module`` computes, with its weights copied
    (on ``module``'s device): this library's MHSA itself, an ``nn.MultiheadAttention`` (packed in-projection, q, k, v
    of one width), or a timm-style attention (fused ``qkv``, ``proj``).

    Raises:
        ValueError: another module (:func:`describe_plain` tells which are read).
    """
    if isinstance(module, MultiheadSelfAttention):
        return module
    weight = next(module.parameters())
    heads, qkv, proj = attention_weights(module)
    mhsa = MultiheadSelfAttention(qkv[0].shape[1], heads, qkv_bias=qkv[1] is not None,
                                  proj_bias=proj[1] is not None, device=weight.device, dtype=weight.dtype)
    load_attention_weights(mhsa, module)
    return mhsa.eval()


def conv_window(height: int, width: int, kernel: int, stride: int = 1, dilation: int = 1, padding: int = 0,
                device: torch.device | None = None) -> Tensor:
    """The input cells each query cell of an H×W map is shown with, for a k×k convolution (module docstring).

    Args:
        height, width (int): the convolution's input map, H×W cells.
        kernel (int): k.
        stride (int): s. Default: 1
        dilation (int): d. Default: 1
        padding (int): zero padding p, cells on each side. Default: 0

    Returns:
        Tensor: (H·W, k², 2) int64 ``(row, col)`` of the k² taps (raster order of the kernel) of the output
        ``o = min(⌊i / s⌋, H_out − 1)`` covering each query cell ``i`` (raster order); taps in the zero padding lie
        outside ``[0, H) × [0, W)``, at most p cells out.

    Raises:
        ValueError: the dilated kernel does not fit the padded map (the convolution has no output).
    """
    reach = dilation * (kernel - 1)
    out_h, out_w = (height + 2 * padding - reach - 1) // stride + 1, (width + 2 * padding - reach - 1) // stride + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"a {kernel}×{kernel} convolution (dilation {dilation}, padding {padding}) has no output on "
                         f"a {height}×{width} map")
    taps = torch.arange(kernel, device=device) * dilation
    rows = (torch.arange(height, device=device) // stride).clamp(max=out_h - 1) * stride - padding
    cols = (torch.arange(width, device=device) // stride).clamp(max=out_w - 1) * stride - padding
    tap_rows = (rows[:, None] + taps[None, :])[:, None, :, None].expand(height, width, kernel, kernel)
    tap_cols = (cols[:, None] + taps[None, :])[None, :, None, :].expand(height, width, kernel, kernel)
    return torch.stack([tap_rows, tap_cols], dim=-1).reshape(height * width, kernel * kernel, 2)
