"""Exports of a query's neighbours: a JSON-ready dict, a Markdown summary and a PNG overlay rendered with PIL.

Plotly's own PNG export needs Kaleido and a browser, which an offline install may lack; the overlay PNG is drawn
here instead, pixel for pixel, from the same marks as the figures (:func:`analysis.rendering.overlay.overlay_marks`:
rank colours, which ranks are written in the cells, candidates and the query).
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
from PIL import Image, ImageColor, ImageDraw

from ..session.image_decode import InputImage
from ..session.image_display import model_view, upscale_nearest
from ..session.models import LoadedModel
from ..session.renamed import renamed_keywords
from ..session.selections import RuleOptions, rule_title
from ..session.traces import LayerInfo, cell_rect_px
from ..session.workspace import EXPORTS, Workspace
from ..views.neighbors import QueryNeighbors
from .overlay import overlay_marks

__all__ = [
    "MAX_LISTED_CELLS",
    "export_query",
    "neighbor_notes",
    "neighbors_summary",
    "neighbors_to_dict",
    "overlay_png",
    "query_record",
]

_PNG_PANEL_PX = 320  # side of one panel of the PNG overlay (the image is upscaled by an integer factor to about it)
_CAPTION_PX = 22  # height of the caption strip above each panel
_PANEL_GAP_PX = 8
# Pillow's default font has no Greek letters nor these signs: the PNG spells them (the page and the JSON keep them)
_PNG_SPELLING = str.maketrans({"α": "alpha", "×": "x", "−": "-", "²": "^2"})
MAX_LISTED_CELLS = 32  # neighbour cells listed per rule in the summary (all of them are in the JSON export)


def neighbors_to_dict(neighbors: QueryNeighbors) -> dict:
    """A JSON-serialisable description of the query's neighbours under every rule.

    Returns:
        dict: ``layer``, ``grid`` [H, W], ``query`` (pixel and cell), ``options``, and per rule ``neighbors``
        (rank, row, col, is_cls, pixel rectangle [top, left, bottom, right) in model-input pixels, similarity),
        ``mean_distance_cells``, ``window_share``, ``candidates`` (random rule), and ``jaccard`` per pair.
    """
    layer_info = neighbors.layer
    rules = {}
    for rule, nset in neighbors.sets.items():
        items = []
        for rank, ((r, c), prefix, score) in enumerate(zip(nset.cells, nset.is_prefix, nset.scores, strict=True)):
            items.append({"rank": rank, "row": None if prefix else int(r), "col": None if prefix else int(c),
                          "is_cls": bool(prefix), "rect_px": None if prefix else list(cell_rect_px(layer_info, r, c)),
                          "similarity": float(score)})
        entry = {"neighbors": items, "mean_distance_cells": None if math.isnan(nset.mean_distance)
                 else nset.mean_distance, "window_share": nset.window_share}
        if nset.candidates is not None:
            entry["candidates"] = [None if p else [int(r), int(c)]
                                   for (r, c), p in zip(nset.candidates, nset.candidate_is_prefix, strict=True)]
        rules[rule] = entry
    return {
        "layer": layer_info.name,
        "grid": [layer_info.height, layer_info.width],
        "input_size_px": layer_info.input_size,
        "query": {"row_px": neighbors.query_px[0], "col_px": neighbors.query_px[1],
                  "row": neighbors.query_cell[0], "col": neighbors.query_cell[1]},
        "options": asdict(neighbors.options),
        "rules": rules,
        "jaccard": {f"{a}|{b}": value for (a, b), value in neighbors.overlaps.items()},
    }


def neighbors_summary(neighbors: QueryNeighbors) -> str:
    """The query's neighbours as Markdown: a table of rules, the Jaccard overlaps and notes on what is shown.

    Returns:
        str: per rule the mean distance (cells), the share in the R×R window and the first :data:`MAX_LISTED_CELLS`
        cells in rank order; the overlaps; a note when r ≥ N made the random rule the all rule; and what cells
        outside the grid are (zero padding of a map, or, for a ViT, padding the layer itself cannot select).
    """
    rows = ["| rule | mean distance (cells) | in R×R window | neighbour cells, rank order |", "|---|---|---|---|"]
    for rule, nset in neighbors.sets.items():
        cells = ["CLS" if p else f"({r},{c})" for (r, c), p in zip(nset.cells, nset.is_prefix, strict=True)]
        more = len(cells) - MAX_LISTED_CELLS
        listed = ", ".join(cells[:MAX_LISTED_CELLS]) + (f", … {more} more (in the JSON export)" if more > 0 else "")
        rows.append(f"| {rule_title(rule)} | {nset.mean_distance:.2f} | {100 * nset.window_share:.0f}% | {listed} |")
    overlaps = " · ".join(f"{a}/{b} {v:.2f}" for (a, b), v in neighbors.overlaps.items())
    notes = [f"**Jaccard overlap:** {overlaps}", *neighbor_notes(neighbors.layer, neighbors.options)]
    return "\n".join(rows) + "\n\n" + "\n\n".join(notes)


@renamed_keywords(probe="layer_info")
def neighbor_notes(layer_info: LayerInfo, options: RuleOptions) -> list[str]:
    """What a reader of the neighbours of ``layer_info`` under resolved ``options`` should know, one sentence each: that
    r ≥ N made the random rule the all rule, that MHSA selects nothing, that a strided or dilated convolution's window
    is not centred on the query, that a strided ConvNN layer's cells show their outputs' queries' selections, and
    what cells outside the grid are (zero padding of a map, or, for a ViT, padding
    the layer itself cannot select)."""
    notes = []
    stride, grid = layer_info.stride, f"{layer_info.height}×{layer_info.width}"
    if options.num_candidates >= layer_info.num_tokens:
        notes.append(f"r = {options.num_candidates} ≥ N = {layer_info.num_tokens} tokens: the random rule draws every "
                     "token, so it equals the all-tokens rule (METHOD §3).")
    if layer_info.dense:
        notes.append(f"{layer_info.name} is plain multi-head attention: it attends to every one of its "
                     f"{layer_info.num_tokens} tokens and selects none; \"what the layer used\" shows its "
                     f"{options.num_neighbors} largest attention weights of the query.")
    if layer_info.conv_only and not layer_info.is_hybrid and (stride > 1 or layer_info.dilation > 1):
        notes.append(f"A plain convolution with stride {stride} and dilation {layer_info.dilation}: it computes one "
                     f"output per {stride}×{stride} cells of this {grid} input, so "
                     "\"what the layer used\" is the window of the output covering the query (METHOD §8), not a "
                     "window centred on it as the window rule's.")
    elif not layer_info.is_attention and (
            stride > 1 or layer_info.padding != layer_info.dilation * (layer_info.window_size // 2)):
        notes.append(f"A ConvNN layer with stride {stride} and padding {layer_info.padding}: its queries are the "
                     f"centres of the windows a convolution would read, one per {stride}×{stride} cells "
                     f"of this {grid} input, so \"what the layer used\" at a cell is the "
                     "selection of the last query at or before it on each axis (its rank 0, METHOD §3a).")
    if layer_info.is_attention:
        notes.append("A ViT has no zero padding: the window and blend rules treat the patch grid as a zero-padded "
                     "image here, so cells outside it, such as (-1,-1), are padding positions this layer cannot "
                     "select (the all-tokens rule and the layer's own selection never contain them).")
    else:
        notes.append("Cells outside the map, such as (-1,-1), are zero-padding positions: candidates exactly as in a "
                     "zero-padded convolution.")
    return notes


def blend_window_note(options: RuleOptions, overlaps: dict[tuple[str, str], np.ndarray]) -> str | None:
    """The page's note when the blend rule picks exactly the window's cells for most queries (METHOD §3): at that
    α the spatial term still outweighs the features, which a reader would otherwise take for a fault.

    Args:
        options (RuleOptions): the resolved options (``blend_alpha``).
        overlaps (dict): (a, b) → (Q,) Jaccard overlaps of each pair of rules
            (:func:`analysis.views.neighbors.rule_rows`).

    Returns:
        str or None: the note, or None unless the window and blend sets are equal for at least half the queries.
    """
    pair = overlaps.get(("window", "blend"), overlaps.get(("blend", "window")))
    if pair is None or not len(pair):
        return None
    share = float(np.mean(pair == 1.0))
    if share < 0.5:
        return None
    return (f"At α = {options.blend_alpha:g} the blend rule picks exactly the window's cells for {share:.0%} of this "
            "layer's queries: the spatial term (1 − α)·spatial, 1 at the query and e^−½ on the window's border, "
            "still outweighs α times the features' similarity (scaled to [0, 1]). Raise α, or press ▶ α, to watch "
            "the features take over.")


def _draw_panel(view: np.ndarray, neighbors: QueryNeighbors, rule: str) -> Image.Image:
    layer_info, size = neighbors.layer, view.shape[0]
    factor = max(1, _PNG_PANEL_PX // size)
    margin = math.ceil(neighbors.options.window_size // 2 * size / layer_info.height) * factor
    side = size * factor + 2 * margin
    panel = Image.new("RGB", (side, side + _CAPTION_PX), (128, 128, 128))
    panel.paste(Image.fromarray(upscale_nearest(view, factor)), (margin, margin + _CAPTION_PX))
    draw = ImageDraw.Draw(panel)
    nset = neighbors.sets[rule]
    title = rule_title(rule)
    if rule == "blend":
        title = title.replace("α", f"α = {neighbors.options.blend_alpha:g}")
    draw.text((4, 4), f"{title}: {nset.mean_distance:.2f} cells".translate(_PNG_SPELLING), fill=(255, 255, 255))

    def box(rect_px: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        top, left, bottom, right = rect_px
        y0 = margin + _CAPTION_PX
        return left * factor + margin, top * factor + y0, right * factor + margin - 1, bottom * factor + y0 - 1

    for mark in overlay_marks(layer_info, nset, neighbors.query_cell):
        x0, y0, x1, y1 = box(mark.rect_px)
        if mark.role == "query":  # white with a black inner line
            draw.rectangle((x0, y0, x1, y1), outline=(255, 255, 255), width=3)
            draw.rectangle((x0, y0, x1, y1), outline=(0, 0, 0), width=1)
            continue
        width = max(1, factor // 3) if mark.role == "neighbor" else 1
        draw.rectangle((x0, y0, x1, y1), outline=ImageColor.getrgb(mark.color), width=width)
        if mark.label is not None:
            draw.text((x0 + 3, y0 + 2), mark.label, fill=(255, 255, 255))
    return panel


def overlay_png(view: np.ndarray, neighbors: QueryNeighbors, rules: tuple[str, ...] | None = None,
                title: str | None = None) -> Image.Image:
    """The neighbour overlays the page draws (one panel per rule, as :func:`analysis.rendering.figures.mask_panel`
    draws masks) as one PIL image, panels side by side.

    Args:
        view (np.ndarray): (S, S, 3) uint8 model view of the image.
        neighbors (QueryNeighbors): the query's neighbours.
        rules (tuple[str, ...], optional): which rules, in order. Default: every set in ``neighbors``
        title (str, optional): a line above the panels (what the picture is of: model, layer, query, knobs).

    Returns:
        Image.Image: RGB; each panel is the image upscaled nearest-neighbour to about 320 px, neighbour cells
        outlined in rank colours, the query cell white with a black inner line, random candidates light grey;
        each captioned with its rule (the blend rule with its α) and mean distance.
    """
    panels = [_draw_panel(view, neighbors, rule) for rule in rules or tuple(neighbors.sets)]
    width = sum(p.width for p in panels) + _PANEL_GAP_PX * (len(panels) - 1)
    top = _CAPTION_PX if title else 0
    strip = Image.new("RGB", (width, top + max(p.height for p in panels)), (255, 255, 255))
    if title:
        ImageDraw.Draw(strip).text((4, 4), title.translate(_PNG_SPELLING), fill=(0, 0, 0))
    x = 0
    for panel in panels:
        strip.paste(panel, (x, top))
        x += panel.width + _PANEL_GAP_PX
    return strip


def _export_title(card_name: str, neighbors: QueryNeighbors) -> str:
    """The exported PNG's first line: model, layer, query pixel and the rules' knobs."""
    options, (row_px, col_px) = neighbors.options, neighbors.query_px
    return (f"{card_name} · {neighbors.layer.name} · query pixel ({row_px}, {col_px}) · K = {options.num_neighbors},"
            f" R = {options.window_size}, r = {options.num_candidates}, seed = {options.seed},"
            f" α = {options.blend_alpha:g}")


def query_record(loaded: LoadedModel, image: InputImage, neighbors: QueryNeighbors) -> dict:
    """:func:`neighbors_to_dict` plus where it comes from: ``checkpoint`` (the card's name) and ``image_sha256``."""
    return neighbors_to_dict(neighbors) | {"checkpoint": loaded.card.name, "image_sha256": image.digest}


def export_query(workspace: Workspace, session: str | None, loaded: LoadedModel, image: InputImage,
                 neighbors: QueryNeighbors, visitor: str | None = None, address: str | None = None
                 ) -> tuple[Path, Path]:
    """Write the query's :func:`overlay_png` and its :func:`query_record` JSON as a new export of ``session``,
    charged to ``visitor``'s share of the workspace (default: the session's) and to ``address``'s ceiling (default:
    none).

    Returns:
        tuple[Path, Path]: the PNG and the JSON, in a fresh entry of ``workspace``, named by the server from the
        image digest, the layer and the query pixel (``neighbors-<digest>-<layer>-<row>-<col>``): nothing the card
        says becomes part of a name.

    Raises:
        ValueError: the workspace, or the visitor's share or address's ceiling of it, has no room for them, or the
            disk is full (nothing is written).
    """
    row_px, col_px = neighbors.query_px
    stem = f"neighbors-{image.digest[:10]}-{neighbors.layer.name}-{row_px}-{col_px}".replace(".", "_")
    png = io.BytesIO()
    overlay_png(model_view(image, loaded.card.input_size), neighbors,
                title=_export_title(loaded.card.name, neighbors)).save(png, format="PNG")
    data = json.dumps(query_record(loaded, image, neighbors), indent=1).encode()
    entry = workspace.add(session, EXPORTS, {f"{stem}.png": png.getvalue(), f"{stem}.json": data}, visitor,
                          address)
    return entry / f"{stem}.png", entry / f"{stem}.json"
