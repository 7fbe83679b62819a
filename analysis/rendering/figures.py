"""Every Plotly figure of the explorer (the only module that makes figures).

Conventions: fixed heights, units in titles and axis labels, colour-blind-safe palettes (Viridis/Cividis for
sequential values, a diverging RdBu for signed ones, Okabe–Ito for categories). Images are drawn pixel for pixel
(``go.Image``: pixel ``(row, col)`` is centred at ``x = col, y = row``), so a cell's outline is its pixel rectangle
± 0.5. Plotly renders a subset of HTML in its text (``<a href>`` becomes a link), so text from a model card (class
names) is escaped (:func:`html.escape`) before it reaches a figure.
"""

from __future__ import annotations

import html
import textwrap

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from convnn.introspect import DEFAULT_WINDOW

from ..views.attribution import ATTRIBUTION_METHODS, Attribution
from ..views.equivalence import Equivalence
from ..views.pixels import PixelNeighbors
from ..views.spectrum import SpectrumRow
from ..views.weights import AggregationKernel, BranchMix
from .overlay import rank_colors

__all__ = [
    "OKABE_ITO",
    "PANEL_HEIGHT",
    "attribution_figure",
    "bar_figure",
    "equivalence_figure",
    "heatmap_figure",
    "kernel_figures",
    "mask_panel",
    "mix_figure",
    "pixel_figure",
    "spectrum_figure",
    "spectrum_models_figure",
]

PANEL_HEIGHT = 380  # px, every image panel
CHART_HEIGHT = 320  # px, bar charts and heatmaps
_BAR_PX = 22  # px, each horizontal bar with its gap
_EQUIVALENCE_ROW_PX = 260  # px, each row of the equivalence demo's panels, with its title and colour bar
_EQUIVALENCE_GAP_PX = 70  # px between two rows of them: the colour bar under the upper one
_COLORBAR_DROP_PX = 12  # px from a row of panels down to the colour bar under it
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")  # colour-blind


def _image_axes(fig: go.Figure, size: int, margin: float, row: int = 1, col: int = 1) -> None:
    fig.update_xaxes(range=[-0.5 - margin, size - 0.5 + margin], showticklabels=False, showgrid=False,
                     zeroline=False, row=row, col=col)
    fig.update_yaxes(range=[size - 0.5 + margin, -0.5 - margin], showticklabels=False, showgrid=False,
                     zeroline=False, scaleanchor=f"x{'' if (row, col) == (1, 1) else (row - 1) * 100 + col}",
                     row=row, col=col)


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
    fig.update_annotations(font_size=12)  # the panel titles
    title, top = wrapped_title(title)
    fig.update_layout(height=PANEL_HEIGHT + top - 5, margin=dict(l=5, r=5, t=top + 55, b=5),
                      title=_above_panel_titles(title))
    return fig


def pixel_figure(view: np.ndarray, pixels: PixelNeighbors, query_px: tuple[int, int]) -> go.Figure:
    """The input-level view: "pixels like this one" next to "pixels near this one", each with its mean distance.

    Args:
        view (np.ndarray): (h, w, 3) uint8, :func:`analysis.views.pixels.pixel_view`.
        pixels (PixelNeighbors): the clicked pixel's neighbours.
        query_px (tuple[int, int]): ``(row_px, col_px)`` of the click in ``view``.
    """
    size = pixels.window_size
    masks = {f"like this one: {pixels.like_distance:.1f} px away": pixels.like,
             f"near ({size}×{size}): {pixels.near_distance:.1f} px away": pixels.near}
    title = (f"Pixels like this one vs near it: K={int(pixels.like.sum())} of {pixels.like.size} pixels, mean "
             f"distance on each panel; overlap {pixels.overlap:.2f}")
    return mask_panel(view, masks, query_px, title)


TITLE_CHARS = 36  # a chart title's longest line: what a phone's 390-px-wide chart shows whole (44 ran off it)
TITLE_LINE_PX = 20


