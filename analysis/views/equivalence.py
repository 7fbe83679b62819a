"""The equivalence demo on this image's own features (METHOD §4.1–4.3), with the live max |difference|.

* **Convolution**: ``ConvNN2d(selection="window", K = R²)`` with its rank-slot kernel copied from a ``Conv2d``
  (``W1[o, c, t] = W2[o, c, t // R, t % R]``) and its geometry (stride, padding, dilation: METHOD §3a) against that
  ``Conv2d`` on the layer's input feature map. The ConvNN side runs the theorem, not the ``F.conv2d`` shortcut the
  layer takes by default (``conv_shortcut=False``): each query selects its window's R² cells by spatial distance,
  gathers them into rank slots and aggregates them with the Conv1D. The layer's own convolution is used when it has
  one (a hybrid's branch, a plain convolution), else a seeded random convolution.
* **Depthwise convolution** (METHOD §4.2): the same with ``groups = C`` against a seeded random depthwise ``Conv2d``
  of the same geometry.
* **Attention**: ``ConvNNAttention`` with K = N, softmax weighting and an all-ones depthwise kernel against
  multi-head attention through ``F.scaled_dot_product_attention``, with the same q, k, v and output projections,
  on the layer's input tokens (a ViT layer's own projections; a seeded random one-head attention on a map's pixels).

Each result names the path each side ran (:attr:`Equivalence.convnn_path`, :attr:`Equivalence.reference_path`),
the ConvNN side's read from the layer that ran (:meth:`convnn.ConvNN2d.runs_as_conv2d`, its ``backend``).

Both run on CPU copies in fp32 on the PyTorch reference path, so the difference is not blurred by TF32 convolutions
on a GPU, and K = N is not limited by the fused kernel's maximum K.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from convnn import ConvNN2d, ConvNNAttention, MultiheadSelfAttention
from convnn.adapters import as_self_attention, describe_plain

from ..session.image_decode import InputImage
from ..session.models import LoadedModel
from ..session.traces import layer_conv, layer_module, trace_image

__all__ = ["ATTENTION_DEMO_MAX_BYTES", "Equivalence", "attention_demo_bytes", "attention_equivalence",
           "conv_equivalence", "depthwise_equivalence", "equivalence_summary", "equivalences"]

ATTENTION_DEMO_MAX_BYTES = 2 * 2**30  # the attention demo's memory at most (attention_demo_bytes): past it, left out
DEMO_SEED = 0  # seed of the stand-in weights when the layer has none of the needed kind
_DEMO_CHANNELS = 16  # output channels of the stand-in convolution
_DEMO_WEIGHT_STD = 0.05


@dataclass(frozen=True, eq=False)
class Equivalence:
    """One side-by-side computation, and its pictures over the layer's grid.

    Attributes:
        description (str): what was compared, on which features.
        max_abs_diff (float): ``max |ConvNN − reference|`` over the output.
        max_abs_output (float): ``max |reference|``, the scale the difference is relative to.
        convnn_path (str): how the ConvNN side computed its output, e.g. ``"window selection by spatial distance →
            gather → Conv1d over 9 rank slots (reference path)"``.
        reference_path (str): the operation it is compared with, e.g. ``"F.conv2d"``.
        channel (int): the output channel pictured (the one of widest spread over the grid).
        convnn (np.ndarray): (H, W) float32, the ConvNN side's output channel ``channel`` at each cell.
        reference (np.ndarray): (H, W) float32, the reference's (``conv2d`` or SDPA) at each cell.
        difference (np.ndarray): (H, W) float32, ``max |ConvNN − reference|`` over all channels at each cell.
    """

    description: str
    max_abs_diff: float
    max_abs_output: float
    convnn_path: str
    reference_path: str
    channel: int
    convnn: np.ndarray
    reference: np.ndarray
    difference: np.ndarray


def _pictured(description: str, paths: tuple[str, str], got: Tensor, expected: Tensor,
              whole: tuple[Tensor, Tensor] | None = None) -> Equivalence:
    """The comparison of two (C, H, W) outputs computed by ``paths`` = (ConvNN side's, reference's), pictured on the
    channel of widest spread; the max |difference| and |reference| over ``whole`` = (got, expected) when the grid is
    not all of the output (a ViT's CLS token)."""
    difference = (got - expected).abs()
    whole_got, whole_expected = whole or (got, expected)
    channel = int(expected.flatten(1).std(dim=1, correction=0).argmax())
    return Equivalence(description, float((whole_got - whole_expected).abs().max()),
                       float(whole_expected.abs().max()), *paths, channel, got[channel].numpy(),
                       expected[channel].numpy(), difference.amax(0).numpy())



def _seeded_(module: nn.Module) -> nn.Module:
    """Overwrite every parameter with N(0, 0.05²) draws from a generator seeded with :data:`DEMO_SEED`."""
    generator = torch.Generator().manual_seed(DEMO_SEED)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * _DEMO_WEIGHT_STD)
    return module


