"""Every Plotly figure of the explorer (the only module that makes figures).

Conventions: fixed heights, units in titles and axis labels, colour-blind-safe palettes (Viridis/Cividis for
sequential values, a diverging RdBu for signed ones, Okabe–Ito for categories). Images are drawn pixel for pixel
(``go.Image``: pixel ``(row, col)`` is centred at ``x = col, y = row``), so a cell's outline is its pixel rectangle
± 0.5. Plotly renders a subset of HTML in its text (``<a href>`` becomes a link), so text from a model card (class
names) is escaped (:func:`html.escape`) before it reaches a figure.
"""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from convnn.introspect import DEFAULT_WINDOW

from ..session.selections import rule_title
from ..session.traces import LayerInfo
from ..views.attribution import Attribution
from ..views.neighbors import NeighborSet, QueryNeighbors
from ..views.pixels import PixelNeighbors
from ..views.spectrum import ReceptiveField, SpectrumRow
from ..views.weights import AggregationKernel, BranchMix, Contributions
from .overlay import overlay_marks, rank_colors, ranks_labelled

__all__ = [
    "OKABE_ITO",
    "PANEL_HEIGHT",
    "attribution_figure",
    "bar_figure",
    "contribution_figure",
    "heatmap_figure",
    "hop_figure",
    "kernel_figures",
    "mask_panel",
    "mix_figure",
    "neighbor_panel",
    "pixel_figure",
    "spectrum_figure",
]

PANEL_HEIGHT = 380  # px, every image panel
CHART_HEIGHT = 320  # px, bar charts and heatmaps
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")  # colour-blind


def _image_axes(fig: go.Figure, size: int, margin: float, row: int = 1, col: int = 1) -> None:
    fig.update_xaxes(range=[-0.5 - margin, size - 0.5 + margin], showticklabels=False, showgrid=False,
                     zeroline=False, row=row, col=col)
    fig.update_yaxes(range=[size - 0.5 + margin, -0.5 - margin], showticklabels=False, showgrid=False,
                     zeroline=False, scaleanchor=f"x{'' if (row, col) == (1, 1) else (row - 1) * 100 + col}",
                     row=row, col=col)


def _axis_refs(col: int) -> dict:
    """``xref``/``yref`` of the subplot in column ``col`` of a one-row :func:`make_subplots` figure."""
    suffix = "" if col == 1 else str(col)
    return dict(xref=f"x{suffix}", yref=f"y{suffix}")


def _neighbor_overlay(probe: LayerInfo, nset: NeighborSet, query_cell: tuple[int, int], col: int
                      ) -> tuple[list[dict], go.Scatter]:
    """The marks of :func:`analysis.rendering.overlay.overlay_marks` as Plotly: outlines as layout shape dicts for
    subplot ``col`` (the caller assigns all panels' shapes at once: adding shapes one by one is quadratic in Plotly)
    and one trace marking each neighbour, with its rank as text when ranks are labelled, else a hover label only."""
    refs, shapes, xs, ys, texts, hovers, colors = _axis_refs(col), [], [], [], [], [], []
    styles = {"candidate": dict(width=1, dash="dot"), "neighbor": dict(width=2.5)}
    for mark in overlay_marks(probe, nset, query_cell):
        top, left, bottom, right = mark.rect_px
        box = dict(type="rect", x0=left - 0.5, x1=right - 0.5, y0=top - 0.5, y1=bottom - 0.5, **refs)
        if mark.role == "query":  # white with a black inner line
            shapes += [dict(box, line=dict(color="white", width=4)), dict(box, line=dict(color="black", width=1.5))]
            continue
        shapes.append(dict(box, line=dict(color=mark.color, **styles[mark.role])))
        if mark.role == "neighbor":
            xs.append((left + right - 1) / 2)
            ys.append((top + bottom - 1) / 2)
            texts.append(mark.label or "")
            hovers.append(mark.hover)
            colors.append(mark.color)
    marks = go.Scatter(x=xs, y=ys, mode="text" if ranks_labelled(probe, len(nset.cells)) else "markers",
                       text=texts, hovertext=hovers, hoverinfo="text", textfont=dict(color="white", size=11),
                       marker=dict(size=4, color=colors), showlegend=False)
    return shapes, marks


