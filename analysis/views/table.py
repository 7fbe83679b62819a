"""Everything a click can show for one layer, for every query cell at once: the page's neighbour table.

A click in the explorer page is answered in the browser (docs/method.md §2–3 for what is selected): per
(model, image, layer, rule knobs) the server computes, once, each query's K neighbours and similarity scores under
every registered rule and under the layer itself, the random rule's candidates, each query's mean distance, window
share and pairwise Jaccard overlaps, each neighbour's contribution to the query's output (the layer's own
selection), the λ share of a hybrid layer's output at each cell, and for attention the layer's own selection of
every head. The page only looks rows up and draws them.

Row ``i`` of every array is the query at raster cell ``i`` of the layer's grid; :meth:`NeighborTable.query` reads
one row back as the :class:`~analysis.views.neighbors.QueryNeighbors` that :func:`query_neighbors` computes for one
query, so the page and the Python API answer a query the same way.

The table is bounded: K ≤ :data:`MAX_TABLE_NEIGHBORS` (a 32×32 layer with K = 64 under five rules is ≈ 3 MB as the
page receives it). A larger K (up to K = N, the equivalence demo's setting) gets a table of one query's row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from convnn.selection import rule_names

from ..session.image_decode import InputImage
from ..session.models import LoadedModel
from ..session.selections import LAYER_RULE, RuleOptions, Selection, resolve_options
from ..session.traces import LayerInfo, query_cell
from .neighbors import QueryNeighbors, RuleTable, query_row, rule_rows
from .weights import branch_mix, contribution_norms

__all__ = ["MAX_TABLE_NEIGHBORS", "SWEEP_STEPS", "BlendSweep", "NeighborTable", "blend_sweep", "neighbor_table",
           "page_rules"]

MAX_TABLE_NEIGHBORS = 64  # K up to which every query's neighbours are sent to the page at once
SWEEP_STEPS = 21  # α values of the blend sweep, 0, 0.05, …, 1: the frames of the page's α animation


@dataclass(frozen=True, eq=False)
class NeighborTable:
    """What a click on any query cell of one layer shows (module docstring).

    Attributes:
        layer (LayerInfo): the layer; N = H·W queries in raster order.
        options (RuleOptions): the resolved options.
        rules (dict[str, RuleTable]): rule → its table, registered rules in order, then ``"layer"``.
        overlaps (dict[tuple[str, str], np.ndarray]): (N,) float64 Jaccard overlap of each pair of rules.
        contributions (np.ndarray or None): (N, K_layer) float32 L2 norm of each neighbour's contribution to the
            query's output under the layer's own selection (:func:`contribution_norms`); None for a layer that
            selects nothing (MHSA, a conv-only hybrid).
        branch_share (np.ndarray or None): (N,) float32 ConvNN share of a hybrid layer's mix output per cell, in
            [0, 1] (:func:`branch_mix`); None for other layers.
        heads (tuple[Selection, ...]): for attention with several heads, the layer's own selection of each head
            (``heads[options.head]`` is ``rules["layer"].selection``); empty otherwise.
        queries (np.ndarray or None): (M,) int64 raster cells of the rows when the table holds only some queries
            (K > :data:`MAX_TABLE_NEIGHBORS`: one); None when row ``i`` is cell ``i`` for all N.
    """

    layer: LayerInfo
    options: RuleOptions
    rules: dict[str, RuleTable]
    overlaps: dict[tuple[str, str], np.ndarray]
    contributions: np.ndarray | None
    branch_share: np.ndarray | None
    heads: tuple[Selection, ...]
    queries: np.ndarray | None = None

    def row(self, cell: tuple[int, int]) -> int:
        """The row of the query at ``cell`` = ``(row, col)``.

        Raises:
            ValueError: a table of some queries that does not hold this one.
        """
        index = cell[0] * self.layer.width + cell[1]
        if self.queries is None:
            return index
        if index not in self.queries:
            raise ValueError(f"this table holds the queries at cells {self.queries.tolist()} of {self.layer.name}, "
                             f"not cell {tuple(cell)}")
        return int(np.flatnonzero(self.queries == index)[0])

    def query(self, query_px: tuple[int, int]) -> QueryNeighbors:
        """The row of the query pixel ``query_px`` = ``(row_px, col_px)`` (model-input pixels), as
        :func:`analysis.query_neighbors` gives it.

        Raises:
            ValueError: a pixel outside the model input, or a query the table does not hold (:meth:`row`).
        """
        row = self.row(query_cell(self.layer, *query_px))
        return query_row(self.layer, self.options, query_px, self.rules, self.overlaps, row)


def page_rules() -> tuple[str, ...]:
    """The rules a table holds: every rule registered now (``convnn.selection``), then what the layer used."""
    return (*rule_names(), LAYER_RULE)


def neighbor_table(loaded: LoadedModel, image: InputImage, layer: str, options: RuleOptions | None = None,
                   query_px: tuple[int, int] | None = None, draw: int = 0) -> NeighborTable:
    """Every query's neighbours in ``layer`` under every registered rule and the layer itself (module docstring).

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        layer (str): layer name.
        options (RuleOptions, optional): rule knobs (unset fields from the layer). Default: ``RuleOptions()``
        query_px (tuple[int, int], optional): ``(row_px, col_px)``: the one query of the table when K exceeds
            :data:`MAX_TABLE_NEIGHBORS` (ignored otherwise). Default: None
        draw (int): the eval draw of a model with random candidates (METHOD §3b): the forward pass whose selections,
            contributions and λ mix the table holds, and the key of the random rule's draw. Default: 0

    Returns:
        NeighborTable: every query's row (one row for a K above the bound); ``table.query(px)`` equals
        ``query_neighbors(loaded, image, layer, px, options)``.

    Raises:
        ValueError: unknown layer, options outside their ranges (:func:`resolve_options`), a K above
            :data:`MAX_TABLE_NEIGHBORS` without ``query_px``, a pixel outside the model input, or a ``draw`` that
            is not an integer ≥ 0.
    """
    layer_info = loaded.layer_info(layer)
    options = resolve_options(layer_info, options or RuleOptions())
    queries, rows = None, slice(None)
    if options.num_neighbors > MAX_TABLE_NEIGHBORS:
        if query_px is None:
            raise ValueError(f"a neighbour table of every query covers K ≤ {MAX_TABLE_NEIGHBORS}; for K = "
                             f"{options.num_neighbors} name the query pixel")
        row, col = query_cell(layer_info, *query_px)
        queries = rows = np.array([row * layer_info.width + col])
    rules, overlaps = rule_rows(loaded, image, layer_info, options, page_rules(), rows, draw)
    contributions = None if layer_info.record_name is None else contribution_norms(loaded, image, layer_info.name,
                                                                              options.head, draw)[rows]
    share = branch_mix(loaded, image, layer_info.name, draw).share.reshape(-1)[rows] if layer_info.is_hybrid else None
    heads = () if layer_info.num_heads == 1 else tuple(
        rule_rows(loaded, image, layer_info, replace(options, head=h), (LAYER_RULE,), rows, draw)[0][LAYER_RULE]
        .selection for h in range(layer_info.num_heads))
    return NeighborTable(layer_info, options, rules, overlaps, contributions, share, heads, queries)


@dataclass(frozen=True, eq=False)
class BlendSweep:
    """The blend rule's selection of every query for α from 0 (the window: a convolution) to 1 (all tokens by
    feature similarity: attention), the frames of the page's α animation (METHOD §3).

    Attributes:
        layer (LayerInfo): the layer.
        options (RuleOptions): the resolved options (``blend_alpha`` is the sweep's, not this).
        alphas (np.ndarray): (A,) float64, 0 … 1.
        rules (tuple[RuleTable, ...]): per α, every query's neighbours, mean distance and window share; at α = 0 the
            window rule's and at α = 1 the all rule's exactly (:func:`convnn.selection.effective_selection`).
    """

    layer: LayerInfo
    options: RuleOptions
    alphas: np.ndarray
    rules: tuple[RuleTable, ...]


def blend_sweep(loaded: LoadedModel, image: InputImage, layer: str, options: RuleOptions | None = None,
                steps: int = SWEEP_STEPS, draw: int = 0) -> BlendSweep:
    """Every query's blend selection in ``layer`` at ``steps`` α values from 0 to 1 (each cached as a selection).

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        layer (str): layer name.
        options (RuleOptions, optional): K, R, head (α is swept). Default: the layer's
        steps (int): α values, ≥ 2, evenly spaced. Default: :data:`SWEEP_STEPS`
        draw (int): the eval draw of a model with random candidates, as :func:`neighbor_table`'s. Default: 0

    Returns:
        BlendSweep: one :class:`RuleTable` per α.

    Raises:
        ValueError: as :func:`neighbor_table`; ``steps`` < 2; a K above :data:`MAX_TABLE_NEIGHBORS`.
    """
    if steps < 2:
        raise ValueError(f"a blend sweep needs at least 2 steps, got {steps}")
    layer_info = loaded.layer_info(layer)
    options = resolve_options(layer_info, options or RuleOptions())
    if options.num_neighbors > MAX_TABLE_NEIGHBORS:
        raise ValueError(f"the α animation covers K ≤ {MAX_TABLE_NEIGHBORS}, got K = {options.num_neighbors}")
    alphas = np.linspace(0.0, 1.0, steps)
    rules = [rule_rows(loaded, image, layer_info, replace(options, blend_alpha=float(alpha)), ("blend",),
                       draw=draw)[0]["blend"]
             for alpha in alphas]
    return BlendSweep(layer_info, options, alphas, tuple(rules))
