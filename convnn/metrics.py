"""What a trained classifier scores on a test loader: top-1 accuracy and mean cross-entropy (training and
``python -m convnn.evaluate`` measure checkpoints with the same function)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["test_metrics"]


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
