"""The convolution ↔ attention spectrum of a model on one image: how local each layer's selections are.

For every layer, over all its queries (and all heads), the neighbours the layer really selected
(``rule="layer"`` of :func:`analysis.session.selections.rule_selection`): their mean distance to the query in cells,
and the share of them inside the query's R×R window. A convolution sits at 100% inside; attention-style selection
spreads out.

Also neighbours of neighbours (:func:`receptive_field`): the query's effective receptive field through consecutive
layers.

Hop 0 is the query's cell in the chosen layer; hop 1 its neighbours there (what the layer really selected); hop 2
the neighbours, in the previous layer, of every cell covering a hop-1 pixel; and so on towards the input.
Layers at different resolutions are linked through model-input pixels; padding cells and CLS tokens are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from convnn.functional import padded_to_cells
from convnn.validation import number_range

from ..session.caching import bounded_cache
from ..session.image_decode import InputImage
from ..session.inputs import KNOB_NAMES, whole_number
from ..session.models import LoadedModel
from ..session.renamed import renamed_keywords
from ..session.selections import LAYER_RULE, RuleOptions, distance_stats, rule_selection
from ..session.traces import LayerInfo, cell_rect_px, effective_draw, query_cell

__all__ = [
    "MAX_FIELD_TABLE",
    "ReceptiveField",
    "ReceptiveFields",
    "SpectrumRow",
    "fits_field_table",
    "receptive_field",
    "receptive_fields",
    "selection_spectrum",
]


@dataclass(frozen=True)
class SpectrumRow:
    """One layer's place on the spectrum.

    Attributes:
        layer (str): layer name.
        mean_distance (float): mean neighbour distance to the query in cells, over queries and heads.
        window_share (float): share of neighbours inside the R×R window, in [0, 1].
        window_size (int): R.
        cell_px (float): model-input pixels per cell (input size / grid height), so that layers of different
            sizes, and models, share one axis (:attr:`mean_distance_px`).
        grid_side (int): the grid's longer side, in cells.
    """

    layer: str
    mean_distance: float
    window_share: float
    window_size: int
    cell_px: float = 1.0
    grid_side: int = 1

    @property
    def mean_distance_px(self) -> float:
        """The mean neighbour distance in model-input pixels."""
        return self.mean_distance * self.cell_px

    @property
    def mean_distance_grid(self) -> float:
        """The mean neighbour distance as a fraction of the grid's longer side (0: the query itself)."""
        return self.mean_distance / self.grid_side


def selection_spectrum(loaded: LoadedModel, image: InputImage, window_size: int = 3, draw: int = 0
                       ) -> tuple[SpectrumRow, ...]:
    """Every layer's mean neighbour distance and in-window share on ``image`` in eval draw ``draw`` (cached).

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        window_size (int): R of the in-window share, odd. Default: 3
        draw (int): the eval draw of a model with random candidates (METHOD §3b). Default: 0

    Returns:
        tuple[SpectrumRow, ...]: one row per layer, forward order.

    Raises:
        ValueError: an even or non-positive ``window_size``, or a ``draw`` that is not an integer ≥ 0.
    """
    if window_size < 1 or window_size % 2 == 0:
        raise ValueError(f"window_size must be odd and ≥ 1, got {window_size}")
    return _selection_spectrum(loaded, image, window_size, effective_draw(loaded, draw))


@bounded_cache(16)
def _selection_spectrum(loaded: LoadedModel, image: InputImage, window_size: int, draw: int
                        ) -> tuple[SpectrumRow, ...]:
    """:func:`selection_spectrum` of a checked ``window_size`` and an effective ``draw``."""
    rows = []
    for layer_info in loaded.layer_infos:
        grid = padded_to_cells(torch.arange(layer_info.height * layer_info.width), layer_info.width, 0).numpy()
        means, shares = [], []
        for head in range(layer_info.num_heads):
            sel = rule_selection(loaded, image, layer_info.name, LAYER_RULE, RuleOptions(head=head), draw)
            mean, share = distance_stats(sel.cells, sel.is_prefix, grid, window_size)
            means.append(np.nanmean(mean))
            shares.append(share.mean())
        rows.append(SpectrumRow(layer_info.name, float(np.mean(means)), float(np.mean(shares)), window_size,
                                layer_info.input_size / layer_info.height, max(layer_info.height, layer_info.width)))
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


MAX_FIELD_TABLE = 2**22  # queries × model-input pixels of one receptive-field table (int8: 4 MB, what the page
#                           gets): every query of a 32×32 layer on a 64 px input; a larger layer or input gets the
#                           table of the queries asked for


