"""One cached forward pass per (model, image), and the top-5 prediction read from it.

Every view of an image (prediction, neighbours, weights, λ mix, spectrum, multi-hop) starts from the same
:class:`~analysis.probes.Trace`, so a click costs no new forward pass.
"""

from __future__ import annotations

import torch

from .caching import bounded_cache
from .checkpoints import LoadedModel
from .images import InputImage, model_input
from .probes import Trace, run_trace

__all__ = ["TOP_CLASSES", "top_classes", "trace_image"]

TOP_CLASSES = 5
_TRACE_CACHE_SIZE = 16  # (model, image) passes kept; each holds every probe layer's input (≈1 MB for CIFAR models)


@bounded_cache(_TRACE_CACHE_SIZE)
def trace_image(loaded: LoadedModel, image: InputImage) -> Trace:
    """The recorded forward pass of ``loaded`` on ``image`` (cached per model identity and image digest).

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image; resized and normalised as in training (:func:`analysis.images.model_input`).

    Returns:
        Trace: logits, every probe layer's input, and each ConvNN layer's recorded selection.

    Raises:
        ValueError: the model gives another number of class scores than its card names classes (so no class name
            is ever looked up past the card's list).
    """
    x = model_input(image, loaded.card).to(loaded.device)
    with loaded.lock:
        trace = run_trace(loaded.model, loaded.probes, x)
    if trace.logits.numel() != len(loaded.card.classes):
        raise ValueError(f"{loaded.card.name}: the model gives {trace.logits.numel()} class scores but its card names "
                         f"{len(loaded.card.classes)} classes: the card does not belong to these weights")
    return trace


def top_classes(loaded: LoadedModel, image: InputImage, count: int = TOP_CLASSES) -> dict[str, float]:
    """The ``count`` most probable classes with their softmax probabilities, most probable first.

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        count (int): how many classes (clipped to the number of classes). Default: 5

    Returns:
        dict[str, float]: class name → probability in [0, 1], in descending order.

    Raises:
        ValueError: a logit is inf or NaN (broken weights, or a card whose mean/std overflow the input), or a class
            count that does not match the card (:func:`trace_image`).
    """
    logits = trace_image(loaded, image).logits
    if not torch.isfinite(logits).all():
        raise ValueError(f"{loaded.card.name}: the model's output is not finite: the checkpoint's weights or the "
                         f"card's mean/std are broken")
    probabilities = torch.softmax(logits, dim=0)
    values, indices = probabilities.topk(min(count, probabilities.numel()))
    return {loaded.card.classes[i]: float(v) for v, i in zip(values.tolist(), indices.tolist(), strict=True)}
