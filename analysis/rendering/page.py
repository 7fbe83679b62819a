"""The neighbour table as the explorer page receives it: one JSON object, its arrays packed as base64.

The page (``web/explorer.js``) decodes each array once into a typed array and, for a click or a hover, only looks
rows up: which cells to outline, in which colour, the ranks, the scores, the statistics and the contributions all
come from here, so the page computes nothing the Python API could answer differently.

Packing (little-endian, base64): neighbour cells ``int16`` (row, col) pairs, N·K·2 per rule (prefix tokens as
:data:`PREFIX_CELL`); scores, statistics, contributions and shares ``float32`` (NaN as JSON has none: a NaN
mean distance stays NaN in the typed array). A 32×32 layer with K = 9 under five rules is ≈ 0.4 MB.
"""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

from convnn import ModelCard

from ..session.image_decode import InputImage
from ..session.renamed import renamed_keywords
from ..session.selections import Selection, rule_title
from ..session.traces import LayerInfo, cell_rect_px, layer_label
from ..views.draws import DrawSpread
from ..views.spectrum import ReceptiveFields
from ..views.table import BlendSweep, NeighborTable
from .export import blend_window_note, neighbor_notes
from .overlay import CANDIDATE_COLOR, MAX_LABELLED_RANKS, rank_colors

__all__ = ["PAGE_TABLE_VERSION", "PREFIX_CELL", "page_hops", "page_json", "page_sweep", "page_table"]

PAGE_TABLE_VERSION = 1
_JS_SAFE_INTEGER = 2**53 - 1  # Number.MAX_SAFE_INTEGER
PREFIX_CELL = -32768  # the int16 row and col of a prefix token (CLS), which has no cell


def _packed(values: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()).decode()


def _cells(cells: np.ndarray, is_prefix: np.ndarray) -> str:
    return _packed(np.where(is_prefix[..., None], PREFIX_CELL, cells), "int16")


def _selection(selection: Selection) -> dict:
    entry = {"k": int(selection.cells.shape[1]), "cells": _cells(selection.cells, selection.is_prefix),
             "scores": _packed(selection.scores, "float32")}
    if selection.candidates is not None:
        entry["candidates"] = _cells(selection.candidates, selection.candidate_is_prefix)
    return entry


def _outside(selection: Selection, layer_info: LayerInfo) -> int:
    """How many cells beyond the grid the selection reaches (a dilated window, a layer's own padding: METHOD §3a)."""
    cells = selection.cells[~selection.is_prefix]
    if not cells.size:
        return 0
    return int(max(0, -cells.min(), cells[:, 0].max() - layer_info.height + 1,
                   cells[:, 1].max() - layer_info.width + 1))


def _edges(layer_info: LayerInfo, padding: int) -> tuple[list[int], list[int]]:
    """Pixel edges of the rows and columns ``−padding … H + padding`` (``W``): cell ``r`` spans
    ``[edges[r + padding], edges[r + padding + 1])`` (:func:`analysis.cell_rect_px`)."""
    rows = [cell_rect_px(layer_info, r, 0)[0] for r in range(-padding, layer_info.height + padding + 1)]
    cols = [cell_rect_px(layer_info, 0, c)[1] for c in range(-padding, layer_info.width + padding + 1)]
    return rows, cols