@dataclass(frozen=True, eq=False)
class ReceptiveFields:
    """:class:`ReceptiveField` of several query cells of a layer at once (all of them, or those asked for).

    Attributes:
        hops (np.ndarray): (Q, S, S) int8, row ``i`` the hop map of the query at raster cell ``queries[i]``.
        layers (list[str]): as :attr:`ReceptiveField.layers`.
        pixel_counts (np.ndarray): (Q, len(layers) + 1) int32, as :attr:`ReceptiveField.pixel_counts` per query.
        queries (tuple[int, ...] or None): the raster cells of the rows; None: every cell of the layer, in order.
    """

    hops: np.ndarray
    layers: list[str]
    pixel_counts: np.ndarray
    queries: tuple[int, ...] | None = None


def _covers(layer_info: LayerInfo) -> tuple[torch.Tensor, torch.Tensor]:
    """The cells' cover of the model input, per axis (:func:`cell_rect_px`): ``rows`` (H, S) and ``cols`` (W, S)
    float32, 1 where a row (column) of cells covers a row (column) of pixels; a cell covers the pixels of its row's
    rows and its column's columns."""
    pixels = torch.arange(layer_info.input_size)
    rows = [cell_rect_px(layer_info, r, 0) for r in range(layer_info.height)]
    cols = [cell_rect_px(layer_info, 0, c) for c in range(layer_info.width)]
    return (torch.stack([(pixels >= top) & (pixels < bottom) for top, _, bottom, _ in rows]).float(),
            torch.stack([(pixels >= left) & (pixels < right) for _, left, _, right in cols]).float())


def _adjacency(layer_info: LayerInfo, selection) -> torch.Tensor:
    """(H·W, H·W) float32: 1 where a query (row) selected a cell of the grid (padding cells and CLS dropped)."""
    cells = torch.from_numpy(selection.cells)  # (H·W, K, 2)
    on_grid = ((cells[..., 0] >= 0) & (cells[..., 0] < layer_info.height) & (cells[..., 1] >= 0)
               & (cells[..., 1] < layer_info.width) & ~torch.from_numpy(selection.is_prefix))
    adjacency = torch.zeros(layer_info.height * layer_info.width, layer_info.height * layer_info.width)
    queries = torch.arange(len(cells))[:, None].expand_as(on_grid)
    adjacency[queries[on_grid], (cells[..., 0] * layer_info.width + cells[..., 1])[on_grid]] = 1.0
    return adjacency


def _check_hops(num_hops) -> int:
    num_hops = whole_number(num_hops, "num_hops")
    if num_hops < 1:
        raise ValueError(f"num_hops must be ≥ 1, got {num_hops}")
    return num_hops


@renamed_keywords(probe="layer_info")
def fits_field_table(layer_info: LayerInfo, queries: int | None = None) -> bool:
    """Whether the fields of ``queries`` query cells of ``layer_info`` (None: all of them) fit one receptive-field
    table (:data:`MAX_FIELD_TABLE` query-pixels)."""
    count = layer_info.height * layer_info.width if queries is None else queries
    return count * layer_info.input_size ** 2 <= MAX_FIELD_TABLE


def receptive_fields(loaded: LoadedModel, image: InputImage, layer: str, num_hops: int = 2, head: int = 0,
                     queries: tuple[int, ...] | None = None, draw: int = 0) -> ReceptiveFields:
    """The pixels reached from query cells of ``layer`` by ``num_hops`` hops of selection (cached).

    Hop 0 is the query's cell; hop h ≥ 1 takes every cell, of the h-th layer counting back from ``layer``,
    that covers a pixel of hop h − 1's frontier, and makes its neighbours (what that layer selected) the new
    frontier. As boolean matrix products over the queries, each cover taken per axis (a cell covers a rectangle of
    pixels): frontier F (Q × S × S) → touched cells rows·F·colsᵀ, · adjacency → selected cells, rowsᵀ·sel·cols →
    pixels; the largest intermediate is Q × S × S.

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        layer (str): the layer of hop 1.
        num_hops (int): hops, ≥ 1; stops early at the first layer. Default: 2
        head (int): attention head whose selections are followed, in [0, num_heads − 1] of every layer passed.
            Default: 0
        queries (tuple[int, ...] or None): raster cells of ``layer`` to follow; None: all of them. Default: None
        draw (int): the eval draw of a model with random candidates (METHOD §3b). Default: 0

    Raises:
        ValueError: ``num_hops`` not a whole number ≥ 1, an unknown layer, a head out of range, a query cell
            outside the layer, more queries × pixels than :data:`MAX_FIELD_TABLE` (before any work), or a ``draw``
            that is not an integer ≥ 0.
    """
    num_hops = _check_hops(num_hops)
    layer_info = loaded.layer_info(layer)
    head = layer_info.check_head(head, KNOB_NAMES["head"])
    size, cells = layer_info.input_size, layer_info.height * layer_info.width
    if queries is not None:
        queries = tuple(whole_number(q, "query cell") for q in queries)
        if any(q < 0 or q >= cells for q in queries):
            raise ValueError(f"query cells must be {number_range(0, cells - 1)} for {layer_info.name}, "
                                 f"got {list(queries)}")
    count = cells if queries is None else len(queries)
    if not fits_field_table(layer_info, count):
        raise ValueError(f"the receptive fields of {count} queries on a {size}×{size} px input are more than the "
                         f"multi-hop view's {MAX_FIELD_TABLE:,} query-pixels: ask for fewer queries")
    return _receptive_fields(loaded, image, layer_info.name, num_hops, head, queries, effective_draw(loaded, draw))