def wrapped_title(text: str) -> tuple[str, int]:
    """A chart title broken at spaces into lines of at most :data:`TITLE_CHARS` (Plotly does not wrap titles, so
    a long one ran off a phone's screen) and the top margin, px, that its lines need."""
    lines = textwrap.wrap(text, TITLE_CHARS, break_long_words=False, break_on_hyphens=False) or [""]
    return "<br>".join(lines), 30 + TITLE_LINE_PX * len(lines)


def _above_panel_titles(title: str) -> dict:
    """A figure title held near the top of the figure, below the page's label and tool bar over it (52 px), so
    that its lines stay above the panels' titles (Plotly centres a title in the top margin, where a third line ran
    into them); give the figure a top margin of :func:`wrapped_title`'s + 55 px."""
    return dict(text=title, yref="container", y=1, yanchor="top", pad=dict(t=52))


def heatmap_figure(values: np.ndarray, title: str, x_title: str, y_title: str, colorbar_title: str,
                   diverging: bool = False, zrange: tuple[float, float] | None = None,
                   image_axes: bool = False) -> go.Figure:
    """A (rows × columns) heatmap: Cividis, or RdBu centred at 0 when ``diverging``.

    Args:
        values (np.ndarray): (rows, columns) float.
        title, x_title, y_title, colorbar_title (str): labels, with units.
        diverging (bool): signed values around 0. Default: False
        zrange (tuple[float, float], optional): colour range. Default: the data's
        image_axes (bool): square cells, row 0 at the top (a map over the image). Default: False
    """
    limit = float(np.abs(values).max()) if values.size else 1.0
    colors = dict(colorscale="RdBu", zmid=0, zmin=-limit, zmax=limit) if diverging else dict(colorscale="Cividis")
    if zrange is not None:
        colors.update(zmin=zrange[0], zmax=zrange[1])
    fig = go.Figure(go.Heatmap(z=values, colorbar=dict(title=colorbar_title), **colors,
                               hovertemplate=f"{x_title} %{{x}}<br>{y_title} %{{y}}<br>%{{z:.4f}}<extra></extra>"))
    if image_axes:
        fig.update_xaxes(constrain="domain")
        fig.update_yaxes(autorange="reversed", scaleanchor="x", constrain="domain")
    title, top = wrapped_title(title)
    fig.update_layout(title=title, height=CHART_HEIGHT + (60 if image_axes else 0) + top - 50,
                      margin=dict(l=60, r=20, t=top, b=50), xaxis_title=x_title, yaxis_title=y_title)
    return fig


