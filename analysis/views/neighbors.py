"""The view of one query: its neighbours in a layer under every rule, with distances and overlaps (METHOD §2–3).

Every rule's selection of the whole layer comes from :func:`analysis.session.selections.rule_selection` (cached per
model, image, layer and the options the rule reads), so a click only reads its query's row.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from convnn.selection import rule_names

from ..session.images import InputImage
from ..session.models import LoadedModel
from ..session.selections import LAYER_RULE, RuleOptions, distance_stats, jaccard, resolve_options, rule_selection
from ..session.traces import LayerInfo, query_cell

__all__ = ["NeighborSet", "QueryNeighbors", "query_neighbors"]


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


def query_neighbors(loaded: LoadedModel, image: InputImage, layer: str, query_px: tuple[int, int],
                    options: RuleOptions | None = None, rules: tuple[str, ...] | None = None) -> QueryNeighbors:
    """The neighbours of the query pixel ``query_px`` in ``layer`` under ``rules`` and under the layer itself.

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        layer (str): probe layer name.
        query_px (tuple[int, int]): ``(row_px, col_px)`` in model-input pixels.
        options (RuleOptions, optional): rule knobs (unset fields from the layer). Default: ``RuleOptions()``
        rules (tuple[str, ...], optional): registered rules to compute. Default: every registered rule
            (:func:`convnn.selection.rule_names`)

    Returns:
        QueryNeighbors: per rule sets with distances, plus ``"layer"``, and pairwise Jaccard overlaps.

    Raises:
        ValueError: unknown layer or rule, a pixel outside the image, or options outside their ranges.
    """
    probe = loaded.probe(layer)
    options = resolve_options(probe, options or RuleOptions())
    row, col = query_cell(probe, *query_px)
    index = row * probe.width + col
    sets = {}
    for rule in (*(rule_names() if rules is None else rules), LAYER_RULE):
        sel = rule_selection(loaded, image, layer, rule, options)
        mean, share = distance_stats(sel.cells[index:index + 1], sel.is_prefix[index:index + 1],
                                     np.array([[row, col]]), options.window_size)
        sets[rule] = NeighborSet(sel.cells[index], sel.is_prefix[index], sel.scores[index], float(mean[0]),
                                 float(share[0]), sel.candidates, sel.candidate_is_prefix)
    overlaps = {(a, b): jaccard(sets[a].keys(), sets[b].keys()) for a, b in itertools.combinations(sets, 2)}
    return QueryNeighbors(probe, options, tuple(query_px), (row, col), sets, overlaps)