def _window_shaped(conv: nn.Conv2d | None) -> bool:
    """Whether ``conv`` computes what window selection with K = k² does on its geometry (METHOD §3a): an odd k×k
    kernel (any stride, dilation and zero padding) and one group (a hybrid's branch; a plain convolution may be
    otherwise)."""
    facts = None if conv is None else describe_plain(conv)  # square kernel > 1, zero padding, or None
    return facts is not None and conv.groups == 1 and facts["window_size"] % 2 == 1


def _window_demo(conv: nn.Conv2d, x: Tensor, what: str, source: str, name: str) -> Equivalence:
    """Window selection (K = R², ``conv``'s geometry and groups, :meth:`~convnn.ConvNN2d.load_conv2d_weight`) run as
    select → gather → Conv1D, against ``conv`` itself on ``x`` (1, C, H, W), the input of the layer ``name``;
    ``what`` starts the description (``""`` or ``"Depthwise "``)."""
    size = conv.kernel_size[0]
    knn = ConvNN2d(conv.in_channels, conv.out_channels, num_neighbors=size**2, selection="window", kernel_size=size,
                   stride=conv.stride, padding=conv.padding, dilation=conv.dilation, groups=conv.groups,
                   bias=conv.bias is not None, backend="reference", conv_shortcut=False)
    knn.load_conv2d_weight(conv)
    with torch.no_grad():
        got, expected = knn(x)[0], conv(x)[0]  # (C_out, H_out, W_out)
    groups = f", groups={conv.groups}" if conv.groups > 1 else ""
    ran = ("F.conv2d with the rank slots as its kernel" if knn.runs_as_conv2d() else
           f"window selection by spatial distance → gather → Conv1d over {size**2} rank slots{groups}")
    return _pictured(f"{what}ConvNN2d(window, K={size**2}{groups}) with {source}'s weights vs conv2d, on the "
                     f"{tuple(x.shape[1:])} input of {name}", (f"{ran} ({knn.backend} path)", f"F.conv2d{groups}"),
                     got, expected)


def _map_input(loaded: LoadedModel, image: InputImage, layer: str, draw: int):
    """(layer_info, module, its input (1, C, H, W) on the CPU in eval draw ``draw``) of a feature-map layer.

    Raises:
        ValueError: ``layer`` is an attention layer (its input is tokens, not a map).
    """
    layer_info = loaded.layer_info(layer)
    if layer_info.is_attention:
        raise ValueError(f"{layer_info.name} works on tokens; the convolution demo needs a feature-map layer")
    x = trace_image(loaded, image, draw).inputs[layer_info.name].cpu()
    return layer_info, layer_module(loaded.model, layer_info), x