def bar_figure(labels: list[str], values: np.ndarray, title: str, y_title: str, x_title: str,
               colors: list[str] | None = None) -> go.Figure:
    """A bar chart (one bar per label), optionally coloured per bar (e.g. :func:`rank_colors`)."""
    fig = go.Figure(go.Bar(x=labels, y=values, marker_color=colors or OKABE_ITO[4],
                           hovertemplate="%{x}: %{y:.4f}<extra></extra>"))
    title, top = wrapped_title(title)
    fig.update_layout(title=title, height=CHART_HEIGHT + top - 50, margin=dict(l=60, r=20, t=top, b=50),
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


def mix_figure(mix: BranchMix, layer: str) -> go.Figure:
    """The ConvNN share of a hybrid layer's 1×1 mix output per cell, in [0, 1] (the clicked cell's share is in the
    explorer, which follows clicks without the server).

    Args:
        mix (BranchMix): :func:`analysis.branch_mix` of the layer, shares (H, W).
        layer (str): the layer's name, for the title.
    """
    return heatmap_figure(mix.share, f"ConvNN share of the 1×1 mix output per cell, {layer}", "column (cells)",
                          "row (cells)", "share", zrange=(0, 1), image_axes=True)


def spectrum_figure(rows: tuple[SpectrumRow, ...]) -> go.Figure:
    """Per layer: mean neighbour distance (cells) and share inside the R×R window, over all queries of the image.

    Args:
        rows (tuple[SpectrumRow, ...]): :func:`analysis.views.spectrum.selection_spectrum`, one per layer, forward
            order.
    """
    layers = [row.layer for row in rows]
    mean_distance = np.array([row.mean_distance for row in rows])
    window_share = np.array([row.window_share for row in rows])
    window_size = rows[0].window_size if rows else DEFAULT_WINDOW
    # One above the other, so that each is as wide as the page (a phone's too); the layers down the side, first at
    # the top, so that their names read across whatever their number (along the bottom a phone turned them upright).
    fig = make_subplots(2, 1, vertical_spacing=0.12,
                        subplot_titles=["mean neighbour distance (cells)",
                                        f"% inside the {window_size}×{window_size} window"])
    fig.add_trace(go.Bar(y=layers, x=mean_distance, orientation="h", marker_color=OKABE_ITO[4], showlegend=False,
                         hovertemplate="%{y}<br>%{x:.2f} cells<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(y=layers, x=100 * window_share, orientation="h", marker_color=OKABE_ITO[0],
                         showlegend=False, hovertemplate="%{y}<br>%{x:.1f}%<extra></extra>"), row=2, col=1)
    fig.update_xaxes(range=[0, 100], row=2, col=1)
    fig.update_yaxes(automargin=True, autorange="reversed", type="category")
    fig.update_layout(height=2 * (_BAR_PX * len(layers) + 80) + 70, margin=dict(l=10, r=10, t=90, b=30),
                      title=dict(text="Convolution ↔ attention:<br>how local is each layer's selection here?",
                                 font=dict(size=15)))
    return fig


def spectrum_models_figure(spectra: dict[str, tuple[SpectrumRow, ...]]) -> go.Figure:
    """Every layer of every model on one convolution ↔ attention axis: the mean neighbour distance in model-input
    pixels (0 at the query; a 3×3 window ≈ 1 cell), coloured by the share inside the R×R window; one row per model,
    the most conv-like model at the bottom.

    Args:
        spectra (dict[str, tuple[SpectrumRow, ...]]): model name → :func:`analysis.selection_spectrum` on one image.
    """
    order = sorted(spectra, key=lambda name: np.mean([r.mean_distance_px for r in spectra[name]]))  # first: bottom
    names = [html.escape(name) for name in order]
    height = max(CHART_HEIGHT, 150 + 34 * len(order))
    plot_px = height - 70 - 110  # less the top and bottom margins
    fig = go.Figure()
    for name, shown in zip(order, names, strict=True):
        rows = spectra[name]
        fig.add_trace(go.Scatter(
            x=[r.mean_distance_px for r in rows], y=[shown] * len(rows), mode="markers", name=shown,
            showlegend=False, marker=dict(size=12, color=[100 * r.window_share for r in rows], cmin=0, cmax=100,
                                          colorscale="Viridis", line=dict(width=1, color="white"),
                                          showscale=name == order[0],  # one bar, not one per model over it
                                          colorbar=dict(title="% in R×R", orientation="h", yanchor="top",
                                                        y=-60 / plot_px, thickness=12, len=0.9)),  # under the title
            text=[html.escape(r.layer) for r in rows], customdata=[[r.mean_distance, 100 * r.window_share]
                                                                   for r in rows],
            hovertemplate="%{y} · %{text}<br>%{x:.2f} px = %{customdata[0]:.2f} cells · %{customdata[1]:.0f}% in "
                          "the window<extra></extra>"))
    # Names sized by the axis itself and the colour bar below the plot, so that a phone keeps a plot to read.
    fig.update_yaxes(automargin=True)
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=70, b=110),
                      title=dict(text="Every model's layers on one axis:<br>conv-like (left) ↔ attention-like (right)",
                                 font=dict(size=15)),
                      xaxis_title="mean distance (input pixels)")  # short: whole under a phone's plot
    return fig


def attribution_figure(view: np.ndarray, attribution: Attribution) -> go.Figure:
    """The image next to an attribution map (|attribution| summed over colour channels, Cividis).

    Args:
        view (np.ndarray): (S, S, 3) uint8.
        attribution (Attribution): the map, (S, S) float ≥ 0, titled with its method and class (the card's class
            name, escaped: shown as text).
    """
    target = html.escape(attribution.target)
    title = f"{ATTRIBUTION_METHODS[attribution.method]}, class '{target}'"
    fig = make_subplots(1, 2, subplot_titles=["model input", "attribution (a.u.)"], horizontal_spacing=0.08)
    fig.add_trace(go.Image(z=view, hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=attribution.values, colorscale="Cividis", colorbar=dict(title="a.u."),
                             hovertemplate="row %{y}, col %{x}: %{z:.3g}<extra></extra>"), row=1, col=2)
    size = view.shape[0]
    for i in (1, 2):
        _image_axes(fig, size, 0.0, 1, i)
    fig.update_layout(height=PANEL_HEIGHT, margin=dict(l=5, r=5, t=70, b=5), title=title)
    return fig


