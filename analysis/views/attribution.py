"""Which input pixels drive a class score: Captum Saliency, Integrated Gradients and Occlusion.

Gradient methods (Saliency, Integrated Gradients) differentiate through the neighbours the layers selected but hold
that choice fixed: top-K indices carry no gradient (METHOD §2). Occlusion re-runs the model on masked images, so the
layers may select different neighbours: it measures the effect of the selection too.

Attributions run on a copy of the model of their own (made once per loaded model, under its lock, and cached with
it): their many forward passes (64 for occlusion at any input size, in batches bounded by the model's activations)
then neither wait for nor hold the model's lock, which every recorded forward pass of the other views takes, so a
click or a prediction never queues behind an attribution. A whole attribution, its backward passes included, is one
call of a module (:class:`_Attribution`): whatever gates or times module calls (the server's compute shares) sees
its gradients too, not only its forward passes.
"""

from __future__ import annotations

import contextlib
import copy
import reprlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import torch
from captum.attr import IntegratedGradients, Occlusion, Saliency

from convnn.candidates import candidate_draw
from convnn.models import model_cost

from ..session.caching import bounded_cache
from ..session.image_decode import InputImage
from ..session.image_display import model_input
from ..session.models import LoadedModel
from ..session.traces import check_finite, effective_draw, trace_image

__all__ = ["ATTRIBUTION_METHODS", "GRADIENT_NOTE", "Attribution", "attribution_map", "attribution_passes",
           "reporting_passes"]

ATTRIBUTION_METHODS = {"saliency": "Saliency", "integrated_gradients": "Integrated Gradients",
                       "occlusion": "Occlusion"}  # id → the name a page shows
GRADIENT_NOTE = ("Saliency and Integrated Gradients hold each layer's neighbour choice fixed (top-K indices carry no "
                 "gradient); Occlusion re-runs the model on occluded images, so the selected neighbours may change.")
IG_STEPS = 16  # Riemann steps of Integrated Gradients: a coarse but interactive approximation
OCCLUSION_SQUARES = 8  # occluding squares per side, not overlapping: 64 forward passes at any input size (4 px on
# a 32 px input, a ViT patch on CIFAR; 28 px at 224), so a large input costs 64 passes, not (S / 4)²
_BATCH = 16  # forward passes per batch for Integrated Gradients and Occlusion, at most
_BATCH_VALUES = 100_000_000  # activation values a batch's passes may hold together (0.4 GB in fp32, before gradients)
_BATCH_FLOPS = 4_000_000_000  # multiply-adds of a batch's passes, at most: a second or so on two cores, the longest a
#                               dropped run computes on before it stops (server.check_dropped, between batches)
_MODEL_COPIES = 2  # models with an attribution copy kept (each as large as its model)
_PASS_REPORT: ContextVar[Callable[[int, int], None] | None] = ContextVar("attribution_passes", default=None)


@dataclass(frozen=True)
class Attribution:
    """An attribution map for one class.

    Attributes:
        values (np.ndarray): (S, S) float32 |attribution| summed over the colour channels, ≥ 0 (arbitrary units).
        target (str): the class name.
        method (str): one of :data:`ATTRIBUTION_METHODS`' ids.
        note (str): how the method treats the neighbour choice.
    """

    values: np.ndarray
    target: str
    method: str
    note: str


def attribution_passes(method: str) -> int:
    """The forward passes an attribution by ``method`` makes (batched): 1 for saliency, :data:`IG_STEPS` for
    Integrated Gradients, Captum's unoccluded pass and the :data:`OCCLUSION_SQUARES`² occluded ones for occlusion."""
    return {"saliency": 1, "integrated_gradients": IG_STEPS}.get(method, 1 + OCCLUSION_SQUARES**2)


@contextlib.contextmanager
def reporting_passes(report: Callable[[int, int], None]) -> Iterator[None]:
    """Within the block (this thread or task), an attribution that is computed (not one cached) calls ``report(done,
    total)`` after each batch of forward passes: the passes made so far and :func:`attribution_passes` (what a page's
    progress bar shows)."""
    token = _PASS_REPORT.set(report)
    try:
        yield
    finally:
        _PASS_REPORT.reset(token)


