"""The overlay of one query's neighbours under one rule, as marks: the PNG export draws them
(:func:`analysis.rendering.export.overlay_png`), and the page's explorer draws the same colours
(:func:`rank_colors`, :data:`CANDIDATE_COLOR`, sent in :func:`analysis.page_table`).

Which cells are outlined, in which colour, with which rank written in them and which hover text, is decided here;
a renderer only turns a mark's rectangle (model-input pixels) into its own coordinates and line styles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from plotly.colors import sample_colorscale

from ..session.renamed import renamed_keywords
from ..session.traces import LayerInfo, cell_rect_px
from ..views.neighbors import NeighborSet

__all__ = ["MAX_LABELLED_RANKS", "RANK_COLORSCALE", "OverlayMark", "overlay_marks", "rank_colors", "ranks_labelled"]

RANK_COLORSCALE = "Viridis"  # rank 0 (dark purple) → rank K−1 (yellow)
_MIN_LABELLED_CELL_PX = 2  # rank numbers are written inside cells at least this many image pixels wide
MAX_LABELLED_RANKS = 32  # above this K, ranks are shown by colour and on hover only (numbers would overlap)
CANDIDATE_COLOR = "rgb(220, 220, 220)"  # random candidates: a faint outline


@dataclass(frozen=True)
class OverlayMark:
    """One outlined cell of an overlay.

    Attributes:
        role (str): ``"candidate"`` (a random candidate), ``"neighbor"`` (a selected neighbour) or ``"query"``.
        rect_px (tuple[int, int, int, int]): ``(top, left, bottom, right)`` of the cell in model-input pixels,
            bottom/right exclusive (:func:`analysis.session.traces.cell_rect_px`; padding cells lie outside the
            image).
        color (str): ``"rgb(r, g, b)"``; a neighbour's rank colour.
        label (str or None): the rank to write in the cell, when ranks are labelled (:func:`ranks_labelled`).
        hover (str or None): what hovering the cell says (rank, cell, similarity).
    """

    role: str
    rect_px: tuple[int, int, int, int]
    color: str
    label: str | None = None
    hover: str | None = None


def rank_colors(num_neighbors: int) -> list[str]:
    """K colours from :data:`RANK_COLORSCALE`, rank 0 first, as ``"rgb(r, g, b)"`` strings."""
    return sample_colorscale(RANK_COLORSCALE, np.linspace(0, 1, max(num_neighbors, 2)).tolist())[:num_neighbors]


@renamed_keywords(probe="layer_info")
def ranks_labelled(layer_info: LayerInfo, num_neighbors: int) -> bool:
    """Whether rank numbers are written in the cells of ``layer_info``, in the figures and the PNG export alike.

    True for K ≤ :data:`MAX_LABELLED_RANKS` neighbours on cells at least 2 model-input pixels wide; otherwise rank
    is shown by colour only (numbers would overlap or not fit).
    """
    return num_neighbors <= MAX_LABELLED_RANKS and layer_info.input_size / layer_info.height >= _MIN_LABELLED_CELL_PX


@renamed_keywords(probe="layer_info")
def overlay_marks(layer_info: LayerInfo, nset: NeighborSet, query_cell: tuple[int, int]) -> list[OverlayMark]:
    """The marks of one rule's overlay, in drawing order: random candidates, the K neighbours (rank 0 first; prefix
    tokens such as CLS have no cell and no mark), then the query.

    Args:
        layer_info (LayerInfo): the layer (its grid maps cells to pixels).
        nset (NeighborSet): the query's neighbours under the rule.
        query_cell (tuple[int, int]): ``(row, col)`` of the query.

    Returns:
        list[OverlayMark]: the marks.
    """
    marks = []
    if nset.candidates is not None:
        marks += [OverlayMark("candidate", cell_rect_px(layer_info, r, c), CANDIDATE_COLOR)
                  for (r, c), prefix in zip(nset.candidates, nset.candidate_is_prefix, strict=True) if not prefix]
    colors, labelled = rank_colors(len(nset.cells)), ranks_labelled(layer_info, len(nset.cells))
    for rank, ((r, c), prefix, score) in enumerate(zip(nset.cells, nset.is_prefix, nset.scores, strict=True)):
        if not prefix:
            marks.append(OverlayMark("neighbor", cell_rect_px(layer_info, r, c), colors[rank],
                                     str(rank) if labelled else None,
                                     f"rank {rank} · cell ({r}, {c}) · similarity {score:.3f}"))
    marks.append(OverlayMark("query", cell_rect_px(layer_info, *query_cell), "rgb(255, 255, 255)"))
    return marks
