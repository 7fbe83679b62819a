"""Compare mode: several models side by side on one image, one query driving them all (METHOD §2–5).

Each column is a model and one of its layers, by default the layer at the same relative depth (the same fraction of
the way through the model's layers: the same stage and block for models of one architecture); the query pixel is
given in one model's input and mapped onto every other's by its position in the image (:func:`map_pixel`), then
onto each layer's grid as the explorer maps it. The page (``web/compare.js``) draws the columns from each column's
neighbour table (:func:`analysis.neighbor_table`) and maps a click the same way; :func:`compare_neighbors` answers
it in Python.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from convnn.validation import number_range

from ..session.image_decode import InputImage
from ..session.models import LoadedModel
from ..session.selections import RuleOptions
from ..session.state import MAX_COMPARED
from ..session.traces import LayerInfo
from .neighbors import QueryNeighbors, query_neighbors

__all__ = ["MAX_COMPARED", "compare_neighbors", "layer_at_depth", "layer_depth", "map_pixel"]



def layer_at_depth(loaded: LoadedModel, fraction: float) -> LayerInfo:
    """The layer ``fraction`` of the way through ``loaded``'s layers in forward order: index
    ``round(fraction · (L − 1))`` of its L layers (0: the first, 1: the last, 0.5: the middle one).

    Raises:
        ValueError: ``fraction`` not a number from 0 to 1, or a model without layers to show.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0.0 <= fraction <= 1.0:
        raise ValueError(f"the depth must be a fraction {number_range(0, 1)}, got {fraction!r}")
    if not loaded.layer_infos:
        raise ValueError(f"{loaded.card.name} has no layer these views open")
    return loaded.layer_infos[math.floor(fraction * (len(loaded.layer_infos) - 1) + 0.5)]


def layer_depth(loaded: LoadedModel, layer: str) -> float:
    """How far through ``loaded``'s layers ``layer`` is: its index over L − 1 (0 for a model of one layer), written
    with the fewest decimals (2 at least) at which :func:`layer_at_depth` still opens ``layer`` — 0.86, not
    0.8571428571428571, for the 7th of 8 layers: the depth box shows it whole.

    Raises:
        ValueError: ``layer`` is not one of the layers these views open (:meth:`LoadedModel.layer_info`).
    """
    info = loaded.layer_info(layer)
    exact = loaded.layer_infos.index(info) / max(len(loaded.layer_infos) - 1, 1)
    return next(depth for depth in (round(exact, digits) for digits in range(2, 17))
                if layer_at_depth(loaded, depth) is info)


def map_pixel(px: tuple[int, int], from_size: int, to_size: int) -> tuple[int, int]:
    """A pixel of a ``from_size``² model input → the pixel at the same place of a ``to_size``² input: the one holding
    the source pixel's centre, ``⌊(p + ½) · to / from⌋`` per axis (the identity for equal sizes)."""
    return tuple(min(to_size - 1, math.floor((p + 0.5) * to_size / from_size)) for p in px)


def compare_neighbors(models: Sequence[LoadedModel], image: InputImage, layers: Sequence[str],
                      query_px: tuple[int, int], source: int = 0,
                      options: RuleOptions | None = None) -> list[QueryNeighbors]:
    """What one query shows in every column: each model's layer, at the query pixel mapped onto its input.

    Args:
        models (Sequence[LoadedModel]): 2 to :data:`MAX_COMPARED` models, one per column.
        image (InputImage): the image all of them see.
        layers (Sequence[str]): one layer per model (e.g. :func:`layer_at_depth`).
        query_px (tuple[int, int]): ``(row_px, col_px)`` in the input of ``models[source]``.
        source (int): the column the pixel was picked in. Default: 0
        options (RuleOptions, optional): rule knobs, each resolved for its layer. Default: each layer's own

    Returns:
        list[QueryNeighbors]: one per column, in order (:func:`analysis.query_neighbors`).

    Raises:
        ValueError: fewer than 2 or more than :data:`MAX_COMPARED` models, a number of layers other than of models,
            a ``source`` that is not a column, or what :func:`analysis.query_neighbors` refuses (an unknown layer,
            a pixel outside the source model's input).
    """
    if not 2 <= len(models) <= MAX_COMPARED or len(layers) != len(models):
        raise ValueError(f"compare 2 to {MAX_COMPARED} models, one layer each; got {len(models)} models and "
                         f"{len(layers)} layers")
    if not 0 <= source < len(models):
        raise ValueError(f"source must be a column in [0, {len(models) - 1}], got {source}")
    size = models[source].card.input_size
    if not all(0 <= p < size for p in query_px):
        raise ValueError(f"query pixel {tuple(query_px)} is outside the {size}×{size} model input")
    return [query_neighbors(loaded, image, layer, map_pixel(query_px, size, loaded.card.input_size), options)
            for loaded, layer in zip(models, layers, strict=True)]
