"""``convert``: the ConvNN version of a model you already have (METHOD §5, §3a).

Every 3×3 ``nn.Conv2d`` (one group, zero padding, a square geometry) becomes a
:class:`~convnn.HybridConvNN2d` with the convolution's stride, padding and dilation, its weights carried: the
convolution's last ``C_out − round(λ·C_out)`` output channels fill the conv branch, its first ones the ConvNN branch
when that branch selects by window with K = 9 (exactly those channels of the convolution, METHOD §4.1; other rules
start from their own initialisation), and the 1×1 mix starts as the identity. So at λ = 0 (and for the window rule at
any λ) the converted model computes what the original did.

Every self-attention these views read (``nn.MultiheadAttention`` with ``batch_first=True`` and one width for q, k,
v, as in torchvision's ``VisionTransformer``; a timm-style attention with a fused ``qkv`` and ``proj``) becomes
ConvNN-attention or KVT with its q, k, v and output projections carried; with K = N and softmax weighting it equals
the original (METHOD §4.3). Attention dropout is not carried (the k-NN layers have none).
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn

from .adapters import describe_plain, load_attention_weights
from .candidates import assign_candidate_seeds
from .functional import window_geometry
from .layers import ConvNN2d, HybridConvNN2d, KVTAttention
from .layers.attention import ConvNNAttention
from .selection import SELECTION_RULES, effective_selection
from .validation import check_choice, check_int, check_ratio

__all__ = ["ATTENTION_KINDS", "STRIDE_FORMS", "ConvNNMultiheadAttention", "HybridDownsample",
           "KVTMultiheadAttention", "conversion_options", "convert"]

STRIDE_FORMS = ("query", "pool")  # a strided 3×3: queries on the strided grid, or stride 1 then average pooling
ATTENTION_KINDS = ("convnn", "kvt")
_CONVERTED_KERNEL = 3
# Layer arguments convert sets itself: from the replaced layer, from its own arguments, or derived (seed).
_SET_BY_CONVERT = {"self", "in_channels", "out_channels", "dim", "num_heads", "kernel_size", "window_size", "stride",
                   "padding", "dilation", "padding_mode", "groups", "bias", "qkv_bias", "proj_bias", "seed", "device",
                   "dtype", "num_neighbors", "selection"}


class HybridDownsample(nn.Sequential):
    """A hybrid layer at stride 1, then ``s × s`` average pooling: the paper's form of a strided 3×3 (its ResNet-50,
    ``stride_form="pool"``); module 0 is the hybrid, module 1 the pooling."""

    def __init__(self, hybrid: HybridConvNN2d, stride: int) -> None:
        super().__init__(hybrid, nn.AvgPool2d(stride))


class _CalledAsMultiheadAttention:
    """``forward(query, key, value, …)`` as ``nn.MultiheadAttention`` (batch first) is called, returning
    ``(output, None)``: self-attention only, without masks; the attention weights are not returned."""

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                key_padding_mask: Tensor | None = None, need_weights: bool = True, attn_mask: Tensor | None = None,
                average_attn_weights: bool = True, is_causal: bool = False) -> tuple[Tensor, None]:
        if any(t is not None and t is not query for t in (key, value)):
            raise ValueError(f"{type(self).__name__} is self-attention: key and value must be the query")
        if key_padding_mask is not None or attn_mask is not None or is_causal:
            raise ValueError(f"{type(self).__name__} takes no masks (it selects among all tokens)")
        return super().forward(query), None


class ConvNNMultiheadAttention(_CalledAsMultiheadAttention, ConvNNAttention):
    """:class:`~convnn.ConvNNAttention` called as a batch-first ``nn.MultiheadAttention`` (what :func:`convert`
    puts in its place): ``(B, N, dim)`` query → ``(output (B, N, dim), None)``."""


class KVTMultiheadAttention(_CalledAsMultiheadAttention, KVTAttention):
    """:class:`~convnn.KVTAttention` called as a batch-first ``nn.MultiheadAttention`` (see
    :class:`ConvNNMultiheadAttention`)."""


_ATTENTIONS = {("convnn", False): ConvNNAttention, ("kvt", False): KVTAttention,
               ("convnn", True): ConvNNMultiheadAttention, ("kvt", True): KVTMultiheadAttention}


def conversion_options(options: dict) -> tuple[dict, dict]:
    """:func:`convert`'s ``**options`` → (those :class:`~convnn.ConvNN2d` takes, those
    :class:`~convnn.ConvNNAttention` takes); what ``convert`` sets itself is none of them.

    Raises:
        TypeError: an option neither takes, or one ``convert`` sets (the message names it).
    """
    takes = [set(inspect.signature(cls.__init__).parameters) - _SET_BY_CONVERT for cls in (ConvNN2d, ConvNNAttention)]
    unknown = sorted(set(options) - takes[0] - takes[1])
    if unknown:
        raise TypeError(f"convert takes no option {', '.join(map(repr, unknown))}: the options of ConvNN2d and "
                        "ConvNNAttention but those the replaced layer sets (its sizes, geometry, bias, device), K, "
                        "the rule and seed (derived from candidate_seed)")
    return ({k: v for k, v in options.items() if k in takes[0]}, {k: v for k, v in options.items() if k in takes[1]})


def _converts(conv: nn.Module) -> bool:
    """A convolution :func:`convert` replaces: ``nn.Conv2d``, 3×3, one group, a square geometry, zero padding."""
    facts = describe_plain(conv) if type(conv) is nn.Conv2d else None
    return facts is not None and facts["window_size"] == _CONVERTED_KERNEL and conv.groups == 1


@torch.no_grad()
def _hybrid(conv: nn.Conv2d, branch_ratio: float, stride_form: str, carry_weights: bool, options: dict
            ) -> nn.Module:
    """The hybrid layer (or :class:`HybridDownsample`) that replaces ``conv``."""
    geometry = window_geometry(conv.kernel_size, conv.stride, conv.padding, conv.dilation, conv.padding_mode)
    pooled = stride_form == "pool" and geometry.stride > 1
    hybrid = HybridConvNN2d(conv.in_channels, conv.out_channels, branch_ratio, geometry.window_size,
                            bias=conv.bias is not None, device=conv.weight.device, dtype=conv.weight.dtype,
                            stride=1 if pooled else geometry.stride, padding=geometry.padding,
                            dilation=geometry.dilation, **options)
    if carry_weights:
        split = hybrid.knn_channels
        if hybrid.conv is not None:
            hybrid.conv.weight.copy_(conv.weight[split:])
            if conv.bias is not None:
                hybrid.conv.bias.copy_(conv.bias[split:])
        knn = hybrid.knn
        if knn is not None and effective_selection(knn.selection, knn.blend_alpha) == "window" and (
                knn.num_neighbors == knn.window_size**2 and not pooled):
            knn.weight.copy_(conv.weight[:split].flatten(2))
            if conv.bias is not None:
                knn.bias.copy_(conv.bias[:split])
        hybrid.mix.weight.copy_(torch.eye(conv.out_channels).view_as(hybrid.mix.weight))
        hybrid.mix.bias.zero_()
    return HybridDownsample(hybrid, geometry.stride) if pooled else hybrid


def _attention(module: nn.Module, attention: str, options: dict) -> nn.Module | None:
    """The k-NN attention that replaces ``module``, its projections carried; None if ``module`` is not one
    :func:`convert` replaces."""
    facts = describe_plain(module)
    if facts is None or facts["kind"] != "attention":
        return None
    called_as_torch = isinstance(module, nn.MultiheadAttention)
    if called_as_torch and not module.batch_first:
        raise ValueError("convert replaces nn.MultiheadAttention with batch_first=True only (torchvision's ViT)")
    weight = next(module.parameters())
    projection = module.out_proj if called_as_torch else module.proj
    qkv_bias = (module.in_proj_bias if called_as_torch else module.qkv.bias) is not None
    replacement = _ATTENTIONS[attention, called_as_torch](
        projection.in_features, module.num_heads, qkv_bias=qkv_bias, proj_bias=projection.bias is not None,
        device=weight.device, dtype=weight.dtype, **options)
    load_attention_weights(replacement, module)
    return replacement


def convert(model: nn.Module, *, rule: str = "all", branch_ratio: float = 0.5, num_neighbors: int = 9,
            attention: str = "convnn", stride_form: str = "query", carry_weights: bool = True,
            candidate_seed: int = 0, **options) -> nn.Module:
    """Turn ``model`` into its ConvNN version, in place (module docstring; METHOD §5, §3a, §4.1, §4.3).

    Args:
        model (nn.Module): e.g. torchvision's ``resnet18``, ``resnet50``, ``vgg11`` or ``VisionTransformer``, or
            any model with 3×3 convolutions or self-attention (``nn.MultiheadAttention``, batch first; timm-style).
        rule (str): the selection of every ConvNN branch and attention layer (``"all"``, ``"random"``; for the
            convolutions also ``"window"``, ``"blend"``). Default: ``"all"``
        branch_ratio (float): λ of every hybrid layer. Default: 0.5
        num_neighbors (int): K of every ConvNN branch and attention layer (K = N: attention over every token).
            Default: 9
        attention (str): ``"convnn"`` (ConvNN-attention) or ``"kvt"`` (its kernel frozen at ones). Default:
            ``"convnn"``
        stride_form (str): a strided 3×3 becomes a hybrid with queries on the strided grid (``"query"``), or, as
            in the paper's ResNet-50, a stride-1 hybrid followed by ``s × s`` average pooling (``"pool"``,
            :class:`HybridDownsample`). Default: ``"query"``
        carry_weights (bool): carry the convolutions' and attention's weights (module docstring); False: the
            hybrids keep their own initialisation (attention weights are always carried). Default: True
        candidate_seed (int): the model seed of random candidate draws
            (:func:`convnn.candidates.assign_candidate_seeds`). Default: 0
        **options: further :class:`~convnn.ConvNN2d` options of the ConvNN branches (``num_candidates``,
            ``blend_alpha``, ``similarity``, ``candidate_padding``, …) and :class:`~convnn.ConvNNAttention` options
            of the attention layers (``num_candidates``, ``weighting``, …); each goes where it is taken.

    Returns:
        nn.Module: ``model`` itself, its layers replaced (on their device and dtype); when ``model`` is itself a
        3×3 convolution or an attention layer, its replacement.

    Raises:
        ValueError: an argument outside its range (λ, K, rule, attention, stride form; checked whatever the model
            holds), a rule attention cannot select by when the model has attention, an ``nn.MultiheadAttention``
            that is not batch first, or a layer to convert that is shared by two places of the model.
        TypeError: an option neither layer takes (``seed``: layers derive theirs from ``candidate_seed``).

    Example:
        >>> from torchvision.models import resnet18
        >>> model = convert(resnet18(num_classes=10), rule="all", branch_ratio=0.5, num_neighbors=9)
    """
    check_choice("rule", rule, tuple(SELECTION_RULES))
    check_ratio("branch_ratio", branch_ratio)
    check_int("num_neighbors", num_neighbors, 1)
    check_choice("attention", attention, ATTENTION_KINDS)
    check_choice("stride_form", stride_form, STRIDE_FORMS)
    conv_options, attention_options = conversion_options(options)
    conv_options.update(num_neighbors=num_neighbors, selection=rule)
    attention_options.update(num_neighbors=num_neighbors, selection=rule)

    def replacement(module: nn.Module) -> nn.Module | None:
        if _converts(module):
            return _hybrid(module, branch_ratio, stride_form, carry_weights, conv_options)
        return _attention(module, attention, attention_options)

    if (root := replacement(model)) is not None:  # the model is itself one layer
        return assign_candidate_seeds(root, candidate_seed)
    replaced, seen = [], {}
    for parent_name, parent in model.named_modules(remove_duplicate=False):
        for name, child in parent._modules.items():  # named_children() lists a module held twice only once
            if child is None or (layer := replacement(child)) is None:
                continue
            where = f"{parent_name}.{name}".lstrip(".")
            if id(child) in seen and seen[id(child)] != where:
                raise ValueError(f"{where} is the same module as {seen[id(child)]}: a layer shared by two places "
                                 "cannot be converted (its two replacements would no longer share weights)")
            seen[id(child)] = where
            replaced.append((parent, name, layer))
    for parent, name, layer in replaced:
        setattr(parent, name, layer)
    return assign_candidate_seeds(model, candidate_seed)
