"""The convolution ↔ attention spectrum of a model on one image: how local each layer's selections are.

For every probe layer, over all its queries (and all heads), the neighbours the layer really selected
(``rule="layer"`` of :func:`analysis.session.selections.rule_selection`): their mean distance to the query in cells,
and the share of them inside the query's R×R window. A convolution sits at 100% inside; attention-style selection
spreads out.

Also neighbours of neighbours (:func:`receptive_field`): the query's effective receptive field through consecutive
probe layers.

Hop 0 is the query's cell in the chosen layer; hop 1 its neighbours there (what the layer really selected); hop 2
the neighbours, in the previous probe layer, of every cell covering a hop-1 pixel; and so on towards the input.
Layers at different resolutions are linked through model-input pixels; padding cells and CLS tokens are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from convnn.functional import padded_to_cells

from ..session.caching import bounded_cache
from ..session.images import InputImage
from ..session.inputs import whole_number
from ..session.models import LoadedModel
from ..session.selections import LAYER_RULE, RuleOptions, distance_stats, rule_selection
from ..session.traces import LayerInfo, cell_rect_px, query_cell

__all__ = [
    "ReceptiveField",
    "SpectrumRow",
    "receptive_field",
    "selection_spectrum",
]


@dataclass(frozen=True)
class SpectrumRow:
    """One layer's place on the spectrum.

    Attributes:
        layer (str): probe layer name.
        mean_distance (float): mean neighbour distance to the query in cells, over queries and heads.
        window_share (float): share of neighbours inside the R×R window, in [0, 1].
        window_size (int): R.
    """

    layer: str
    mean_distance: float
    window_share: float
    window_size: int


@bounded_cache(16)
def selection_spectrum(loaded: LoadedModel, image: InputImage, window_size: int = 3) -> tuple[SpectrumRow, ...]:
    """Every probe layer's mean neighbour distance and in-window share on ``image`` (cached).

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        window_size (int): R of the in-window share, odd. Default: 3

    Returns:
        tuple[SpectrumRow, ...]: one row per probe layer, forward order.

    Raises:
        ValueError: an even or non-positive ``window_size``.
    """
    if window_size < 1 or window_size % 2 == 0:
        raise ValueError(f"window_size must be odd and ≥ 1, got {window_size}")
    rows = []
    for probe in loaded.probes:
        grid = padded_to_cells(torch.arange(probe.height * probe.width), probe.width, 0).numpy()
        means, shares = [], []
        for head in range(probe.num_heads):
            sel = rule_selection(loaded, image, probe.name, LAYER_RULE, RuleOptions(head=head))
            mean, share = distance_stats(sel.cells, sel.is_prefix, grid, window_size)
            means.append(np.nanmean(mean))
            shares.append(share.mean())
        rows.append(SpectrumRow(probe.name, float(np.mean(means)), float(np.mean(shares)), window_size))
    return tuple(rows)


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


def _cell_slices(probe: LayerInfo, row: int, col: int) -> tuple[slice, slice]:
    top, left, bottom, right = cell_rect_px(probe, row, col)
    return slice(top, bottom), slice(left, right)


def _cells_to_mask(probe: LayerInfo, cells: np.ndarray) -> np.ndarray:
    """(M, 2) cells → (S, S) bool mask of the model-input pixels they cover (cells off the grid are dropped)."""
    mask = np.zeros((probe.input_size, probe.input_size), dtype=bool)
    for row, col in cells:
        if 0 <= row < probe.height and 0 <= col < probe.width:
            mask[_cell_slices(probe, row, col)] = True
    return mask


def _mask_to_cells(probe: LayerInfo, mask: np.ndarray) -> np.ndarray:
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