def neighbor_panel(view: np.ndarray, neighbors: QueryNeighbors, rules: tuple[str, ...] | None = None) -> go.Figure:
    """Side-by-side overlays of the query's neighbours under each rule, on the model's view of the image.

    Args:
        view (np.ndarray): (S, S, 3) uint8, the model input as an image (:func:`analysis.images.model_view`).
        neighbors (QueryNeighbors): the query's neighbour sets.
        rules (tuple[str, ...], optional): which sets, in order. Default: all of ``neighbors.sets``

    Returns:
        go.Figure: one subplot per rule, titled with the mean distance (cells) and the window share; the query cell
        outlined white/black, neighbour cells coloured by rank (Viridis, rank 0 darkest), random candidates dotted.
    """
    rules = rules or tuple(neighbors.sets)
    probe, size, window = neighbors.layer, view.shape[0], neighbors.options.window_size
    titles = []
    for rule in rules:
        nset = neighbors.sets[rule]
        cls = "" if not nset.is_prefix.any() else f", CLS at rank {int(np.flatnonzero(nset.is_prefix)[0])}"
        fallback = " (r ≥ N: same as all)" if rule == "random" and neighbors.random_uses_all_tokens else ""
        titles.append(f"{rule_title(rule)}{fallback}<br><sup>mean dist {nset.mean_distance:.2f} cells · "
                      f"{100 * nset.window_share:.0f}% in {window}×{window}{cls}</sup>")
    fig = make_subplots(1, len(rules), subplot_titles=titles, horizontal_spacing=0.02)
    margin = window // 2 * size / probe.height + 0.5
    shapes = []
    for i, rule in enumerate(rules, start=1):
        fig.add_trace(go.Image(z=view, hoverinfo="skip"), row=1, col=i)
        panel_shapes, marks = _neighbor_overlay(probe, neighbors.sets[rule], neighbors.query_cell, i)
        shapes += panel_shapes
        fig.add_trace(marks, row=1, col=i)
        _image_axes(fig, size, margin, 1, i)
    num_neighbors = neighbors.options.num_neighbors
    ranks = "" if ranks_labelled(probe, num_neighbors) else " · rank by colour (hover a cell for its number)"
    fig.update_layout(shapes=shapes, height=PANEL_HEIGHT, margin=dict(l=5, r=5, t=80, b=5), plot_bgcolor="#808080",
                      title=dict(text=f"K={num_neighbors} neighbours of cell {neighbors.query_cell} in {probe.name} "
                                 f"({probe.height}×{probe.width} cells, {size // probe.height} px each){ranks}",
                                 font=dict(size=14)))
    return fig


def mask_panel(view: np.ndarray, masks: dict[str, np.ndarray], query_px: tuple[int, int], title: str) -> go.Figure:
    """Image panels with a boolean pixel mask highlighted on each (e.g. "pixels like this one" / "near this one").

    Args:
        view (np.ndarray): (H, W, 3) uint8 image.
        masks (dict[str, np.ndarray]): panel title → (H, W) bool mask.
        query_px (tuple[int, int]): ``(row_px, col_px)`` marked with a cross.
        title (str): figure title.
    """
    fig = make_subplots(1, len(masks), subplot_titles=list(masks), horizontal_spacing=0.02)
    for i, mask in enumerate(masks.values(), start=1):
        shaded = np.where(mask[..., None], view, (0.25 * view + 40).astype(np.uint8))
        fig.add_trace(go.Image(z=shaded, hoverinfo="skip"), row=1, col=i)
        fig.add_trace(go.Scatter(x=[query_px[1]], y=[query_px[0]], mode="markers", showlegend=False,
                                 marker=dict(symbol="x-thin", size=16, line=dict(width=3, color=OKABE_ITO[0]))),
                      row=1, col=i)
        _image_axes(fig, max(view.shape[:2]), 0.0, 1, i)
    fig.update_layout(height=PANEL_HEIGHT, margin=dict(l=5, r=5, t=60, b=5), title=dict(text=title))
    return fig


def pixel_figure(view: np.ndarray, pixels: PixelNeighbors, query_px: tuple[int, int]) -> go.Figure:
    """The input-level view: "pixels like this one" next to "pixels near this one", each with its mean distance.

    Args:
        view (np.ndarray): (h, w, 3) uint8, :func:`analysis.pixels.pixel_view`.
        pixels (PixelNeighbors): the clicked pixel's neighbours.
        query_px (tuple[int, int]): ``(row_px, col_px)`` of the click in ``view``.
    """
    size = pixels.window_size
    masks = {f"pixels like this one ({pixels.like_distance:.1f} px away on average)": pixels.like,
             f"pixels near this one ({size}×{size}, {pixels.near_distance:.1f} px away on average)": pixels.near}
    title = f"K={int(pixels.like.sum())} of {pixels.like.size} pixels; overlap {pixels.overlap:.2f}"
    return mask_panel(view, masks, query_px, title)


