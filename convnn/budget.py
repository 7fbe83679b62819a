"""What a model card may cost, checked before any memory is spent on its model: a card is a few hundred bytes anyone
can upload, and its ``model_args`` could ask for gigabytes or a minute of building.

Two stages. :func:`check_cost` bounds the model from the card's arguments alone, without building anything
(:mod:`convnn.models.cost`: state-dict values, modules, multiply-adds and activations per image). Then
:func:`check_model` builds the model on the ``meta`` device (shapes, no storage), traces one input of the card's size
through it and checks what only shapes show: the token count of each exhaustive ConvNN layer and the logits.
:func:`convnn.checkpoint.load_checkpoint` runs both before it builds the real model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .card import CheckpointError, ModelCard
from .layers import ConvNN2d, ConvNNAttention
from .models import create_model, model_cost
from .selection import selection_rule

__all__ = ["MAX_ACTIVATIONS", "MAX_EXHAUSTIVE_TOKENS", "MAX_FLOPS", "MAX_MODULES", "MAX_PARAMETERS", "build_on_meta",
           "check_cost", "check_model"]

# Tokens N a layer that scores every candidate (ConvNN2d "all"/"blend", k-NN attention "all") may see: its reference
# path holds N² fp32 scores per image, 64 MB at 4096 (ImageNet presets at 224 px: 3136; CIFAR models: ≤ 1024).
MAX_EXHAUSTIVE_TOKENS = 4096
# Values (parameters and buffers) a card's model may hold, checked on the meta device before the model is built: a
# card is a few hundred bytes anyone can upload, and its model_args could ask for gigabytes. The largest preset,
# ViT-B/16 (imagenet-vit-b16-convnn), holds 86.8 M; 100 M is 400 MB in fp32.
MAX_PARAMETERS = 100_000_000
# The rest of a card's budget, checked from its arguments before anything is built (convnn.models.cost). Modules:
# building takes time per module (ResNet-50 hybrid: 205, ViT-B/16: 152). Multiply-adds per image (ViT-B/16 at 224 px:
# 17 G; ResNet-50 hybrid with exhaustive K = 16: 10 G). Activation values per image (ResNet-50 hybrid: 98 M, 0.4 GB
# in fp32; 300 M is 1.2 GB).
MAX_MODULES = 2_000
MAX_FLOPS = 50_000_000_000
MAX_ACTIVATIONS = 300_000_000

def check_cost(card: ModelCard, source: str) -> None:
    """Refuse a card whose model costs more than the budget, from its arguments alone (nothing is built).

    Raises:
        CheckpointError: ``model_args`` the model's cost function refuses (or overflows on), or a cost over
            :data:`MAX_PARAMETERS` state-dict values, :data:`MAX_MODULES` modules, :data:`MAX_FLOPS` multiply-adds
            or :data:`MAX_ACTIVATIONS` activation values per image; the message gives the number and the limit.
    """
    try:
        cost = model_cost(card.model, card.input_size, **card.model_args)
    except (ValueError, TypeError, OverflowError) as err:  # OverflowError: an mlp_ratio of 1e308 times a width
        raise CheckpointError(f"{source}: cannot build model {card.model!r} ({err})") from err
    if cost is None:  # registered without a cost function: the meta-device build below bounds it
        return
    for what, value, limit in (("parameters and buffers", cost.values, MAX_PARAMETERS),
                               ("modules", cost.modules, MAX_MODULES),
                               ("multiply-adds per image", cost.flops, MAX_FLOPS),
                               ("activation values per image", cost.activations, MAX_ACTIVATIONS)):
        if value > limit:
            raise CheckpointError(f"{source}: model {card.model!r} as the card describes it would have {_count(value)} "
                                  f"{what} at input_size {card.input_size}, more than the {limit:,} a checkpoint "
                                  "may have (refused before building it)")


def _count(value: int) -> str:
    """A count for a message: with thousands separators, or its order of magnitude past 10¹⁸ (a width of 10³⁰⁰
    gave a count of 600 digits)."""
    return f"{value:,}" if value < 10**18 else f"about 10^{len(str(value)) - 1}"


def build_on_meta(card: ModelCard, source: str = "card") -> nn.Module:
    """The model ``card`` describes, built on the ``meta`` device (shapes, no storage) in eval mode, once its cost
    is within the budget (:func:`check_cost`): what a caller may inspect of an untrusted card's model.

    Raises:
        CheckpointError: a cost over the budget, or a model that cannot be built from the card (an unknown model,
            arguments it does not take or refuses); the message names ``source``.
    """
    check_cost(card, source)
    try:
        with torch.device("meta"):
            return create_model(card.model, **card.model_args).eval()
    except (ValueError, TypeError, RuntimeError, OverflowError) as err:
        raise CheckpointError(f"{source}: cannot build model {card.model!r} ({err})") from err


def check_model(card: ModelCard, source: str) -> None:
    """Refuse the model ``card`` describes before any real memory is spent on it.

    The model is built on the ``meta`` device (shapes, no storage), so a card of a few hundred bytes cannot make the
    loader allocate gigabytes: its state dict must hold at most :data:`MAX_PARAMETERS` values. Then every ConvNN
    layer's forward is replaced by one that only records the token count N of its input and returns an empty output
    of the right shape (the reference path does not run on ``meta``), and the model runs on a (1, 3, S, S) input,
    S = ``card.input_size``: shapes only, no arithmetic, for every model.

    Args:
        card (ModelCard): a checked card.
        source (str): the card file, for messages.

    Before anything is built, the card's cost is checked from its arguments alone (:func:`check_cost`).

    Raises:
        CheckpointError: a cost over the budget (:func:`check_cost`); the model cannot be built from the card (an
            unknown model, arguments it does not take or refuses); its state dict holds more than MAX_PARAMETERS
            values (the message gives both numbers); it does not run on the card's input size; a ConvNN layer with
            ``selection`` in ``("all", "blend")`` sees N > :data:`MAX_EXHAUSTIVE_TOKENS` tokens there (the message
            names the layer, N and the limit); or its output for one image is not (1, C) logits with
            C = ``len(card.classes)`` (the message gives both).
    """
    model = build_on_meta(card, source)
    size = sum(tensor.numel() for tensor in model.state_dict().values())
    if size > MAX_PARAMETERS:
        raise CheckpointError(f"{source}: model {card.model!r} built from the card holds {size:,} parameters, more "
                              f"than the {MAX_PARAMETERS:,} a checkpoint may have")
    tokens: dict[str, int] = {}

    def shape_only(name: str, layer: nn.Module) -> Callable[..., torch.Tensor]:
        def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            if isinstance(layer, ConvNN2d):  # (B, C_in, H, W) → (B, C_out, H_out, W_out); selects on its candidates
                height, width = layer.candidate_grid(x.shape[2], x.shape[3])
                tokens[name] = height * width
                return x.new_empty(x.shape[0], layer.out_channels, *layer.geometry.output_size(*x.shape[2:]))
            tokens[name] = x.shape[1]  # attention: (B, N, dim) → (B, N, dim)
            return x.new_empty(x.shape)
        return forward

    for name, layer in model.named_modules():
        if isinstance(layer, ConvNN2d | ConvNNAttention):
            layer.forward = shape_only(name, layer)
    side = card.input_size
    try:
        with torch.no_grad():
            logits = model(torch.empty(1, 3, side, side, device="meta"))
    except (ValueError, RuntimeError) as err:
        raise CheckpointError(f"{source}: the model does not run on a {side}×{side} input (input_size): {err}") from err
    for name, layer in model.named_modules():
        exhaustive = name in tokens and selection_rule(layer.selection).exhaustive
        if exhaustive and tokens[name] > MAX_EXHAUSTIVE_TOKENS:
            raise CheckpointError(f"{source}: at input_size {side}, layer {name} (selection={layer.selection!r}) "
                                  f"scores all N = {tokens[name]} tokens against each other, more than the "
                                  f"{MAX_EXHAUSTIVE_TOKENS} allowed (N² scores per image): use a smaller input_size")
    classes = len(card.classes)
    shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
    if shape != (1, classes):
        raise CheckpointError(f"{source}: the card names {classes} classes, but the model built from it outputs "
                              f"{shape} for one image, not (1, {classes}) logits")
