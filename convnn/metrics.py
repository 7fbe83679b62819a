"""What a trained classifier scores on a test loader: top-1 accuracy and mean cross-entropy (training and
``python -m convnn.evaluate`` measure checkpoints with the same function), and for a model with random candidates
the same over :data:`EVAL_DRAWS` eval draws, summarised as mean ± sample std (METHOD §3b)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .candidates import DRAW_SCHEME, candidate_draw, draws_candidates

__all__ = ["EVAL_DRAWS", "draw_evaluation", "draw_metrics", "summarize_draws", "test_metrics"]

EVAL_DRAWS = 5  # eval draws a model with random candidates is measured over (METHOD §3b)


@torch.no_grad()
def test_metrics(model: nn.Module, loader: Iterable[tuple[Tensor, Tensor]], device: torch.device,
                 amp: bool) -> dict[str, float]:
    """Top-1 accuracy and mean cross-entropy of ``model`` (put in eval mode) over ``loader``, summed over all ranks.

    Args:
        model (nn.Module): the classifier; logits (B, classes).
        loader (Iterable): (images, labels) batches on ``device``, labels int64 class indices.
        device (torch.device): where the batches live.
        amp (bool): run the forward under bf16 autocast on ``device`` (how training evaluates on a GPU).

    Returns:
        dict[str, float]: ``test_top1`` in percent and ``test_loss`` (mean cross-entropy in nats), over every
        rank's share when a process group is initialised.
    """
    model.eval()
    totals = torch.zeros(3, device=device, dtype=torch.float64)  # loss sum, correct, count
    for images, labels in loader:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(images)
        totals += torch.stack([F.cross_entropy(logits.float(), labels, reduction="sum"),
                               (logits.argmax(1) == labels).sum(), torch.tensor(len(labels), device=device)]).double()
    if dist.is_initialized():
        dist.all_reduce(totals)
    return {"test_loss": (totals[0] / totals[2]).item(), "test_top1": (100 * totals[1] / totals[2]).item()}


def draw_metrics(model: nn.Module, loader: Iterable[tuple[Tensor, Tensor]], device: torch.device, amp: bool,
                 draws: int = EVAL_DRAWS) -> list[dict[str, float]]:
    """:func:`test_metrics` per eval draw: one entry per draw index 0 … ``draws`` − 1
    (:func:`convnn.candidates.candidate_draw`) for a model with random candidates, one entry otherwise.

    Args:
        model (nn.Module): the classifier.
        loader (Iterable): (images, labels) batches on ``device``; iterated once per draw.
        device (torch.device): where the batches live.
        amp (bool): as in :func:`test_metrics`.
        draws (int): eval draws of a model with random candidates, ≥ 1. Default: :data:`EVAL_DRAWS`

    Returns:
        list[dict[str, float]]: each draw's ``test_top1`` and ``test_loss``.
    """
    measured = []
    for draw in range(draws if draws_candidates(model) else 1):
        with candidate_draw(draw):
            measured.append(test_metrics(model, loader, device, amp))
    return measured


def summarize_draws(measured: list[dict[str, float]]) -> dict[str, float]:
    """Per-draw metrics (:func:`draw_metrics`) → a card's: one draw's as they are; several draws' mean of each metric,
    and ``test_top1_std``, the sample standard deviation of ``test_top1`` over the draws.

    Raises:
        ValueError: no draws.
    """
    if not measured:
        raise ValueError("no draws measured")
    if len(measured) == 1:
        return dict(measured[0])
    summary = {key: float(np.mean([m[key] for m in measured])) for key in measured[0]}
    summary["test_top1_std"] = float(np.std([m["test_top1"] for m in measured], ddof=1))
    return summary


def draw_evaluation(model: nn.Module, draws: int = EVAL_DRAWS) -> dict:
    """A card's ``evaluation`` for ``model`` measured over ``draws`` eval draws: the draw scheme and the number of
    draws for a model with random candidates, else empty (:class:`~convnn.card.ModelCard`)."""
    return {"draw_scheme": DRAW_SCHEME, "draws": draws} if draws_candidates(model) else {}