def heatmap_figure(values: np.ndarray, title: str, x_title: str, y_title: str, colorbar_title: str,
                   diverging: bool = False, zrange: tuple[float, float] | None = None,
                   mark: tuple[int, int] | None = None, image_axes: bool = False) -> go.Figure:
    """A (rows × columns) heatmap: Cividis, or RdBu centred at 0 when ``diverging``.

    Args:
        values (np.ndarray): (rows, columns) float.
        title, x_title, y_title, colorbar_title (str): labels, with units.
        diverging (bool): signed values around 0. Default: False
        zrange (tuple[float, float], optional): colour range. Default: the data's
        mark (tuple[int, int], optional): ``(row, col)`` outlined (e.g. the query's cell). Default: None
        image_axes (bool): square cells, row 0 at the top (a map over the image). Default: False
    """
    limit = float(np.abs(values).max()) if values.size else 1.0
    colors = dict(colorscale="RdBu", zmid=0, zmin=-limit, zmax=limit) if diverging else dict(colorscale="Cividis")
    if zrange is not None:
        colors.update(zmin=zrange[0], zmax=zrange[1])
    fig = go.Figure(go.Heatmap(z=values, colorbar=dict(title=colorbar_title), **colors,
                               hovertemplate=f"{x_title} %{{x}}<br>{y_title} %{{y}}<br>%{{z:.4f}}<extra></extra>"))
    if mark is not None:
        fig.add_shape(type="rect", x0=mark[1] - 0.5, x1=mark[1] + 0.5, y0=mark[0] - 0.5, y1=mark[0] + 0.5,
                      line=dict(color=OKABE_ITO[0], width=3))
    if image_axes:
        fig.update_xaxes(constrain="domain")
        fig.update_yaxes(autorange="reversed", scaleanchor="x", constrain="domain")
    fig.update_layout(title=title, height=CHART_HEIGHT + (60 if image_axes else 0),
                      margin=dict(l=60, r=20, t=50, b=50), xaxis_title=x_title, yaxis_title=y_title)
    return fig


def bar_figure(labels: list[str], values: np.ndarray, title: str, y_title: str, x_title: str,
               colors: list[str] | None = None) -> go.Figure:
    """A bar chart (one bar per label), optionally coloured per bar (e.g. :func:`rank_colors`)."""
    fig = go.Figure(go.Bar(x=labels, y=values, marker_color=colors or OKABE_ITO[4],
                           hovertemplate="%{x}: %{y:.4f}<extra></extra>"))
    fig.update_layout(title=title, height=CHART_HEIGHT, margin=dict(l=60, r=20, t=50, b=50),
                      xaxis_title=x_title, yaxis_title=y_title, xaxis_type="category")
    return fig


def kernel_figures(kernel: AggregationKernel) -> tuple[go.Figure, go.Figure]:
    """The aggregation kernel as a heatmap (output channel × rank slot) and its per-rank-slot norms as bars."""
    heat = heatmap_figure(kernel.kernel, f"Aggregation kernel: {kernel.description}", "rank slot t", "output channel",
                          "weight" if kernel.signed else "‖W[o,:,t]‖", diverging=kernel.signed)
    slots = [str(t) for t in range(len(kernel.slot_norms))]
    bars = bar_figure(slots, kernel.slot_norms, "How much does the t-th neighbour matter? ‖W[:,:,t]‖",
                      "Frobenius norm", "rank slot t", rank_colors(len(slots)))
    return heat, bars


def contribution_figure(contributions: Contributions) -> go.Figure:
    """One bar per selected neighbour (rank colours): the L2 norm of its contribution to the query's output."""
    labels = [f"{t}: " + ("CLS" if prefix else f"({r},{c})")
              for t, ((r, c), prefix) in enumerate(zip(contributions.cells, contributions.is_prefix, strict=True))]
    return bar_figure(labels, contributions.norms, "Contribution of each selected neighbour to the query's output, "
                      "‖W[:,:,t]·ρ_t·v_t‖", "L2 norm", "rank: cell", rank_colors(len(labels)))


def mix_figure(mix: BranchMix, layer: str, cell: tuple[int, int]) -> go.Figure:
    """The ConvNN share of a hybrid layer's 1×1 mix output per cell, in [0, 1], the query's ``cell`` outlined.

    Args:
        mix (BranchMix): :func:`analysis.mixing.branch_mix` of the layer, shares (H, W).
        layer (str): the layer's name, for the title.
        cell (tuple[int, int]): ``(row, col)`` of the query in the layer's grid.
    """
    return heatmap_figure(mix.share, f"ConvNN share of the 1×1 mix output per cell, {layer}", "column (cells)",
                          "row (cells)", "share", zrange=(0, 1), mark=cell, image_axes=True)


