"""A random-candidate model's answer over its eval draws (METHOD §3b): one draw is one of many equally valid answers.

In eval mode a layer with random candidates draws them from a key of the image and a draw index
(:func:`convnn.candidates.sample_keys`); the model's answer for an image is therefore a distribution over draws.
:func:`draw_spread` runs :data:`SPREAD_DRAWS` draws of one image in one batch and says how often each class comes
out on top and how far the top class's probability moves; :func:`analysis.neighbor_table` with ``draw=d`` is the
neighbour table of draw ``d`` (the forward pass of that draw, its selections and the random rule's candidates).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from convnn.candidates import candidate_draw, draws_candidates

from ..session.caching import bounded_cache
from ..session.image_decode import InputImage
from ..session.image_display import model_input
from ..session.models import LoadedModel
from ..session.traces import check_finite, trace_image

__all__ = ["SPREAD_DRAWS", "DrawSpread", "draw_spread"]

SPREAD_DRAWS = 16  # the draws the explorer summarises a random-candidate model's answer over


@dataclass(frozen=True, eq=False)
class DrawSpread:
    """A model's answer for one image over eval draws 0 … ``draws`` − 1.

    Attributes:
        draws (int): how many draws were run (1 for a model without random candidates: every draw is the same).
        probabilities (np.ndarray): (draws, num_classes) float32 softmax probabilities, row ``d`` = draw ``d``.
        shares (dict[str, float]): class → the share of draws whose top-1 it is, in (0, 1], most frequent first
            (classes that are never top-1 are left out); the values sum to 1.
        top_class (str): the class most often top-1 (a tie goes to the higher mean probability).
        top_probability (tuple[float, float]): the smallest and largest probability of ``top_class`` over the draws.
    """

    draws: int
    probabilities: np.ndarray
    shares: dict[str, float]
    top_class: str
    top_probability: tuple[float, float]


@bounded_cache(32)
def draw_spread(loaded: LoadedModel, image: InputImage, draws: int = SPREAD_DRAWS) -> DrawSpread:
    """``loaded``'s prediction for ``image`` over eval draws 0 … ``draws`` − 1, in one batch (cached).

    Each row of the batch is the same model input with its own draw index
    (:func:`convnn.candidates.candidate_draw`); eval outputs do not depend on the batch, so row ``d`` is what the
    model answers alone in draw ``d`` (row 0: the answer the other views show).

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        draws (int): how many draws, ≥ 1. Default: :data:`SPREAD_DRAWS`

    Returns:
        DrawSpread: per-draw probabilities, each class's share of top-1 and the top class's probability range.

    Raises:
        ValueError: ``draws`` < 1, or what :func:`~analysis.session.traces.trace_image` refuses (numbers that are
            not finite, logits not one per class of the card); or another draw's logits not finite.
    """
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws must be an integer ≥ 1, got {draws!r}")
    trace_image(loaded, image)  # the first draw's pass: the class count, and every number checked finite
    draws = draws if draws_candidates(loaded.model) else 1
    x = model_input(image, loaded.card).to(loaded.device)
    with torch.no_grad(), loaded.lock, candidate_draw(torch.arange(draws)):
        logits = loaded.model(x.expand(draws, -1, -1, -1)).float().cpu()
    classes = loaded.card.classes
    check_finite(loaded, {"the class scores of the other draws": logits})
    probabilities = torch.softmax(logits, dim=1).numpy()
    counts = np.bincount(probabilities.argmax(1), minlength=len(classes))
    mean = probabilities.mean(0)
    order = sorted(np.flatnonzero(counts), key=lambda c: (-counts[c], -mean[c]))
    top = order[0]
    return DrawSpread(draws, probabilities, {classes[c]: counts[c] / draws for c in order}, classes[top],
                      (float(probabilities[:, top].min()), float(probabilities[:, top].max())))
