"""Record which neighbours each ConvNN layer selected, without changing what the model computes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from torch import Tensor, nn

from .functional import padded_to_cells

__all__ = ["NeighborRecord", "Recordable", "record_neighbors"]


@dataclass(frozen=True)
class NeighborRecord:
    """The neighbours one ConvNN layer used in one forward call.

    Attributes:
        topk_idx (Tensor): (B, h, N_out, K) int64 key indices, rank 0 first; for ``window``/``blend`` selection they
            address the map zero-padded by ``padding`` cells, otherwise the map itself.
        topk_weights (Tensor): (B, h, N, K) the weights ρ the layer applied (ones for ``weighting="none"``).
        height (int): H of the layer's (unpadded) map; queries are its N = H·W tokens in raster order.
        width (int): W of the layer's map.
        padding (int): zero padding of the key grid (0 for ``all``/``random`` unless their candidates include the
            padding).
        candidates (Tensor, optional): (B or 1, r) int64 sampled candidate keys for ``random`` selection.
        queries (Tensor, optional): (N_out, 2) int64 ``(row, col)`` of each query in the map (padding cells fall
            outside), raster order of the output, when the queries are not every cell of the map (a stride, or a
            padding other than "same": METHOD §3a); None: query ``i`` is cell ``i``.
    """

    topk_idx: Tensor
    topk_weights: Tensor
    height: int
    width: int
    padding: int = 0
    candidates: Tensor | None = None
    queries: Tensor | None = None

    def cells(self) -> Tensor:
        """(B, h, N, K, 2) int64 ``(row, col)`` of each neighbour in the layer's map; padding cells fall outside."""
        return padded_to_cells(self.topk_idx, self.width, self.padding)


class Recordable(nn.Module):
    """Mixin of the layers that can report their neighbours: ``_records`` is a list while recording, else None."""

    _records: list[NeighborRecord] | None = None

    def _record(self, topk_idx: Tensor, topk_weights: Tensor, height: int, width: int, padding: int = 0,
                candidates: Tensor | None = None, queries: Tensor | None = None) -> None:
        if self._records is not None:
            self._records.append(NeighborRecord(topk_idx.detach(), topk_weights.detach(), height, width, padding,
                                                candidates, queries))


@contextlib.contextmanager
def record_neighbors(model: nn.Module) -> Iterator[dict[str, list[NeighborRecord]]]:
    """Collect the neighbours every ConvNN layer of ``model`` selects while the context is open.

    The model's outputs are unchanged: layers only keep references to the indices and weights they computed.

    Args:
        model (nn.Module): any module containing ConvNN layers (``ConvNN2d``, ``ConvNNAttention``, ...).

    Yields:
        dict[str, list[NeighborRecord]]: qualified layer name → one record per forward call, filled as the model
        runs.

    Example:
        >>> with record_neighbors(model) as records:
        ...     logits = model(images)
        >>> records["stage1.0.conv1.knn"][0].topk_idx.shape  # (B, 1, N, K)
    """
    layers = {name: m for name, m in model.named_modules() if isinstance(m, Recordable)}
    records: dict[str, list[NeighborRecord]] = {name: [] for name in layers}
    for name, layer in layers.items():
        layer._records = records[name]
    try:
        yield records
    finally:
        for layer in layers.values():
            layer._records = None