def conv_equivalence(loaded: LoadedModel, image: InputImage, layer: str, draw: int = 0) -> Equivalence:
    """Window-selection ConvNN2d (K = R², the convolution's stride, padding and dilation), run as select → gather →
    Conv1D, vs ``Conv2d`` on ``layer``'s input map in eval draw ``draw`` (METHOD §4.1, §3a; §3b: a random-candidate
    model's earlier layers, hence this input, depend on the draw).

    Raises:
        ValueError: ``layer`` is an attention layer (its input is tokens, not a map).
    """
    layer_info, module, x = _map_input(loaded, image, layer, draw)
    conv = layer_conv(module, layer_info)
    if _window_shaped(conv):
        conv = copy.deepcopy(conv).cpu()
        stride = f", stride {conv.stride[0]}" if conv.stride[0] > 1 else ""
        source = f"the layer's own {conv.kernel_size[0]}×{conv.kernel_size[0]}{stride} convolution"
    else:  # none, or one whose output is not the window selection's (groups, an even kernel)
        conv = _seeded_(nn.Conv2d(x.shape[1], _DEMO_CHANNELS, 3, padding=1))
        source = f"a seeded random 3×3 conv ({_DEMO_CHANNELS} channels)"
    return _window_demo(conv, x, "", source, layer_info.name)


def depthwise_equivalence(loaded: LoadedModel, image: InputImage, layer: str, draw: int = 0) -> Equivalence:
    """Depthwise window-selection ConvNN2d (``groups = C``, K = R²), run as select → gather → Conv1D, vs a seeded
    random depthwise ``Conv2d`` on ``layer``'s input map in eval draw ``draw`` (METHOD §4.2): R = 3 and the geometry
    of the layer's own convolution when it has a window-shaped one, else "same" padding.

    Raises:
        ValueError: ``layer`` is an attention layer (its input is tokens, not a map).
    """
    layer_info, module, x = _map_input(loaded, image, layer, draw)
    own = layer_conv(module, layer_info)
    geometry = dict(stride=own.stride, padding=own.padding, dilation=own.dilation) if _window_shaped(own) and (
        own.kernel_size[0] == 3) else dict(padding=1)
    channels = x.shape[1]
    conv = _seeded_(nn.Conv2d(channels, channels, 3, groups=channels, **geometry))
    return _window_demo(conv, x, "Depthwise ", f"a seeded random depthwise 3×3 conv ({channels} channels)",
                        layer_info.name)


def attention_equivalence(loaded: LoadedModel, image: InputImage, layer: str, draw: int = 0) -> Equivalence:
    """ConvNN-attention with K = N vs SDPA multi-head attention on ``layer``'s input tokens in eval draw ``draw``
    (METHOD §4.3)."""
    layer_info = loaded.layer_info(layer)
    module = layer_module(loaded.model, layer_info)
    x = trace_image(loaded, image, draw).inputs[layer_info.name].cpu()
    if layer_info.is_attention:
        own = as_self_attention(module)  # the library's MHSA, or one holding nn.MultiheadAttention's weights
        tokens, dim, heads, source = x, own.dim, own.num_heads, "the layer's own q, k, v and output projections"
        biases = dict(qkv_bias=own.qkv.bias is not None, proj_bias=own.proj.bias is not None)
        mhsa = MultiheadSelfAttention(dim, heads, **biases)
        mhsa.load_state_dict({name: t.cpu() for name, t in own.state_dict().items() if name != "weight"})
    else:
        tokens = x.flatten(2).transpose(1, 2)  # (1, N, C): every pixel is a token
        dim, heads, source = tokens.shape[-1], 1, "seeded random one-head projections"
        biases = {}
        mhsa = _seeded_(MultiheadSelfAttention(dim, heads))
    num_tokens = tokens.shape[1]
    knn = ConvNNAttention(dim, heads, num_neighbors=num_tokens, backend="reference", **biases)  # kernel: all ones
    knn.load_state_dict(mhsa.state_dict(), strict=False)
    with torch.no_grad():
        expected, got = mhsa(tokens)[0], knn(tokens)[0]  # (N, dim)
    grid = (layer_info.height, layer_info.width)  # the grid's tokens (a ViT's CLS first, not pictured), as (dim, H, W)
    pictured = (t[layer_info.num_prefix_tokens:].T.reshape(-1, *grid) for t in (got, expected))
    paths = (f"top-{num_tokens} selection by q·k/√d → softmax → gather → depthwise Conv1d of ones over the rank "
             f"slots, per head ({knn.backend} path)", "F.scaled_dot_product_attention")
    return _pictured(f"ConvNN-attention (K = N = {num_tokens}, softmax, ones kernel) vs scaled_dot_product_attention "
                     f"with {source}, on the input tokens of {layer_info.name}", paths, *pictured, (got, expected))