def _cell_of_px(layer_info: LayerInfo) -> dict[str, list[int]]:
    """``row_cell_of_px`` / ``col_cell_of_px``: the cell covering each model-input pixel (as ``query_cell``)."""
    size = layer_info.input_size
    return {"row_cell_of_px": [r * layer_info.height // size for r in range(size)],
            "col_cell_of_px": [c * layer_info.width // size for c in range(size)]}


def _png(view: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(view).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _named(card: ModelCard, image: InputImage | None, draw: int | None) -> dict:
    """What a table and the α animation's frames are of, the same way in both (the page plays frames only over the
    table they name): ``version``, ``model`` (the card's name), ``image_sha256`` (None without an image) and
    ``draw``."""
    return {"version": PAGE_TABLE_VERSION, "model": card.name, "image_sha256": image.digest if image else None,
            "draw": draw}


def page_table(view: np.ndarray, table: NeighborTable, query_px: tuple[int, int], card: ModelCard,
               prediction: dict[str, float], image: InputImage | None = None, keep_query: bool = False,
               draw: int | None = None, spread: DrawSpread | None = None) -> dict:
    """The explorer page's value for one (model, image, layer, options): the table and how to draw it.

    Args:
        view (np.ndarray): (S, S, 3) uint8, what the model sees (:func:`analysis.model_view`).
        table (NeighborTable): the layer's table (:func:`analysis.neighbor_table`).
        query_px (tuple[int, int]): the query pixel to show first, ``(row_px, col_px)`` in model-input pixels.
        card (ModelCard): the model's card: its name for the caption, the classes it knows.
        prediction (dict[str, float]): the top classes → probability (:func:`analysis.top_classes`, in ``draw``).
        image (InputImage, optional): the image ``view`` shows: its note (what was done to it on arrival) and its
            digest go to the page. Default: None
        keep_query (bool): whether the page keeps the query it shows (a new table for the same image: other
            knobs or another layer) rather than take ``query_px`` (a new image or model). Default: False
        draw (int, optional): the eval draw the table and the prediction come from, for a model with random
            candidates; None for any other (every draw is the same). Default: None
        spread (DrawSpread, optional): the model's answer over its eval draws (:func:`analysis.draw_spread`),
            for a model with random candidates. Default: None

    Returns:
        dict: JSON-ready. ``version``, ``model``, ``classes`` (all the model knows), ``prediction`` (a list of
        ``[class, probability]``, most probable first), ``draw`` and ``spread`` (None, or ``draws``, ``shares``: a
        list of ``[class, share of top-1]`` most frequent first, ``top_class`` and ``top_probability`` [min, max]),
        ``image_note``, ``image_sha256``, ``layer``, ``label``, ``input_size`` S, ``grid`` [H, W], ``padding``
        (cells drawn around the grid), ``row_edges_px`` /
        ``col_edges_px``, ``row_cell_of_px`` / ``col_cell_of_px`` (S entries: the cell covering each pixel, as
        :func:`analysis.query_cell`), ``image`` (PNG data URL of ``view``), ``query_px``, ``queries`` (the
        rows' cells when the table holds some queries, else None), ``keep_query``, ``options``, ``rules`` (a list:
        ``name``, ``title``, ``k``, ``cells``, ``scores``, ``mean_distance``, ``window_share``, ``candidates`` for
        the random rule), ``jaccard`` ({"a|b": (N,) float32}),
        ``contributions`` ((N, K) float32 or None), ``branch_share`` / ``branch_ratio``, ``heads`` (per head
        ``cells``/``scores``), ``colors`` (K rank colours, rank 0 first), ``candidate_color``,
        ``max_labelled_ranks`` and ``notes`` (:func:`analysis.neighbor_notes`, then
        :func:`analysis.blend_window_note`'s when it has one).
    """
    layer_info, options = table.layer, table.options
    size = layer_info.input_size
    padding = max(options.window_size // 2, *(_outside(rule.selection, layer_info) for rule in table.rules.values()))
    row_edges, col_edges = _edges(layer_info, padding)
    rules = []
    for name, rule in table.rules.items():
        entry = {"name": name, "title": rule_title(name), **_selection(rule.selection),
                 "mean_distance": _packed(rule.mean_distance, "float32"),
                 "window_share": _packed(rule.window_share, "float32")}
        rules.append(entry)
    k_max = max(rule["k"] for rule in rules)
    return {
        **_named(card, image, draw),
        "classes": list(card.classes),
        "prediction": [[name, probability] for name, probability in prediction.items()],
        "spread": None if spread is None else {
            "draws": spread.draws, "shares": [[name, float(share)] for name, share in spread.shares.items()],
            "top_class": spread.top_class, "top_probability": [float(p) for p in spread.top_probability]},
        "image_note": image.note if image else "",
        "layer": layer_info.name,
        "label": layer_label(layer_info),
        "input_size": size,
        "grid": [layer_info.height, layer_info.width],
        "num_prefix_tokens": layer_info.num_prefix_tokens,
        "padding": padding,
        "row_edges_px": row_edges,
        "col_edges_px": col_edges,
        **_cell_of_px(layer_info),
        "image": _png(view),
        "query_px": [int(query_px[0]), int(query_px[1])],
        "queries": None if table.queries is None else table.queries.tolist(),
        "keep_query": keep_query,
        "options": {"num_neighbors": options.num_neighbors, "window_size": options.window_size,
                    "num_candidates": options.num_candidates, "seed": str(options.seed),
                    "blend_alpha": options.blend_alpha, "head": options.head},
        "rules": rules,
        "jaccard": {f"{a}|{b}": _packed(values, "float32") for (a, b), values in table.overlaps.items()},
        "contributions": None if table.contributions is None else _packed(table.contributions, "float32"),
        "branch_share": None if table.branch_share is None else _packed(table.branch_share, "float32"),
        "branch_ratio": layer_info.branch_ratio if layer_info.is_hybrid else None,
        "heads": [_selection(head) for head in table.heads],
        "colors": rank_colors(k_max),
        "candidate_color": CANDIDATE_COLOR,
        "max_labelled_ranks": MAX_LABELLED_RANKS,
        "notes": [*neighbor_notes(layer_info, options),
                  *filter(None, [blend_window_note(options, table.overlaps)])],
    }


def page_json(value: object) -> object:
    """A JSON value as a page shows it exactly: integers beyond ±2⁵³ (seeds of up to 64 bits), which JavaScript's
    numbers would round, become their decimal strings, at any depth of lists and dicts (no recursion). The
    downloaded file keeps the integers; this is for a preview drawn in the page.

    Returns:
        object: a copy of ``value``, lists and dicts rebuilt, other values as they were.
    """
    root: list = [None]
    stack: list[tuple[object, object, object]] = [(value, root, 0)]
    while stack:
        item, parent, key = stack.pop()
        if isinstance(item, dict):
            copy: dict | list = {}
            stack.extend((child, copy, name) for name, child in item.items())
        elif isinstance(item, list | tuple):
            copy = [None] * len(item)
            stack.extend((child, copy, index) for index, child in enumerate(item))
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > _JS_SAFE_INTEGER:
            copy = str(item)
        else:
            copy = item
        parent[key] = copy
    return root[0]


@renamed_keywords(probe="layer_info")
def page_hops(view: np.ndarray, fields: ReceptiveFields, layer_info: LayerInfo) -> dict:
    """The multi-hop view's value: the receptive field of every query cell, or of the ones asked for where every
    query's would be more than one table (:func:`analysis.receptive_fields`).

    Args:
        view (np.ndarray): (S, S, 3) uint8, what the model sees.
        fields (ReceptiveFields): the fields of queries of ``layer_info``.
        layer_info (LayerInfo): the layer of hop 1.

    Returns:
        dict: JSON-ready. ``layer``, ``input_size`` S, ``grid`` [H, W], ``row_cell_of_px`` / ``col_cell_of_px``,
        ``image`` (PNG data URL), ``layers`` (the layer of each hop ≥ 1), ``hops`` ((Q, S, S) int8, −1 where no
        hop reaches), ``pixel_counts`` ((Q, hops + 1) int32, cumulative), ``queries`` (the raster cell of each of
        the Q rows; None: every cell, in order) and ``colors`` (one per hop, hop 0 first).
    """
    return {
        "version": PAGE_TABLE_VERSION,
        "layer": layer_info.name,
        "input_size": layer_info.input_size,
        "grid": [layer_info.height, layer_info.width],
        **_cell_of_px(layer_info),
        "image": _png(view),
        "layers": fields.layers,
        "hops": _packed(fields.hops, "int8"),
        "pixel_counts": _packed(fields.pixel_counts, "int32"),
        "queries": None if fields.queries is None else list(fields.queries),
        "colors": rank_colors(len(fields.layers) + 1),
    }


def page_sweep(sweep: BlendSweep, card: ModelCard, image: InputImage, draw: int | None = None) -> dict:
    """The α animation's value: every query's blend selection at each α (:func:`analysis.blend_sweep`), named as
    :func:`page_table` names its table (model, image, draw, layer, options), so that the page plays it only over the
    table it was made for (frames asked for before a new image came were played over it).

    Args:
        sweep (BlendSweep): the frames.
        card (ModelCard): the model's card (its name).
        image (InputImage): the image the frames were made on (its digest).
        draw (int, optional): the eval draw, for a model with random candidates; None for any other (as
            :func:`page_table`). Default: None

    Returns:
        dict: JSON-ready. ``model``, ``image_sha256``, ``draw``, ``layer``, ``grid`` [H, W], ``options``,
        ``alphas`` (A floats), ``k``, ``cells`` ((A, N, K, 2) int16, prefix tokens as :data:`PREFIX_CELL`),
        ``mean_distance`` and ``window_share`` ((A, N) float32 each).
    """
    layer_info, options = sweep.layer, sweep.options
    return {
        **_named(card, image, draw),
        "layer": layer_info.name,
        "grid": [layer_info.height, layer_info.width],
        "options": {"num_neighbors": options.num_neighbors, "window_size": options.window_size,
                    "head": options.head},
        "alphas": [float(alpha) for alpha in sweep.alphas],
        "k": options.num_neighbors,
        "cells": _cells(np.stack([r.selection.cells for r in sweep.rules]),
                        np.stack([r.selection.is_prefix for r in sweep.rules])),
        "mean_distance": _packed(np.stack([r.mean_distance for r in sweep.rules]), "float32"),
        "window_share": _packed(np.stack([r.window_share for r in sweep.rules]), "float32"),
    }