@bounded_cache(8)
def _receptive_fields(loaded: LoadedModel, image: InputImage, layer: str, num_hops: int, head: int,
                      queries: tuple[int, ...] | None, draw: int) -> ReceptiveFields:
    """:func:`receptive_fields` of checked arguments and an effective ``draw``."""
    names = [layer_info.name for layer_info in loaded.layer_infos]
    start = names.index(layer)
    layer_info = loaded.layer_infos[start]
    cells = layer_info.height * layer_info.width
    rows = torch.arange(cells) if queries is None else torch.tensor(queries, dtype=torch.long)
    row_cover, col_cover = _covers(layer_info)
    own = torch.zeros(rows.numel(), cells)
    own[torch.arange(rows.numel()), rows] = 1.0
    frontier = (row_cover.T @ own.view(-1, layer_info.height, layer_info.width) @ col_cover) > 0  # (Q, S, S): own cell
    hops = torch.where(frontier, 0, -1).to(torch.int8)
    layers, counts = [], [frontier.flatten(1).sum(1)]
    for hop, index in enumerate(range(start, max(start - num_hops, -1), -1), start=1):
        layer_info = loaded.layer_infos[index]
        row_cover, col_cover = _covers(layer_info)
        selection = rule_selection(loaded, image, layer_info.name, LAYER_RULE, RuleOptions(head=head), draw)
        touched = (row_cover @ frontier.float() @ col_cover.T) > 0  # (Q, H_l, W_l)
        selected = (touched.flatten(1).float() @ _adjacency(layer_info, selection)) > 0  # (Q, N_l)
        frontier = (row_cover.T @ selected.view(-1, layer_info.height, layer_info.width).float() @ col_cover) > 0
        hops = torch.where((hops < 0) & frontier, hop, hops).to(torch.int8)
        layers.append(layer_info.name)
        counts.append((hops >= 0).flatten(1).sum(1))
    return ReceptiveFields(hops.numpy(), layers, torch.stack(counts, 1).to(torch.int32).numpy(), queries)


def receptive_field(loaded: LoadedModel, image: InputImage, layer: str, query_px: tuple[int, int],
                    num_hops: int = 2, head: int = 0, draw: int = 0) -> ReceptiveField:
    """The pixels reached from ``query_px`` by ``num_hops`` hops of selection, starting at ``layer``: the query's
    row of :func:`receptive_fields` (of every query where they fit one table, else of this query alone).

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        layer (str): the layer of hop 1.
        query_px (tuple[int, int]): ``(row_px, col_px)`` in model-input pixels.
        num_hops (int): hops, ≥ 1; stops early at the first layer. Default: 2
        head (int): attention head whose selections are followed, in [0, num_heads − 1] of every layer passed.
            Default: 0
        draw (int): the eval draw of a model with random candidates (METHOD §3b). Default: 0

    Raises:
        ValueError: ``num_hops`` not a whole number ≥ 1, an unknown layer, a head out of range, a pixel outside
            the image, or a ``draw`` that is not an integer ≥ 0.
    """
    layer_info = loaded.layer_info(layer)
    row, col = query_cell(layer_info, *query_px)
    index = row * layer_info.width + col
    whole = fits_field_table(layer_info)  # the table of every query, which the page gets too, or this one's alone
    fields = receptive_fields(loaded, image, layer_info.name, num_hops, head, None if whole else (index,),
                              draw)
    at = index if whole else 0
    return ReceptiveField(fields.hops[at].astype(np.int64), fields.layers, fields.pixel_counts[at].tolist())
