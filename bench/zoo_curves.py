"""Plot test accuracy vs epoch of the CIFAR zoo runs (``checkpoints/logs/*.log.jsonl``) for the README.

    python bench/zoo_curves.py --out docs/curves.png

Renders the Plotly figure to PNG with Chromium and Playwright (Plotly's own PNG export needs kaleido, which downloads
a browser); without them it writes the HTML next to ``--out`` instead. Each preset is the mean of its finished seeds
with a min–max band; runs stopped before their last epoch are left out.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

ROOT = Path(__file__).resolve().parents[1]
# Each panel: its presets, the first one the baseline that the lower row subtracts.
PANELS = {"CNN: λ = 0 (conv + 1×1) vs hybrid λ = 0.5, 25 epochs": ("cnn-l0", "cnn-l0.5"),
          "ViT: MHSA vs KVT vs ConvNN-attention (K = 16), 80 epochs": ("vit-mhsa", "vit-kvt16", "vit-convnn16"),
          "ViT, 180 epochs (one seed)": ("vit-mhsa-e180", "vit-convnn16-e180")}
COLORS = {"cnn-l0": "#0072B2", "cnn-l0.5": "#D55E00", "vit-mhsa": "#0072B2", "vit-kvt16": "#009E73",
          "vit-convnn16": "#D55E00", "vit-mhsa-e180": "#0072B2", "vit-convnn16-e180": "#D55E00"}  # Okabe–Ito
PLANNED_EPOCHS = {"cnn": 25, "vit": 80}  # the presets' recipes; a run named PRESET-eEPOCHS planned EPOCHS
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--no-first-run"]


def seed_curves(logs: Path, preset: str) -> np.ndarray:
    """Test top-1 (%) per epoch of every finished seed of ``preset``: (seeds, epochs); stopped runs are left out."""
    paths = sorted(logs.glob(f"{preset}.log.jsonl")) + sorted(logs.glob(f"{preset}-s*.log.jsonl"))
    runs = [[json.loads(line)["test_top1"] for line in path.read_text().splitlines()] for path in paths]
    longer = re.fullmatch(r".+-e(\d+)", preset)
    planned = int(longer[1]) if longer else PLANNED_EPOCHS[preset.split("-")[0]]
    runs = [run for run in runs if len(run) == planned]
    if not runs:
        raise ValueError(f"no finished run of {preset} in {logs}")
    return np.array(runs)


def _seeds(count: int) -> str:
    return "one seed" if count == 1 else f"mean of {count} seeds, band min–max"


def _band(color: str) -> str:
    red, green, blue = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},0.18)"


def curves(logs: Path) -> go.Figure:
    """Upper row: mean test top-1 over seeds with the min–max band; lower row: each preset's mean minus the
    baseline's mean (points), the view in which "trails early, overtakes late" would show."""
    figure = make_subplots(rows=2, cols=len(PANELS), subplot_titles=list(PANELS), horizontal_spacing=0.08,
                           vertical_spacing=0.1, row_heights=[0.62, 0.38], shared_xaxes=True)
    for col, presets in enumerate(PANELS.values(), start=1):
        family = {preset: seed_curves(logs, preset) for preset in presets}
        baseline = family[presets[0]].mean(0)
        for preset, runs in family.items():
            epochs = np.arange(1, runs.shape[1] + 1)
            mean, color = runs.mean(0), COLORS[preset]
            figure.add_trace(go.Scatter(x=np.r_[epochs, epochs[::-1]], y=np.r_[runs.max(0), runs.min(0)[::-1]],
                                        fill="toself", fillcolor=_band(color), line={"width": 0}, hoverinfo="skip",
                                        showlegend=False), row=1, col=col)
            figure.add_trace(go.Scatter(x=epochs, y=mean, mode="lines", line={"color": color, "width": 2},
                                        name=f"{preset} ({_seeds(len(runs))})"), row=1, col=col)
            figure.add_trace(go.Scatter(x=epochs, y=mean - baseline, mode="lines", showlegend=False,
                                        line={"color": color, "width": 2}), row=2, col=col)
        figure.update_xaxes(title_text="epoch", row=2, col=col)
        figure.update_yaxes(title_text="test top-1 (%)", range=[40, 95], row=1, col=col)
        figure.update_yaxes(title_text=f"− {presets[0]} (points)", range=[-10, 4], row=2, col=col)
    figure.update_layout(height=640, width=1600, template="plotly_white", legend={"font": {"size": 11}},
                         title="CIFAR-10 test accuracy vs epoch (cosine schedules of 25, 80 and 180 epochs)")
    return figure


def render_png(html: Path, png: Path, viewport: tuple[int, int] = (1620, 660)) -> bool:
    """Screenshot ``html`` at ``viewport`` (width, height px) with Playwright + Chromium; False when either is
    missing."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return False
    if chromium is None:
        return False
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        page.goto(html.resolve().as_uri())
        page.wait_for_selector(".main-svg")
        page.screenshot(path=str(png))
        browser.close()
    return True


def save_figure(figure: go.Figure, png: Path, viewport: tuple[int, int] = (1620, 660)) -> Path:
    """``figure`` as ``png`` (:func:`render_png`), or as HTML beside it without Chromium; returns the file written."""
    with tempfile.TemporaryDirectory() as folder:
        html = Path(folder) / "figure.html"
        figure.write_html(html, include_plotlyjs=True)
        if render_png(html, png, viewport):
            return png
    html = png.with_suffix(".html")
    figure.write_html(html, include_plotlyjs=True)
    return html


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, default=ROOT / "checkpoints" / "logs")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "curves.png")
    args = parser.parse_args()
    written = save_figure(curves(args.logs), args.out)
    if written != args.out:
        print(f"wrote {written}; install chromium and playwright to render {args.out}")


if __name__ == "__main__":
    main()
