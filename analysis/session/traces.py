"""The layers the explorer opens and one recorded forward pass per (model, image), and the top-5 prediction read from
it.

Each layer the explorer opens is described by a :class:`LayerInfo` (:func:`convnn.introspect.convnn_layers`), the
model's ``layer_infos`` (:attr:`analysis.session.models.LoadedModel.layer_infos`). :func:`run_trace` runs the model
once on an image with forward pre-hooks on those layers and the neighbour recorder open, and keeps the logits, each
layer's input and what each ConvNN layer selected; :func:`trace_image` caches it per (model, image), so every view of
an image starts from the same trace and a click costs no new forward pass. :func:`query_cell` and
:func:`cell_rect_px` map between model-input pixels and a layer's cells; :func:`layer_label` names a layer for the
page.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from convnn import ConvNN2d, NeighborRecord, record_neighbors
from convnn.adapters import as_self_attention, layer_input
from convnn.candidates import candidate_draw, draws_candidates, sample_keys
from convnn.functional import to_tokens
from convnn.introspect import LayerInfo
from convnn.validation import check_int

from .caching import bounded_cache
from .image_decode import InputImage
from .image_display import model_input
from .inputs import KNOB_NAMES
from .models import LoadedModel
from .renamed import renamed_keywords, renamed_module_names

MAX_DRAW = 9999  # the largest eval draw index the explorer takes: the draw box, a link, the API (METHOD §3b)

__all__ = [
    "TOP_CLASSES",
    "LayerInfo",
    "Trace",
    "cell_rect_px",
    "check_finite",
    "effective_draw",
    "knn_branch",
    "layer_conv",
    "layer_label",
    "layer_module",
    "layer_query_key",
    "query_cell",
    "run_trace",
    "top_classes",
    "trace_image",
]
__getattr__ = renamed_module_names(__name__, probe_module="layer_module")  # the old name, for one release


@renamed_keywords(probe="layer_info")
def layer_label(layer_info: LayerInfo) -> str:
    """Human label of a layer, e.g. ``"stages.0.0.conv1 · hybrid λ=0.5 K=9 · all · 32×32"`` (a map layer's stride and
    dilation when > 1: ``"… K=9 stride 2 · …"``)."""
    if layer_info.is_attention:
        what = {"mhsa": "MHSA", "kvt": f"KVT K={layer_info.num_neighbors}",
                "convnn": f"ConvNN-attention K={layer_info.num_neighbors}"}.get(layer_info.mixer, layer_info.mixer)
    else:
        if layer_info.is_hybrid:
            what = f"hybrid λ={layer_info.branch_ratio}" + (
                "" if layer_info.conv_only else f" K={layer_info.num_neighbors}")
        elif layer_info.conv_only:
            what = f"conv {layer_info.window_size}×{layer_info.window_size}"
        else:
            what = f"ConvNN2d K={layer_info.num_neighbors}"
        what += "".join(f" {name} {value}" for name, value in
                        (("stride", layer_info.stride), ("dilation", layer_info.dilation)) if value > 1)
    grid = f"{layer_info.height}×{layer_info.width}" + (" patches + CLS" if layer_info.num_prefix_tokens else "")
    return f"{layer_info.name} · {what} · {layer_info.selection} · {grid}"


@renamed_keywords(probe="layer_info")
def layer_module(model: nn.Module, layer_info: LayerInfo) -> nn.Module:
    """The module of ``layer_info`` in ``model``."""
    return model.get_submodule(layer_info.name)


@renamed_keywords(probe="layer_info")
def query_cell(layer_info: LayerInfo, row_px: int, col_px: int) -> tuple[int, int]:
    """Model-input pixel → the ``(row, col)`` cell of the layer's grid that covers it.

    Raises:
        ValueError: the pixel lies outside the ``input_size`` square.
    """
    size = layer_info.input_size
    if not (0 <= row_px < size and 0 <= col_px < size):
        raise ValueError(f"query pixel (row={row_px}, col={col_px}) is outside the {size}×{size} model input")
    return row_px * layer_info.height // size, col_px * layer_info.width // size


@renamed_keywords(probe="layer_info")
def cell_rect_px(layer_info: LayerInfo, row: int, col: int) -> tuple[int, int, int, int]:
    """The pixels a cell covers in the model input: ``(top, left, bottom, right)``, bottom/right exclusive.

    Cells outside the grid (padding) map to the same-size square outside the image. A 16×16 layer on a 32×32
    input maps cell (r, c) to rows [2r, 2r + 2) and columns [2c, 2c + 2).
    """
    size = layer_info.input_size
    return (math.floor(row * size / layer_info.height), math.floor(col * size / layer_info.width),
            math.floor((row + 1) * size / layer_info.height), math.floor((col + 1) * size / layer_info.width))


@renamed_keywords(probe="layer_info")
def layer_conv(module: nn.Module, layer_info: LayerInfo) -> nn.Conv2d | None:
    """The convolution of a map layer: a hybrid's conv branch, or a plain convolution itself; None for a
    standalone ConvNN2d, attention, or a hybrid whose conv branch is empty (λ = 1)."""
    if layer_info.is_hybrid:
        return module.conv
    return module if layer_info.conv_only else None


@renamed_keywords(probe="layer_info")
def knn_branch(module: nn.Module, layer_info: LayerInfo) -> ConvNN2d | None:
    """The ConvNN2d that selects in a map layer: a hybrid's ConvNN branch, or the standalone layer itself.

    None for a plain convolution or a conv-only hybrid (λ·C_out rounds to 0 channels).
    """
    if layer_info.conv_only:
        return None
    return module.knn if layer_info.is_hybrid else module


@dataclass(frozen=True, eq=False)
class Trace:
    """One forward pass of a model on one image (hashed by identity).

    Attributes:
        logits (Tensor): (num_classes,) float32.
        inputs (dict[str, Tensor]): layer name → its input, (1, C, H, W) for maps, (1, N, dim) for tokens.
        records (dict[str, NeighborRecord]): layer name → what the layer selected (absent for layers that select
            nothing).
        sample_keys (Tensor): (1,) int64 key of the model input and the draw, on the CPU, from which the model's
            random layers drew their candidates in eval mode (:func:`convnn.candidates.sample_keys`).
        draw (int): the eval draw index the pass ran with (METHOD §3b; 0 for a model that draws nothing).
    """

    logits: Tensor
    inputs: dict[str, Tensor]
    records: dict[str, NeighborRecord]
    sample_keys: Tensor
    draw: int = 0


@renamed_keywords(probes="layer_infos")
def run_trace(model: nn.Module, layer_infos: tuple[LayerInfo, ...], x: Tensor, draw: int = 0) -> Trace:
    """Run ``model`` on ``x`` once, capturing each layer's input and what each ConvNN layer selected.

    Uncached; :func:`analysis.session.traces.trace_image` caches it per (model, image).

    Args:
        model (nn.Module): the model, eval mode.
        layer_infos (tuple[LayerInfo, ...]): its layers (:func:`convnn.introspect.convnn_layers`).
        x (Tensor): (1, 3, S, S) float32 model input on the model's device.
        draw (int): the eval draw index of the model's random layers (:func:`convnn.candidates.candidate_draw`).
            Default: 0

    Returns:
        Trace: logits, layer inputs and recorded selections.
    """
    inputs: dict[str, Tensor] = {}

    def hook(name: str):
        def capture(module: nn.Module, args: tuple, kwargs: dict) -> None:
            inputs[name] = layer_input(module, args, kwargs).detach()
        return capture

    handles = [layer_module(model, layer_info).register_forward_pre_hook(hook(layer_info.name), with_kwargs=True)
               for layer_info in layer_infos]
    try:
        with torch.no_grad(), record_neighbors(model) as records, candidate_draw(draw):
            logits = model(x)[0].float()
    finally:
        for handle in handles:
            handle.remove()
    selected = {layer_info.name: records[layer_info.record_name][0] for layer_info in layer_infos
                if layer_info.record_name and records.get(layer_info.record_name)}
    return Trace(logits, inputs, selected, sample_keys(x, draw).cpu(), draw)


@renamed_keywords(probe="layer_info")
def layer_query_key(module: nn.Module, layer_info: LayerInfo, x: Tensor) -> tuple[Tensor, Tensor]:
    """The query and key features the layer's own selection scores, as tokens, every head at once.

    For a ConvNN branch: its input (+ coordinate channels) or its learned q/k projections; for a convolution (plain,
    or a conv-only hybrid): the input itself; for attention: the q, k projections of every head
    (:func:`convnn.adapters.as_self_attention` for ``nn.MultiheadAttention`` and timm-style attention).

    Args:
        module (nn.Module): the layer's module.
        layer_info (LayerInfo): its description.
        x (Tensor): its captured input, (1, C, H, W) or (1, N, dim).

    Returns:
        tuple[Tensor, Tensor]: ``q`` and ``k``, each (1, h, N, D) float32, h = :attr:`LayerInfo.num_heads` (1 for
        maps), N = :attr:`LayerInfo.num_tokens` (prefix tokens first, then the grid in raster order).
    """
    with torch.no_grad():
        if layer_info.is_attention:
            q, k, _ = as_self_attention(module).project_qkv(x)  # (B, h, N, d) each
            return q.float(), k.float()
        knn = knn_branch(module, layer_info)
        q_map, k_map = (x, x) if knn is None else knn.query_key_features(x)
        return to_tokens(q_map).float(), to_tokens(k_map).float()


TOP_CLASSES = 5
_TRACE_CACHE_SIZE = 16  # (model, image) passes kept; each holds every layer's input (≈1 MB for CIFAR models)


def effective_draw(loaded: LoadedModel, draw: int) -> int:
    """The eval draw index that changes what ``loaded`` computes: ``draw`` for a model with random candidates, 0 for
    any other (whose every draw is the same), so the caches keep one entry for it (METHOD §3b).

    Raises:
        ValueError: ``draw`` is not an integer in [0, :data:`MAX_DRAW`] (the explorer's draws: the box's, a link's
            and the API's alike).
    """
    check_int(KNOB_NAMES["draw"], draw, 0, MAX_DRAW)
    return draw if draws_candidates(loaded.model) else 0


def trace_image(loaded: LoadedModel, image: InputImage, draw: int = 0) -> Trace:
    """The recorded forward pass of ``loaded`` on ``image`` with eval draw ``draw`` (cached per model identity, image
    digest and :func:`effective_draw`).

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image; resized and normalised as in training
            (:func:`analysis.session.image_display.model_input`).
        draw (int): the eval draw index of a model with random candidates (METHOD §3b). Default: 0

    Returns:
        Trace: logits, every layer's input, and each ConvNN layer's recorded selection.

    Raises:
        ValueError: a number of the pass (the normalised input, a layer's input, what a layer selected, the
            class scores) is inf or NaN, refused naming the model (:func:`check_finite`: every view of the image
            starts here, so none answers with such numbers); the model gives another number of class scores than
            its card names classes (so no class name is ever looked up past the card's list), or a ``draw`` that is
            not an integer ≥ 0.
    """
    return _trace(loaded, image, effective_draw(loaded, draw))


@bounded_cache(_TRACE_CACHE_SIZE)
def _trace(loaded: LoadedModel, image: InputImage, draw: int) -> Trace:
    """:func:`trace_image` for an effective ``draw``: the boundary every view of an image starts from, so the one
    place its numbers are checked finite (:func:`check_finite`)."""
    x = model_input(image, loaded.card).to(loaded.device)
    check_finite(loaded, {"the normalised input (the card's mean/std)": x})
    with loaded.lock:
        trace = run_trace(loaded.model, loaded.layer_infos, x, draw)
    if trace.logits.numel() != len(loaded.card.classes):
        raise ValueError(f"{loaded.card.name}: the model gives {trace.logits.numel()} class scores but its card names "
                         f"{len(loaded.card.classes)} classes: the card does not belong to these weights")
    recorded = {f"what {name} selected": getattr(record, item.name) for name, record in trace.records.items()
                for item in dataclasses.fields(record) if isinstance(getattr(record, item.name), Tensor)}
    check_finite(loaded, {**{f"the input of {name}": value for name, value in trace.inputs.items()}, **recorded,
                          "the class scores": trace.logits})
    return trace


def check_finite(loaded: LoadedModel, values: dict[str, Tensor], on_image: bool = True) -> None:
    """Refuse an answer of ``loaded`` holding an inf or NaN: ``values`` (what it is → the numbers), checked in order.
    The one check every answer's numbers pass: the recorded forward pass each view of an image starts from
    (:func:`trace_image`), and the numbers computed beside it (the weights view, an attribution's own passes, the
    other eval draws).

    Args:
        loaded (LoadedModel): the model answering.
        values (dict[str, Tensor]): what each tensor is (named in the message) → the tensor; integer ones pass.
        on_image (bool): whether the numbers were computed on an image (then its colours and the card's mean/std may
            be the cause, and the message says so) rather than from the weights alone. Default: True

    Raises:
        ValueError: the first that is not finite, named with the model: the answer is refused, not shown.
    """
    where, cause = ((" on this image", "its weights or its card's mean/std overflow float32 on these colours")
                    if on_image else ("", "its weights overflow float32"))
    for what, value in values.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{loaded.card.name} gives numbers that are not finite (inf or NaN){where}, in {what}: "
                             f"{cause}, so its answers are refused")


def top_classes(loaded: LoadedModel, image: InputImage, count: int = TOP_CLASSES, draw: int = 0
                ) -> dict[str, float]:
    """The ``count`` most probable classes with their softmax probabilities, most probable first, in eval draw
    ``draw`` (METHOD §3b; the same for every draw of a model without random candidates).

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        count (int): how many classes (clipped to the number of classes). Default: 5
        draw (int): the eval draw of a model with random candidates (:func:`trace_image`). Default: 0

    Returns:
        dict[str, float]: class name → probability in [0, 1], in descending order.

    Raises:
        ValueError: as :func:`trace_image` (also a ``draw`` that is not an integer ≥ 0).
    """
    logits = trace_image(loaded, image, draw).logits
    probabilities = torch.softmax(logits, dim=0)
    values, indices = probabilities.topk(min(count, probabilities.numel()))
    return {loaded.card.classes[i]: float(v) for v, i in zip(values.tolist(), indices.tolist(), strict=True)}
