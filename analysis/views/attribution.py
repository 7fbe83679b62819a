"""Which input pixels drive a class score: Captum Saliency, Integrated Gradients and Occlusion.

Gradient methods (Saliency, Integrated Gradients) differentiate through the neighbours the layers selected but hold
that choice fixed: top-K indices carry no gradient (METHOD §2). Occlusion re-runs the model on masked images, so the
layers may select different neighbours: it measures the effect of the selection too.

Attributions run on a copy of the model of their own (made once per loaded model, under its lock, and cached with
it): their many forward passes (64 for occlusion) then neither wait for nor hold the model's lock, which every
recorded forward pass of the other views takes, so a click or a prediction never queues behind an attribution.
"""

from __future__ import annotations

import copy
import reprlib
from dataclasses import dataclass

import numpy as np
import torch
from captum.attr import IntegratedGradients, Occlusion, Saliency

from ..session.caching import bounded_cache
from ..session.images import InputImage, model_input
from ..session.models import LoadedModel
from ..session.traces import trace_image

__all__ = ["ATTRIBUTION_METHODS", "GRADIENT_NOTE", "Attribution", "attribution_map"]

ATTRIBUTION_METHODS = ("saliency", "integrated_gradients", "occlusion")
GRADIENT_NOTE = ("Saliency and Integrated Gradients hold each layer's neighbour choice fixed (top-K indices carry no "
                 "gradient); Occlusion re-runs the model on occluded images, so the selected neighbours may change.")
IG_STEPS = 16  # Riemann steps of Integrated Gradients: a coarse but interactive approximation
OCCLUSION_WINDOW_PX = 4  # occluding square, pixels (a ViT patch on CIFAR)
OCCLUSION_STRIDE_PX = 4  # non-overlapping squares: 64 forward passes on a 32×32 input
_BATCH = 16  # forward passes per batch for Integrated Gradients and Occlusion
_MODEL_COPIES = 2  # models with an attribution copy kept (each as large as its model)


@dataclass(frozen=True)
class Attribution:
    """An attribution map for one class.

    Attributes:
        values (np.ndarray): (S, S) float32 |attribution| summed over the colour channels, ≥ 0 (arbitrary units).
        target (str): the class name.
        method (str): one of :data:`ATTRIBUTION_METHODS`.
        note (str): how the method treats the neighbour choice.
    """

    values: np.ndarray
    target: str
    method: str
    note: str


@bounded_cache(16)
def attribution_map(loaded: LoadedModel, image: InputImage, method: str, target: str | None = None) -> Attribution:
    """Attribute the score of ``target`` (default: the predicted class) to the input pixels (cached).

    The baseline of Integrated Gradients and the occluding value is 0 in normalised space: the mean colour.

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        method (str): ``"saliency"``, ``"integrated_gradients"`` or ``"occlusion"``.
        target (str, optional): class name. Default: the predicted class

    Raises:
        ValueError: unknown method or class name, or a model whose class count does not match its card.
    """
    if method not in ATTRIBUTION_METHODS:
        raise ValueError(f"method must be one of {ATTRIBUTION_METHODS}, got {method!r}")
    classes = loaded.card.classes
    logits = trace_image(loaded, image).logits  # the prediction already computed; checks len(logits) = len(classes)
    if target is None:
        index = int(logits.argmax())
    elif target in classes:
        index = classes.index(target)
    else:
        raise ValueError(f"class {reprlib.repr(target)} is not one of the model's classes {classes}")
    x = model_input(image, loaded.card).to(loaded.device)
    values = _attribute(_own_model(loaded), x, method, index)
    return Attribution(values[0].sum(0).detach().float().cpu().numpy(), classes[index], method, GRADIENT_NOTE)


@bounded_cache(_MODEL_COPIES)
def _own_model(loaded: LoadedModel) -> torch.nn.Module:
    """A copy of ``loaded.model`` for attributions alone, made under the model's lock (so no recording is copied).

    The neighbour recorder's state is per module, so only passes through the shared model need its lock; passes
    through this copy record nothing and change nothing, so they need none."""
    with loaded.lock:
        return copy.deepcopy(loaded.model)


def _attribute(model: torch.nn.Module, x: torch.Tensor, method: str, index: int) -> torch.Tensor:
    """(1, 3, S, S) attributions of class ``index`` (``model``: the attribution copy)."""
    if method == "saliency":
        values = Saliency(model).attribute(x.requires_grad_(), target=index, abs=True)
    elif method == "integrated_gradients":
        values = IntegratedGradients(model).attribute(x, baselines=torch.zeros_like(x), target=index,
                                                      n_steps=IG_STEPS, internal_batch_size=_BATCH).abs()
    else:
        values = Occlusion(model).attribute(
            x, sliding_window_shapes=(x.shape[1], OCCLUSION_WINDOW_PX, OCCLUSION_WINDOW_PX),
            strides=(x.shape[1], OCCLUSION_STRIDE_PX, OCCLUSION_STRIDE_PX), baselines=0.0, target=index,
            perturbations_per_eval=_BATCH, show_progress=True).abs()  # a tqdm bar, which the app's page follows
    return values