@bounded_cache(16)
def attribution_map(loaded: LoadedModel, image: InputImage, method: str, target: str | None = None, draw: int = 0
                    ) -> Attribution:
    """Attribute the score of ``target`` (default: the class predicted in eval draw ``draw``) to the input pixels,
    every forward pass in that draw (cached).

    The baseline of Integrated Gradients and the occluding value is 0 in normalised space: the mean colour.

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        method (str): ``"saliency"``, ``"integrated_gradients"`` or ``"occlusion"``.
        target (str, optional): class name (exact, or the one class equal to it ignoring case and the spaces
            around it). Default: the predicted class
        draw (int): the eval draw of a model with random candidates (METHOD §3b): the draw of the predicted class
            and of the passes attributed. Default: 0

    Raises:
        ValueError: unknown method or class name, a model whose class count does not match its card, or a
            ``draw`` that is not an integer ≥ 0; an attribution that is not finite (from passes on the occluded or
            scaled image that overflow, where the image itself did not), refused naming the model
            (:func:`~analysis.session.traces.check_finite`).
    """
    if method not in ATTRIBUTION_METHODS:
        raise ValueError(f"method must be one of {tuple(ATTRIBUTION_METHODS)}, got {method!r}")
    classes = loaded.card.classes
    draw = effective_draw(loaded, draw)
    logits = trace_image(loaded, image, draw).logits  # the prediction already computed; checks the class count
    if target is None:
        index = int(logits.argmax())
    elif target in classes:
        index = classes.index(target)
    else:  # as typed: "Dog " is the class "dog", unless two classes differ only in case
        folded = [i for i, name in enumerate(classes) if name.casefold() == target.strip().casefold()]
        if len(folded) != 1:
            raise ValueError(f"class {reprlib.repr(target)} is not one of the model's classes {classes}")
        index = folded[0]
    x = model_input(image, loaded.card).to(loaded.device)
    with candidate_draw(draw):  # each pass draws as the model does in that draw (the copy keeps the key hook)
        values = _Attribution(_own_model(loaded), method, index, _batch_size(loaded))(x)[0].sum(0).detach()  # (S, S)
    check_finite(loaded, {f"the {ATTRIBUTION_METHODS[method]} attribution (its passes on the occluded or scaled "
                          "image)": values})
    return Attribution(values.float().cpu().numpy(), classes[index], method, GRADIENT_NOTE)


@bounded_cache(_MODEL_COPIES)
def _own_model(loaded: LoadedModel) -> torch.nn.Module:
    """A copy of ``loaded.model`` for attributions alone, made under the model's lock (so no recording is copied).

    The neighbour recorder's state is per module, so only passes through the shared model need its lock; passes
    through this copy record nothing and change nothing, so they need none."""
    with loaded.lock:
        return copy.deepcopy(loaded.model)


def _batch_size(loaded: LoadedModel) -> int:
    """Forward passes per batch: :data:`_BATCH`, fewer for a model whose one pass holds more than
    ``_BATCH_VALUES / _BATCH`` activation values or costs more than ``_BATCH_FLOPS / _BATCH`` multiply-adds (its
    card's cost, :func:`convnn.models.model_cost`; a run that is dropped stops between batches), at least 1."""
    card = loaded.card
    cost = model_cost(card.model, card.input_size, **card.model_args)
    if cost is None:
        return _BATCH
    return max(1, min(_BATCH, _BATCH_VALUES // max(cost.activations, 1), _BATCH_FLOPS // max(cost.flops, 1)))


class _Counted(torch.nn.Module):
    """``model`` calling ``report(done, total)`` after each batch of passes (:func:`reporting_passes`)."""

    def __init__(self, model: torch.nn.Module, report: Callable[[int, int], None], total: int) -> None:
        super().__init__()
        self.model, self.report, self.total, self.done = model, report, total, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        self.done += x.shape[0]
        self.report(min(self.done, self.total), self.total)
        return out


class _Attribution(torch.nn.Module):
    """One attribution as one module call: ``forward(x)`` is the (1, 3, S, S) attributions of class ``index`` by
    ``method`` (``model``: the attribution copy), ``batch`` passes at once, each batch reported to
    :func:`reporting_passes`' callback, if one is set. Captum's forward passes are module calls inside it, and its
    backward passes run before it returns, so a global module hook's span (``server.ComputeShares``: a place on a
    core, charged its CPU time) covers the gradients too; nothing inside takes a lock (the model is the attribution's
    own copy)."""

    def __init__(self, model: torch.nn.Module, method: str, index: int, batch: int) -> None:
        super().__init__()
        self.model, self.method, self.index, self.batch = model, method, index, batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _attribute(self.model, x, self.method, self.index, self.batch)


def _attribute(model: torch.nn.Module, x: torch.Tensor, method: str, index: int, batch: int) -> torch.Tensor:
    """:class:`_Attribution`'s computation."""
    report = _PASS_REPORT.get()
    if report is not None:
        model = _Counted(model, report, attribution_passes(method))
    if method == "saliency":
        values = Saliency(model).attribute(x.requires_grad_(), target=index, abs=True)
    elif method == "integrated_gradients":
        values = IntegratedGradients(model).attribute(x, baselines=torch.zeros_like(x), target=index,
                                                      n_steps=IG_STEPS, internal_batch_size=batch).abs()
    else:
        side = -(-x.shape[-1] // OCCLUSION_SQUARES)  # ⌈S / 8⌉ px: 8 × 8 squares cover the input
        values = Occlusion(model).attribute(
            x, sliding_window_shapes=(x.shape[1], side, side), strides=(x.shape[1], side, side), baselines=0.0,
            target=index, perturbations_per_eval=batch).abs()
    return values
