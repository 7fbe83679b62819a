"""What a model costs, computed from its arguments without building it: so a card can be refused before any module
exists (a card of a few hundred bytes can ask for ``depths=[1000, 1000, 1000]``, which takes a minute to build).

Each registered model of this library has a cost function (``register_model(cost=...)``) taking the card's input
size and the model's keyword arguments and returning a :class:`ModelCost`:

* ``values``: parameters and buffers, i.e. the numbers in the state dict — exact;
* ``modules``: ``len(list(model.modules()))`` — exact (what building costs grows with it);
* ``flops``: multiply-adds for one image at that input size, counting convolutions, linear layers, ConvNN
  aggregation and the scores each selection rule computes (exhaustive rules score N² pairs on the reference path);
* ``activations``: values one image's forward pass produces, layer outputs plus score matrices — an estimate of
  peak memory, within a small factor.

The arguments that set these numbers are checked here (integers where the constructors need them); everything else
is left to the constructor, which a card only reaches once its cost is within budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..conversion import STRIDE_FORMS, conversion_options
from ..functional import window_geometry
from ..selection import selection_rule
from ..validation import check_choice, check_int, check_nonnegative, check_positive, check_ratio

__all__ = ["ModelCost", "converted_resnet18_cost", "resnet50_cost", "resnet_cifar_cost", "torchvision_resnet18_cost",
           "torchvision_vit_cost", "vit_cost"]

_TORCHVISION_RESNET50 = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (planes, blocks, stride) per stage
_BOTTLENECK_EXPANSION = 4
_MAX_STAGES = 64  # a resolution halves per stage: past ~10 the map is one pixel; bounds this function's own loop


@dataclass(frozen=True)
class ModelCost:
    """The cost of one model at one input size (module docstring).

    Attributes:
        values (int): numbers in the state dict (parameters and buffers).
        modules (int): ``nn.Module`` instances.
        flops (int): multiply-adds for one image.
        activations (int): values one image's forward pass produces (outputs and score matrices).
    """

    values: int
    modules: int
    flops: int
    activations: int

    def __add__(self, other: ModelCost) -> ModelCost:
        return ModelCost(self.values + other.values, self.modules + other.modules, self.flops + other.flops,
                         self.activations + other.activations)


_NONE = ModelCost(0, 0, 0, 0)


def _sum(costs) -> ModelCost:
    total = _NONE
    for cost in costs:
        total = total + cost
    return total


def _batch_norm(channels: int, pixels: int) -> ModelCost:
    """BatchNorm2d: weight, bias, running mean and var, num_batches_tracked."""
    return ModelCost(4 * channels + 1, 1, channels * pixels, channels * pixels)


def _conv(c_in: int, c_out: int, kernel: int, pixels: int, bias: bool = False) -> ModelCost:
    values = c_in * c_out * kernel * kernel + (c_out if bias else 0)
    return ModelCost(values, 1, c_in * c_out * kernel * kernel * pixels, c_out * pixels)


def _linear(d_in: int, d_out: int, rows: int = 1) -> ModelCost:
    return ModelCost(d_in * d_out + d_out, 1, d_in * d_out * rows, d_out * rows)


def _simple(count: int = 1) -> ModelCost:
    """Modules without state (activations, pooling, containers)."""
    return ModelCost(0, count, 0, 0)


def _times(cost: ModelCost, count: int) -> ModelCost:
    return ModelCost(cost.values * count, cost.modules * count, cost.flops * count, cost.activations * count)


def _selection_scores(selection: str, tokens: int, keys: int, num_candidates: int | None) -> int:
    """Query–key scores one map computes under a selection rule (per head): N·keys for exhaustive rules, N·(r + 1)
    for rules that draw candidates, none otherwise.

    Raises:
        ValueError: an unknown selection (:func:`convnn.selection.selection_rule`).
    """
    rule = selection_rule(selection)
    if rule.exhaustive:
        return tokens * keys
    if "num_candidates" in rule.reads and num_candidates is not None:
        return tokens * (min(num_candidates, tokens) + 1)
    return 0


def _convnn2d(c_in: int, c_out: int, side: tuple[int, int], *, num_neighbors: int | None = None,
              selection: str = "all", num_candidates: int | None = None, window_size: int | None = None,
              kernel_size=None, stride=1, padding="same", dilation=1, padding_mode: str = "zeros",
              candidate_padding: bool = False, qk_dim: int | None = None, coord_channels: bool = False,
              groups: int = 1, bias: bool = True, **_) -> ModelCost:
    """A ConvNN2d on an H×W map: its Conv1D, learned q/k projections, the scores its rule computes (a fused rule
    selects for every cell of its candidate map, the window rule for the queries only: METHOD §3a).

    Raises:
        ValueError: a size that is not a positive integer, or a geometry :func:`~convnn.functional.window_geometry`
            refuses or that leaves no output.
    """
    if window_size is not None:
        check_int("window_size", window_size, 1)
    geometry = window_geometry(kernel_size if kernel_size is not None else window_size or 3, stride, padding,
                               dilation, padding_mode)
    num_neighbors = geometry.window_size**2 if num_neighbors is None else num_neighbors
    check_int("num_neighbors", num_neighbors, 1)
    check_int("groups", groups, 1)
    if qk_dim is not None:
        check_int("qk_dim", qk_dim, 1)
    if num_candidates is not None:
        check_int("num_candidates", num_candidates, 1)
    height, width = side
    out_height, out_width = geometry.output_size(height, width)
    rule = selection_rule(selection)
    extra = geometry.padding if candidate_padding else 0
    selecting = out_height * out_width if rule.gathers else (height + 2 * extra) * (width + 2 * extra)
    features = qk_dim or c_in + (2 if coord_channels else 0)
    blend_pad = geometry.window_size // 2
    keys = (height + 2 * blend_pad) * (width + 2 * blend_pad) if rule.needs_grid else selecting
    scores = _selection_scores(selection, selecting, keys, num_candidates)
    weight = c_out * (c_in // groups) * num_neighbors
    projections = 2 * (c_in + (2 if coord_channels else 0)) * qk_dim if qk_dim else 0
    return ModelCost(weight + (c_out if bias else 0) + projections, 1 + (2 if qk_dim else 0),
                     weight * selecting + scores * features + projections * height * width,
                     c_out * selecting + selecting * num_neighbors * (c_in + 2)
                     + scores * (2 if selection == "blend" else 1))


def _hybrid(c_in: int, c_out: int, side: tuple[int, int], branch_ratio: float, bias: bool,
            options: dict) -> tuple[ModelCost, tuple[int, int]]:
    """HybridConvNN2d (conv branch, ConvNN branch, 1×1 mix) on an H×W map, ``options`` its keyword arguments
    (geometry and ConvNN options); returns its cost and its output (H_out, W_out)."""
    check_ratio("branch_ratio", branch_ratio)
    options = dict(options)
    kernel_size, window = options.pop("kernel_size", 3), options.pop("window_size", None)
    geometry_args = {name: options.pop(name) for name in ("stride", "padding", "dilation", "padding_mode")
                     if name in options}
    geometry = window_geometry(kernel_size, **geometry_args)
    out = geometry.output_size(*side)
    pixels = out[0] * out[1]
    knn_channels = round(branch_ratio * c_out)
    cost = _simple() + _conv(c_out, c_out, 1, pixels, bias=True)  # itself, the mix
    if knn_channels:
        padding = "same" if geometry_args.get("padding", "same") == "same" else geometry.padding
        cost = cost + _convnn2d(c_in, knn_channels, side, bias=bias, kernel_size=window or geometry.window_size,
                                stride=geometry.stride, padding=padding, dilation=geometry.dilation, **options)
    if c_out - knn_channels:
        cost = cost + _conv(c_in, c_out - knn_channels, geometry.window_size, pixels, bias=bias)
    return cost, out


def _check_sizes(name: str, values, low: int) -> list[int]:
    if not isinstance(values, list | tuple) or not values:
        raise ValueError(f"{name} must be a non-empty list of integers, got {values!r}")
    for value in values:
        check_int(name, value, low)
    return list(values)


def resnet_cifar_cost(input_size: int, *, widths=(64, 128, 256), depths=(1, 1, 1), branch_ratio: float = 0.5,
                      num_classes: int = 10, in_chans: int = 3, candidate_seed: int = 0, **convnn_options
                      ) -> ModelCost:
    """The cost of :class:`~convnn.models.ResNetCifar` at ``input_size``² pixels (module docstring).

    Raises:
        ValueError: widths or depths that are not non-empty lists of integers (≥ 1, resp. ≥ 0) of one length, or a
            size-setting option that is not a positive integer.
    """
    widths, depths = _check_sizes("widths", widths, 1), _check_sizes("depths", depths, 0)
    if len(widths) != len(depths) or len(widths) > _MAX_STAGES:
        raise ValueError(f"widths and depths must have the same length, at most {_MAX_STAGES}, got {len(widths)} "
                         f"and {len(depths)}")
    check_int("num_classes", num_classes, 1)
    check_int("in_chans", in_chans, 1)
    side = input_size
    cost = _simple(3) + _conv(in_chans, widths[0], 3, side * side) + _batch_norm(widths[0], side * side)  # root, stem
    for stage, (width, depth) in enumerate(zip(widths, depths, strict=True)):
        pixels = side * side
        hybrid, _ = _hybrid(width, width, (side, side), branch_ratio, False, convnn_options)
        # ResidualBlock, its act1 Sequential and two GELUs; two hybrid layers; two BatchNorms
        block = _sum([_simple(4), hybrid, hybrid, _batch_norm(width, pixels), _batch_norm(width, pixels)])
        cost = cost + _simple() + _times(block, depth)  # the stage's Sequential
        if stage + 1 < len(widths):
            down, _ = _hybrid(width, widths[stage + 1], (side, side), branch_ratio, False, convnn_options)
            side //= 2
            cost = cost + down + _simple(3) + _batch_norm(widths[stage + 1], side * side)  # Sequential, pool, GELU
    return cost + _simple() + _linear(widths[-1], num_classes)  # stages' Sequential, head


def resnet50_cost(input_size: int, *, branch_ratio: float = 0.5, num_classes: int = 1000, num_neighbors: int = 16,
                  candidate_seed: int = 0, **convnn_options) -> ModelCost:
    """The cost of :func:`~convnn.models.convnn_resnet50` at ``input_size``² pixels (module docstring).

    Raises:
        ValueError: a size-setting argument that is not a positive integer.
    """
    check_int("num_classes", num_classes, 1)
    options = dict(convnn_options, num_neighbors=num_neighbors)
    side = math.ceil(input_size / 2)  # conv1, stride 2
    cost = _simple(4) + _conv(3, 64, 7, side * side) + _batch_norm(64, side * side)  # root, ReLU, max- and avg-pool
    side = math.ceil(side / 2)
    inplanes = 64
    for planes, blocks, stride in _TORCHVISION_RESNET50:
        cost = cost + _simple()  # the layer's Sequential
        for block in range(blocks):
            strided = stride == 2 and block == 0
            pixels, out_side = side * side, side // 2 if strided else side
            out_pixels, wide = out_side * out_side, planes * _BOTTLENECK_EXPANSION
            cost = cost + _sum([_simple(2), _conv(inplanes, planes, 1, pixels), _batch_norm(planes, pixels),
                                _hybrid(planes, planes, (side, side), branch_ratio, False, options)[0],
                                _batch_norm(planes, out_pixels), _conv(planes, wide, 1, out_pixels),
                                _batch_norm(wide, out_pixels)])  # block, ReLU
            if strided:
                cost = cost + _simple(2)  # HybridDownsample (a Sequential) and its average pooling
            if block == 0:
                cost = cost + _simple() + _conv(inplanes, wide, 1, out_pixels) + _batch_norm(wide, out_pixels)
            inplanes, side = wide, out_side
    return cost + _linear(inplanes, num_classes)


def vit_cost(input_size: int, *, img_size: int = 32, patch_size: int = 4, in_chans: int = 3, num_classes: int = 10,
             dim: int = 128, depth: int = 6, num_heads: int = 4, mlp_ratio: float = 4.0, attention: str = "mhsa",
             drop_path_rate: float = 0.0, candidate_seed: int = 0, num_neighbors: int = 16, selection: str = "all",
             num_candidates: int | None = None, **_) -> ModelCost:
    """The cost of :class:`~convnn.models.VisionTransformer` (its own ``img_size``; the card's input size must
    match it, which the model checks when it runs).

    Raises:
        ValueError: a size-setting argument that is not a positive integer (a finite number > 0 for mlp_ratio).
    """
    for name, value in (("img_size", img_size), ("patch_size", patch_size), ("in_chans", in_chans),
                        ("num_classes", num_classes), ("dim", dim), ("depth", depth), ("num_heads", num_heads),
                        ("num_neighbors", num_neighbors)):
        check_int(name, value, 0 if name == "depth" else 1)
    check_positive("mlp_ratio", mlp_ratio)
    tokens = (img_size // patch_size) ** 2 + 1
    hidden = int(dim * mlp_ratio)
    if attention == "mhsa":
        scores = tokens * tokens
    else:
        scores = _selection_scores(selection, tokens, tokens, num_candidates) + tokens * num_neighbors
    mixer = _linear(dim, 3 * dim, tokens) + _linear(dim, dim, tokens) + ModelCost(
        0 if attention == "mhsa" else dim * num_neighbors, 1, scores * dim, scores * num_heads)
    norm = ModelCost(2 * dim, 1, dim * tokens, dim * tokens)
    # Block, its MLP's Sequential and GELU, DropPath; two LayerNorms; the token mixer; the MLP's two Linears
    block = _sum([_simple(4), norm, norm, mixer, _linear(dim, hidden, tokens), _linear(hidden, dim, tokens)])
    blocks = _times(block, depth)
    embed = _conv(in_chans, dim, patch_size, (img_size // patch_size) ** 2, bias=True)
    return (_simple(2) + embed + ModelCost(dim + tokens * dim, 0, 0, tokens * dim) + blocks + norm
            + _linear(dim, num_classes))


_TORCHVISION_RESNET18 = ((64, 1), (128, 2), (256, 2), (512, 2))  # (planes, stride) per stage, two blocks each
_MAX_SIDE = 100_000  # pixels a torchvision ViT's image_size (and patch) may name: bounds the arithmetic below


def _plain_3x3(c_in: int, c_out: int, side: int, stride: int) -> tuple[ModelCost, int]:
    """A torchvision 3×3 convolution (padding 1, no bias) on a side² map: its cost and output side."""
    out_side = (side - 1) // stride + 1
    return _conv(c_in, c_out, 3, out_side * out_side), out_side


def _resnet18(input_size: int, num_classes: int, conv3x3) -> ModelCost:
    """torchvision's ResNet-18 at ``input_size``² pixels with each 3×3 convolution costed by
    ``conv3x3(c_in, c_out, side, stride) -> (cost, output side)``."""
    check_int("num_classes", num_classes, 1)
    side = (input_size + 1) // 2  # conv1: 7×7, stride 2, padding 3
    cost = _simple(3) + _conv(3, 64, 7, side * side) + _batch_norm(64, side * side)  # root, ReLU, max-pool
    side = (side + 1) // 2  # max-pool: 3×3, stride 2, padding 1
    inplanes = 64
    for planes, stride in _TORCHVISION_RESNET18:
        cost = cost + _simple()  # the layer's Sequential
        for block in range(2):
            strided = stride == 2 and block == 0
            first, out_side = conv3x3(inplanes, planes, side, 2 if strided else 1)
            second, _ = conv3x3(planes, planes, out_side, 1)
            pixels = out_side * out_side
            cost = cost + _sum([_simple(2), first, _batch_norm(planes, pixels), second,
                                _batch_norm(planes, pixels)])  # block, ReLU
            if strided:  # downsample: Sequential(1×1 conv, BatchNorm)
                down_side = (side + 1) // 2
                cost = (cost + _simple() + _conv(inplanes, planes, 1, down_side * down_side)
                        + _batch_norm(planes, down_side * down_side))
            inplanes, side = planes, out_side
    return cost + _simple() + _linear(inplanes, num_classes)  # average pool, fc


def torchvision_resnet18_cost(input_size: int, *, num_classes: int = 1000) -> ModelCost:
    """The cost of ``torchvision.models.resnet18(num_classes=…)`` (random weights) at ``input_size``² pixels.

    Raises:
        ValueError: ``num_classes`` not a positive integer.
        TypeError: any other argument (``weights`` would download: no argument but ``num_classes`` is taken).
    """
    return _resnet18(input_size, num_classes, _plain_3x3)


def converted_resnet18_cost(input_size: int, *, num_classes: int = 1000, rule: str = "all",
                            branch_ratio: float = 0.5, num_neighbors: int = 9, stride_form: str = "query",
                            candidate_seed: int = 0, **options) -> ModelCost:
    """The cost of :func:`convnn.convert` of torchvision's ResNet-18 at ``input_size``² pixels: each 3×3 a hybrid
    layer with the convolution's stride (``stride_form="query"``) or at stride 1 with 2×2 average pooling
    (``"pool"``), ``options`` its ConvNN options.

    Raises:
        ValueError: a size that is not a positive integer, an unknown ``stride_form`` or rule, a λ outside [0, 1],
            or a geometry the layers refuse (e.g. a 3×3 of a map too small for it).
        TypeError: an option :func:`convnn.convert` refuses (:func:`convnn.conversion.conversion_options`).
    """
    check_choice("stride_form", stride_form, STRIDE_FORMS)
    knn = dict(conversion_options(options)[0], num_neighbors=num_neighbors, selection=rule)

    def hybrid(c_in: int, c_out: int, side: int, stride: int) -> tuple[ModelCost, int]:
        pooled = stride_form == "pool" and stride > 1
        cost, (out_side, _) = _hybrid(c_in, c_out, (side, side), branch_ratio, False,
                                      dict(knn, stride=1 if pooled else stride, padding=1))
        return (cost + _simple(2), out_side // stride) if pooled else (cost, out_side)  # HybridDownsample, pool

    return _resnet18(input_size, num_classes, hybrid)


def torchvision_vit_cost(input_size: int, *, image_size: int = 224, patch_size: int = 16, num_layers: int = 12,
                         num_heads: int = 12, hidden_dim: int = 768, mlp_dim: int = 3072, num_classes: int = 1000,
                         dropout: float = 0.0, attention_dropout: float = 0.0) -> ModelCost:
    """The cost of ``torchvision.models.VisionTransformer(…)`` (random weights) at its ``image_size``.

    Raises:
        ValueError: a size that is not a positive integer (``num_layers`` ≥ 0; sides ≤ 100,000 pixels), a dropout
            outside [0, 1), an ``image_size`` that the patches do not tile or that is not the card's input size, or a
            ``hidden_dim`` that is not a multiple of ``num_heads`` (torchvision would fail an assertion).
        TypeError: any other argument (``norm_layer``, ``conv_stem_configs``: no callables from a card).
    """
    for name, value in (("image_size", image_size), ("patch_size", patch_size), ("num_layers", num_layers),
                        ("num_heads", num_heads), ("hidden_dim", hidden_dim), ("mlp_dim", mlp_dim),
                        ("num_classes", num_classes)):
        check_int(name, value, 0 if name == "num_layers" else 1, _MAX_SIDE if name.endswith("size") else math.inf)
    for name, value in (("dropout", dropout), ("attention_dropout", attention_dropout)):
        check_nonnegative(name, value, below=1.0)
    if image_size % patch_size or image_size != input_size:
        raise ValueError(f"image_size must be a multiple of patch_size ({patch_size}) and equal the card's input_size "
                         f"({input_size}), got {image_size}")
    if hidden_dim % num_heads:
        raise ValueError(f"hidden_dim must be a multiple of num_heads ({num_heads}), got {hidden_dim}")
    patches = (image_size // patch_size) ** 2
    tokens, dim = patches + 1, hidden_dim
    norm = ModelCost(2 * dim, 1, dim * tokens, dim * tokens)
    attention = _linear(dim, 3 * dim, tokens) + _linear(dim, dim, tokens) + ModelCost(
        0, 0, 2 * tokens * tokens * dim, tokens * tokens * num_heads)  # in_proj + out_proj, scores
    # EncoderBlock and its dropout; two LayerNorms; attention; the MLPBlock (a Sequential, its GELU and 2 dropouts)
    block = _sum([_simple(2), norm, norm, attention, _simple(4), _linear(dim, mlp_dim, tokens),
                  _linear(mlp_dim, dim, tokens)])
    embed = _conv(3, dim, patch_size, patches, bias=True)
    # root, encoder (and its dropout and Sequential), class token and position embedding, heads' Sequential
    return (_simple(5) + embed + ModelCost(dim + tokens * dim, 0, 0, tokens * dim) + _times(block, num_layers) + norm
            + _linear(dim, num_classes))
