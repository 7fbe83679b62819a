"""Neighbours of neighbours: the query's effective receptive field through consecutive probe layers.

Hop 0 is the query's cell in the chosen layer; hop 1 its neighbours there (what the layer really selected); hop 2
the neighbours, in the previous probe layer, of every cell covering a hop-1 pixel; and so on towards the input.
Layers at different resolutions are linked through model-input pixels; padding cells and CLS tokens are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .checkpoints import LoadedModel
from .images import InputImage
from .neighbors import LAYER_RULE, RuleOptions, rule_selection
from .probes import ProbeLayer, cell_rect_px, query_cell
from .values import whole_number

__all__ = ["ReceptiveField", "receptive_field"]


@dataclass(frozen=True)
class ReceptiveField:
    """Which model-input pixels each hop reaches.

    Attributes:
        hops (np.ndarray): (S, S) int64, the first hop reaching each pixel (0 = the query's cell), −1 if none.
        layers (list[str]): ``layers[h − 1]`` is the layer whose selection made hop h ≥ 1.
        pixel_counts (list[int]): ``pixel_counts[h]`` pixels reached by hops 0..h (cumulative).
    """

    hops: np.ndarray
    layers: list[str]
    pixel_counts: list[int]


def _cell_slices(probe: ProbeLayer, row: int, col: int) -> tuple[slice, slice]:
    top, left, bottom, right = cell_rect_px(probe, row, col)
    return slice(top, bottom), slice(left, right)


def _cells_to_mask(probe: ProbeLayer, cells: np.ndarray) -> np.ndarray:
    """(M, 2) cells → (S, S) bool mask of the model-input pixels they cover (cells off the grid are dropped)."""
    mask = np.zeros((probe.input_size, probe.input_size), dtype=bool)
    for row, col in cells:
        if 0 <= row < probe.height and 0 <= col < probe.width:
            mask[_cell_slices(probe, row, col)] = True
    return mask


def _mask_to_cells(probe: ProbeLayer, mask: np.ndarray) -> np.ndarray:
    """Raster indices of the cells of ``probe`` that cover at least one pixel of ``mask``, (M,) int64."""
    return np.array([r * probe.width + c for r in range(probe.height) for c in range(probe.width)
                     if mask[_cell_slices(probe, r, c)].any()], dtype=np.int64)


def receptive_field(loaded: LoadedModel, image: InputImage, layer: str, query_px: tuple[int, int],
                    num_hops: int = 2, head: int = 0) -> ReceptiveField:
    """The pixels reached from ``query_px`` by ``num_hops`` hops of selection, starting at ``layer``.

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        layer (str): the probe layer of hop 1.
        query_px (tuple[int, int]): ``(row_px, col_px)`` in model-input pixels.
        num_hops (int): hops, ≥ 1; stops early at the first probe layer. Default: 2
        head (int): attention head whose selections are followed, in [0, num_heads − 1] of every layer passed.
            Default: 0

    Raises:
        ValueError: ``num_hops`` not a whole number ≥ 1, an unknown layer, a head out of range or a pixel outside
            the image.
    """
    num_hops = whole_number(num_hops, "num_hops")
    if num_hops < 1:
        raise ValueError(f"num_hops must be ≥ 1, got {num_hops}")
    names = [p.name for p in loaded.probes]
    start = names.index(loaded.probe(layer).name)
    probe = loaded.probes[start]
    head = probe.check_head(head)
    frontier = _cells_to_mask(probe, np.array([query_cell(probe, *query_px)]))
    hops = np.where(frontier, 0, -1)
    layers, counts = [], [int(frontier.sum())]
    for hop, index in enumerate(range(start, max(start - num_hops, -1), -1), start=1):
        probe = loaded.probes[index]
        sel = rule_selection(loaded, image, probe.name, LAYER_RULE, RuleOptions(head=head))
        queries = _mask_to_cells(probe, frontier)
        frontier = _cells_to_mask(probe, sel.cells[queries][~sel.is_prefix[queries]])
        hops = np.where((hops < 0) & frontier, hop, hops)
        layers.append(probe.name)
        counts.append(int((hops >= 0).sum()))
    return ReceptiveField(hops, layers, counts)