def attention_demo_bytes(num_tokens: int, dim: int, heads: int = 1) -> int:
    """The memory :func:`attention_equivalence` holds at its peak on ``num_tokens`` tokens N of ``dim`` channels in
    ``heads`` heads, bytes: K = N, so the reference path gathers every key's value for every query (N·N·dim fp32
    values) and weighs them into a second such tensor, and each head scores, ranks and selects its N·N pairs (scores,
    int64 indices, run numbers and sort keys: ≈ 40 bytes a pair). Measured peaks: 0.55 GB at N = 1,024, dim 64, one
    head (a CIFAR model's first layer; this gives 0.59 GB); 9.4 GB at N = 4,096, dim 12, 12 heads (11.3 GB)."""
    return 8 * num_tokens**2 * dim + 48 * heads * num_tokens**2


def _attention_left_out(loaded: LoadedModel, image: InputImage, layer: str, draw: int) -> str | None:
    """Why the attention demo is not run on ``layer`` (its memory past :data:`ATTENTION_DEMO_MAX_BYTES`), or
    None."""
    layer_info = loaded.layer_info(layer)
    x = trace_image(loaded, image, draw).inputs[layer_info.name]
    num_tokens, dim = (x.shape[1], x.shape[2]) if x.dim() == 3 else (x.shape[2] * x.shape[3], x.shape[1])
    heads = layer_info.num_heads  # 1 for a map layer
    need = attention_demo_bytes(num_tokens, dim, heads)
    if need <= ATTENTION_DEMO_MAX_BYTES:
        return None
    return (f"The attention demo is left out on this layer: with K = N = {num_tokens} tokens of {dim} channels in "
            f"{heads} head{'s' * (heads > 1)} it would hold {need / 2**30:.1f} GB (every query gathers every key's "
            f"value), more than the {ATTENTION_DEMO_MAX_BYTES / 2**30:.0f} GB it may; a later layer has fewer "
            "tokens.")


def equivalences(loaded: LoadedModel, image: InputImage, layer: str, draw: int = 0,
                 between: Callable[[], None] | None = None) -> list[Equivalence]:
    """Every demo that applies to ``layer``: convolution and depthwise convolution on a map layer, then attention
    (unless its memory would pass :data:`ATTENTION_DEMO_MAX_BYTES`: :func:`attention_demo_bytes`; the summary says
    so), each on the layer's input in eval draw ``draw`` (METHOD §3b; the same input in every draw of a model
    without random candidates). ``between()``, if given, is called before each demo (a slow run's drop check: it
    may raise to stop there).

    Raises:
        ValueError: unknown layer, or a ``draw`` that is not an integer ≥ 0.
    """
    maps = () if loaded.layer_info(layer).is_attention else (conv_equivalence, depthwise_equivalence)
    attention = () if _attention_left_out(loaded, image, layer, draw) else (attention_equivalence,)
    results = []
    for demo in (*maps, *attention):
        if between is not None:
            between()
        results.append(demo(loaded, image, layer, draw))
    return results


def equivalence_summary(loaded: LoadedModel, image: InputImage, layer: str, draw: int = 0,
                        results: list[Equivalence] | None = None) -> str:
    """:func:`equivalences` (or ``results``, computed already) as Markdown paragraphs.

    Raises:
        ValueError: unknown layer, or a ``draw`` that is not an integer ≥ 0.
    """
    results = equivalences(loaded, image, layer, draw) if results is None else results
    return "\n\n".join([*(f"**{r.description}**: max |difference| = {r.max_abs_diff:.2e} (output scale "
                          f"{r.max_abs_output:.2e}). ConvNN side: {r.convnn_path}; reference: {r.reference_path}."
                          for r in results), *filter(None, [_attention_left_out(loaded, image, layer, draw)])])