def _colorbar_under(title: str, x0: float, x1: float, y: float) -> dict:
    """A horizontal colour bar from ``x0`` to ``x1`` with its top at ``y`` (paper coordinates)."""
    return dict(title=dict(text=title, side="right"), orientation="h", thickness=10, len=x1 - x0, x=(x0 + x1) / 2,
                xanchor="center", y=y, yanchor="top", tickfont=dict(size=10))


def equivalence_figure(results: list[Equivalence]) -> go.Figure:
    """Each equivalence as a picture: the ConvNN side's output beside the reference's (one channel, a shared colour
    scale), and under them their difference (max over channels, its own scale from 0: ≈ 0 where the equivalence
    holds), per cell. Two panels to a row and horizontal colour bars under each row, so that a phone's width shows
    each panel at about 160 px (three to a row were 80–105 px); the description and the numbers are in the text
    beside the figure.

    Args:
        results (list[Equivalence]): :func:`analysis.equivalences`, two rows each.
    """
    titles = []
    for r in results:
        reference = "SDPA" if "attention" in r.reference_path else r.reference_path.removeprefix("F.")
        titles += [f"ConvNN, ch. {r.channel}", f"{reference}, ch. {r.channel}", "|difference|"]
    title, top = wrapped_title("The same output, computed as ConvNN and as the operation it equals (cells of the "
                               "layer)")
    rows = 2 * len(results)
    plot_px = _EQUIVALENCE_ROW_PX * rows  # the plot area: the figure's height less its margins
    fig = make_subplots(rows, 2, subplot_titles=titles, specs=[[{}, {}], [{}, None]] * len(results),
                        horizontal_spacing=0.06, vertical_spacing=_EQUIVALENCE_GAP_PX / plot_px)

    def under(row: int) -> float:  # the top of a colour bar under the panels of ``row`` (paper coordinates)
        return fig.get_subplot(row, 1).yaxis.domain[0] - _COLORBAR_DROP_PX / plot_px

    for index, r in enumerate(results):
        outputs, below = 2 * index + 1, 2 * index + 2
        low, high = float(min(r.convnn.min(), r.reference.min())), float(max(r.convnn.max(), r.reference.max()))
        left, right = (fig.get_subplot(outputs, col).xaxis.domain for col in (1, 2))
        for col, values in enumerate((r.convnn, r.reference), start=1):
            fig.add_trace(go.Heatmap(z=values, zmin=low, zmax=high, colorscale="Cividis", showscale=col == 2,
                                     colorbar=_colorbar_under("output", left[0], right[1], under(outputs)),
                                     hovertemplate="row %{y}, col %{x}: %{z:.4g}<extra></extra>"), row=outputs, col=col)
        fig.add_trace(go.Heatmap(z=r.difference, zmin=0, zmax=max(float(r.difference.max()), 1e-12),
                                 colorscale="Viridis", colorbar=_colorbar_under("|diff|", *left, under(below)),
                                 hovertemplate="row %{y}, col %{x}: %{z:.2e}<extra></extra>"), row=below, col=1)
    for row, col in [(row, col) for row in range(1, rows + 1) for col in (1, 2) if col == 1 or row % 2]:
        anchor = fig.get_subplot(row, col).xaxis.plotly_name.replace("axis", "")
        fig.update_xaxes(constrain="domain", tickfont=dict(size=9), row=row, col=col)
        fig.update_yaxes(autorange="reversed", scaleanchor=anchor, constrain="domain", tickfont=dict(size=9),
                         row=row, col=col)
    fig.update_annotations(font_size=12)  # the panel titles
    fig.update_layout(height=plot_px + top + 55 + 60, margin=dict(l=30, r=10, t=top + 55, b=60),
                      title=_above_panel_titles(title))
    return fig
