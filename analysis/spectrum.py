"""The convolution ↔ attention spectrum of a model on one image: how local each layer's selections are.

For every probe layer, over all its queries (and all heads), the neighbours the layer really selected
(``rule="layer"`` of :func:`analysis.neighbors.rule_selection`): their mean distance to the query in cells, and the
share of them inside the query's R×R window. A convolution sits at 100% inside; attention-style selection spreads out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from convnn.functional import padded_to_cells

from .caching import bounded_cache
from .checkpoints import LoadedModel
from .images import InputImage
from .neighbors import LAYER_RULE, RuleOptions, distance_stats, rule_selection

__all__ = ["SpectrumRow", "selection_spectrum"]


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
