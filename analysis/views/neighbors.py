"""The view of one query: its neighbours in a layer under every rule, with distances and overlaps (METHOD §2–3).

Every rule's selection of the whole layer comes from :func:`analysis.session.selections.rule_selection` (cached per
model, image, layer and the options the rule reads), so a click only reads its query's row. :func:`rule_rows`
computes the rows' distances and overlaps, for one query here and for every query of the page's table
(:mod:`analysis.views.table`), which reads a row back with :func:`query_row`: both answer a query the same way.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import torch

from convnn.functional import padded_to_cells
from convnn.selection import rule_names

from ..session.image_decode import InputImage
from ..session.models import LoadedModel
from ..session.renamed import renamed_keywords
from ..session.selections import (
    LAYER_RULE,
    RuleOptions,
    Selection,
    distance_stats,
    resolve_options,
    rule_selection,
)
from ..session.traces import LayerInfo, query_cell

__all__ = ["NeighborSet", "QueryNeighbors", "RuleTable", "query_neighbors", "query_row", "rule_rows"]


@dataclass(frozen=True)
class NeighborSet:
    """One query's K neighbours under one rule.

    Attributes:
        cells (np.ndarray): (K, 2) int64 ``(row, col)``, rank 0 first (window/blend: raster order of the window).
        is_prefix (np.ndarray): (K,) bool, CLS tokens.
        scores (np.ndarray): (K,) float32 feature similarity to the query.
        mean_distance (float): mean Euclidean distance to the query in cells (NaN if none is on the grid).
        window_share (float): share of the K inside the query's R×R window, in [0, 1].
        candidates (np.ndarray or None): (r, 2) random candidates' cells; ``candidate_is_prefix`` (r,) bool.
    """

    cells: np.ndarray
    is_prefix: np.ndarray
    scores: np.ndarray
    mean_distance: float
    window_share: float
    candidates: np.ndarray | None = None
    candidate_is_prefix: np.ndarray | None = None

    def keys(self) -> set:
        """The neighbours as a set of ``(row, col)`` tuples, ``"CLS"`` for prefix tokens (for :func:`jaccard`)."""
        return {"CLS" if p else (int(r), int(c)) for (r, c), p in zip(self.cells, self.is_prefix, strict=True)}



@dataclass(frozen=True)
class QueryNeighbors:
    """The neighbours of one query in one layer under several rules.

    Attributes:
        layer (LayerInfo): the layer.
        options (RuleOptions): the resolved options used.
        query_px (tuple[int, int]): ``(row_px, col_px)`` in model-input pixels.
        query_cell (tuple[int, int]): ``(row, col)`` in the layer's grid.
        sets (dict[str, NeighborSet]): rule → neighbours, in the requested order, then ``"layer"``.
        overlaps (dict[tuple[str, str], float]): Jaccard overlap of each pair of rules.
    """

    layer: LayerInfo
    options: RuleOptions
    query_px: tuple[int, int]
    query_cell: tuple[int, int]
    sets: dict[str, NeighborSet]
    overlaps: dict[tuple[str, str], float]

    @property
    def random_uses_all_tokens(self) -> bool:
        """Whether r ≥ N, so that the random rule drew every token and equals the "all" rule (METHOD §3)."""
        return self.options.num_candidates >= self.layer.num_tokens


@dataclass(frozen=True, eq=False)
class RuleTable:
    """Some queries' neighbours in one layer under one rule, with their distances (row ``i``: the i-th query).

    Attributes:
        rule (str): the rule (a registered one, or ``"layer"``).
        selection (Selection): (Q, K) cells, prefix flags and scores (rows of :func:`rule_selection`).
        mean_distance (np.ndarray): (Q,) float64 mean distance of the K to their query, in cells (NaN: all CLS).
        window_share (np.ndarray): (Q,) float64 share of the K inside the query's R×R window, in [0, 1].
    """

    rule: str
    selection: Selection
    mean_distance: np.ndarray
    window_share: np.ndarray


def _keys(selection: Selection) -> np.ndarray:
    """(Q, K) int64 key of each neighbour, equal for equal tokens: its cell packed into one integer (padding cells
    too), −1 for a prefix token (CLS)."""
    span = 1 << 20  # cells lie within a window's reach of the grid, far inside ±2¹⁹
    keys = (selection.cells[..., 0] + span // 2) * span + selection.cells[..., 1] + span // 2
    return np.where(selection.is_prefix, -1, keys)


def _distinct(keys: np.ndarray) -> np.ndarray:
    """(Q,) number of distinct values in each row of ``keys`` (Q, M)."""
    ordered = np.sort(keys, axis=1)
    return 1 + (np.diff(ordered, axis=1) != 0).sum(axis=1)


def _jaccard_rows(a: Selection, b: Selection) -> np.ndarray:
    """(Q,) float64 ``|A ∩ B| / |A ∪ B|`` of each query's two neighbour sets (as :func:`analysis.jaccard` of
    their :meth:`NeighborSet.keys`): ``|A ∩ B| = |A| + |B| − |A ∪ B|``."""
    keys_a, keys_b = _keys(a), _keys(b)
    union = _distinct(np.concatenate([keys_a, keys_b], axis=1))
    return (_distinct(keys_a) + _distinct(keys_b) - union) / union


def _rows(selection: Selection, rows: np.ndarray | slice) -> Selection:
    return replace(selection, cells=selection.cells[rows], is_prefix=selection.is_prefix[rows],
                   scores=selection.scores[rows])


@renamed_keywords(probe="layer_info")
def rule_rows(loaded: LoadedModel, image: InputImage, layer_info: LayerInfo, options: RuleOptions,
              rules: tuple[str, ...], rows: np.ndarray | slice = slice(None), draw: int = 0
              ) -> tuple[dict[str, RuleTable], dict[tuple[str, str], np.ndarray]]:
    """The queries ``rows`` (raster cells; all by default) of ``layer_info`` under each of ``rules``, with their
    distances, and the Jaccard overlap of each pair of rules, per query.

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        layer_info (LayerInfo): the layer.
        options (RuleOptions): resolved options (:func:`resolve_options`).
        rules (tuple[str, ...]): registered rules, or ``"layer"``.
        rows (np.ndarray or slice): the queries' raster cells. Default: every query
        draw (int): the eval draw of a model with random candidates (:func:`rule_selection`). Default: 0

    Returns:
        tuple: rule → :class:`RuleTable`, and (a, b) → (Q,) float64 overlaps, in ``rules`` order.
    """
    grid = padded_to_cells(torch.arange(layer_info.height * layer_info.width), layer_info.width, 0).numpy()[rows]
    tables = {}
    for rule in rules:
        sel = _rows(rule_selection(loaded, image, layer_info.name, rule, options, draw), rows)
        mean, share = distance_stats(sel.cells, sel.is_prefix, grid, options.window_size)
        tables[rule] = RuleTable(rule, sel, mean, share)
    overlaps = {(a, b): _jaccard_rows(tables[a].selection, tables[b].selection)
                for a, b in itertools.combinations(tables, 2)}
    return tables, overlaps


@renamed_keywords(probe="layer_info")
def query_row(layer_info: LayerInfo, options: RuleOptions, query_px: tuple[int, int], tables: dict[str, RuleTable],
              overlaps: dict[tuple[str, str], np.ndarray], row: int) -> QueryNeighbors:
    """Row ``row`` of :func:`rule_rows`'s result as the :class:`QueryNeighbors` of the query pixel ``query_px``.

    Raises:
        ValueError: a pixel outside the model input.
    """
    sets = {}
    for rule, table in tables.items():
        sel = table.selection
        sets[rule] = NeighborSet(sel.cells[row], sel.is_prefix[row], sel.scores[row], float(table.mean_distance[row]),
                                 float(table.window_share[row]), sel.candidates, sel.candidate_is_prefix)
    overlap = {pair: float(values[row]) for pair, values in overlaps.items()}
    return QueryNeighbors(layer_info, options, tuple(query_px), query_cell(layer_info, *query_px), sets, overlap)


def query_neighbors(loaded: LoadedModel, image: InputImage, layer: str, query_px: tuple[int, int],
                    options: RuleOptions | None = None, rules: tuple[str, ...] | None = None, draw: int = 0
                    ) -> QueryNeighbors:
    """The neighbours of the query pixel ``query_px`` in ``layer`` under ``rules`` and under the layer itself.

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        layer (str): layer name.
        query_px (tuple[int, int]): ``(row_px, col_px)`` in model-input pixels.
        options (RuleOptions, optional): rule knobs (unset fields from the layer). Default: ``RuleOptions()``
        rules (tuple[str, ...], optional): registered rules to compute. Default: every registered rule
            (:func:`convnn.selection.rule_names`)
        draw (int): the eval draw of a model with random candidates (:func:`rule_selection`). Default: 0

    Returns:
        QueryNeighbors: per rule sets with distances, plus ``"layer"``, and pairwise Jaccard overlaps.

    Raises:
        ValueError: unknown layer or rule, a pixel outside the image, options outside their ranges, or a ``draw``
            that is not an integer ≥ 0.
    """
    layer_info = loaded.layer_info(layer)
    options = resolve_options(layer_info, options or RuleOptions())
    row, col = query_cell(layer_info, *query_px)
    rules = (*(rule_names() if rules is None else rules), LAYER_RULE)
    tables, overlaps = rule_rows(loaded, image, layer_info, options, rules, np.array([row * layer_info.width + col]),
                                draw)
    return query_row(layer_info, options, query_px, tables, overlaps, 0)