def spectrum_figure(rows: tuple[SpectrumRow, ...]) -> go.Figure:
    """Per layer: mean neighbour distance (cells) and share inside the R×R window, over all queries of the image.

    Args:
        rows (tuple[SpectrumRow, ...]): :func:`analysis.spectrum.selection_spectrum`, one per layer, forward order.
    """
    layers = [row.layer for row in rows]
    mean_distance = np.array([row.mean_distance for row in rows])
    window_share = np.array([row.window_share for row in rows])
    window_size = rows[0].window_size if rows else DEFAULT_WINDOW
    fig = make_subplots(1, 2, subplot_titles=["mean neighbour distance (cells)",
                                              f"share of neighbours inside the {window_size}×{window_size} window (%)"])
    fig.add_trace(go.Bar(x=layers, y=mean_distance, marker_color=OKABE_ITO[4], showlegend=False,
                         hovertemplate="%{x}<br>%{y:.2f} cells<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=layers, y=100 * window_share, marker_color=OKABE_ITO[0], showlegend=False,
                         hovertemplate="%{x}<br>%{y:.1f}%<extra></extra>"), row=1, col=2)
    fig.update_yaxes(range=[0, 100], row=1, col=2)
    fig.update_layout(height=CHART_HEIGHT + 80, margin=dict(l=50, r=20, t=60, b=120),
                      title="Convolution ↔ attention: how local are each layer's selections on this image?")
    return fig


def attribution_figure(view: np.ndarray, attribution: Attribution) -> go.Figure:
    """The image next to an attribution map (|attribution| summed over colour channels, Cividis).

    Args:
        view (np.ndarray): (S, S, 3) uint8.
        attribution (Attribution): the map, (S, S) float ≥ 0, titled with its method and class (the card's class
            name, escaped: shown as text).
    """
    target = html.escape(attribution.target)
    title = f"{attribution.method.replace('_', ' ')} for class '{target}' (|attribution|, a.u.)"
    fig = make_subplots(1, 2, subplot_titles=["model input", "attribution (a.u.)"], horizontal_spacing=0.08)
    fig.add_trace(go.Image(z=view, hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=attribution.values, colorscale="Cividis", colorbar=dict(title="a.u."),
                             hovertemplate="row %{y}, col %{x}: %{z:.3g}<extra></extra>"), row=1, col=2)
    size = view.shape[0]
    for i in (1, 2):
        _image_axes(fig, size, 0.0, 1, i)
    fig.update_layout(height=PANEL_HEIGHT, margin=dict(l=5, r=5, t=70, b=5), title=title)
    return fig


def hop_figure(view: np.ndarray, field: ReceptiveField, query_px: tuple[int, int]) -> go.Figure:
    """Effective receptive field: each pixel coloured by the first hop that reaches it (0 = the query's cell).

    Args:
        view (np.ndarray): (S, S, 3) uint8.
        field (ReceptiveField): the hops, (S, S) int (−1 where no hop reaches), and the layer of each hop.
        query_px (tuple[int, int]): the query pixel.
    """
    layer_names = ["query", *field.layers]
    num_hops = len(layer_names)
    z = np.where(field.hops < 0, np.nan, field.hops.astype(float))
    colors = sample_colorscale("Viridis", np.linspace(0, 1, max(num_hops, 2)).tolist())[:num_hops]
    scale = [[edge, colors[i]] for i in range(num_hops) for edge in (i / num_hops, (i + 1) / num_hops)]
    fig = make_subplots(1, 2, subplot_titles=["model input", "first hop reaching each pixel"], horizontal_spacing=0.08)
    fig.add_trace(go.Image(z=view, hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=z, zmin=-0.5, zmax=num_hops - 0.5, colorscale=scale if num_hops > 1 else "Viridis",
                             colorbar=dict(title="hop", tickvals=list(range(num_hops))),
                             hovertemplate="row %{y}, col %{x}: hop %{z}<extra></extra>"), row=1, col=2)
    for i in (1, 2):
        fig.add_trace(go.Scatter(x=[query_px[1]], y=[query_px[0]], mode="markers", showlegend=False,
                                 marker=dict(symbol="x-thin", size=14, line=dict(width=3, color=OKABE_ITO[0]))),
                      row=1, col=i)
        _image_axes(fig, view.shape[0], 0.0, 1, i)
    fig.update_layout(height=PANEL_HEIGHT, margin=dict(l=5, r=5, t=70, b=5),
                      title="Neighbours of neighbours: " + " → ".join(layer_names))
    return fig
