"""Plot test accuracy vs epoch of the CIFAR zoo runs (``checkpoints/logs/*.log.jsonl``) for the README.

    python bench/zoo_curves.py --out docs/curves.png

Writes the Plotly figure as HTML next to ``--out`` and, when Chromium and Playwright are installed, renders it to
PNG (Plotly's own PNG export needs kaleido, which downloads a browser). Runs that were stopped before their last
epoch are drawn dashed and end where they stopped.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

ROOT = Path(__file__).resolve().parents[1]
PANELS = {"CNN: λ = 0 (conv + 1×1) vs hybrid λ = 0.5": ("cnn-l0", "cnn-l0.5"),
          "ViT: MHSA vs KVT vs ConvNN-attention (K = 16)": ("vit-mhsa", "vit-kvt16", "vit-convnn16")}
COLORS = {"cnn-l0": "#0072B2", "cnn-l0.5": "#D55E00", "vit-mhsa": "#0072B2", "vit-kvt16": "#009E73",
          "vit-convnn16": "#D55E00"}  # Okabe–Ito, colour-blind safe
PLANNED_EPOCHS = {"cnn": 25, "vit": 80}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--no-first-run"]


def curves(logs: Path) -> go.Figure:
    """One subplot per headline comparison; one line per run (seeds share their preset's colour)."""
    figure = make_subplots(rows=1, cols=len(PANELS), subplot_titles=list(PANELS), horizontal_spacing=0.08)
    for col, presets in enumerate(PANELS.values(), start=1):
        for preset in presets:
            for path in sorted(logs.glob(f"{preset}.log.jsonl")) + sorted(logs.glob(f"{preset}-s*.log.jsonl")):
                rows = [json.loads(line) for line in path.read_text().splitlines()]
                complete = len(rows) == PLANNED_EPOCHS[preset.split("-")[0]]
                run = path.name.removesuffix(".log.jsonl")
                figure.add_trace(go.Scatter(
                    x=[r["epoch"] for r in rows], y=[r["test_top1"] for r in rows], mode="lines",
                    name=run + ("" if complete else " (stopped)"),
                    line={"color": COLORS[preset], "dash": "solid" if complete else "dash", "width": 2}),
                    row=1, col=col)
        figure.update_xaxes(title_text="epoch", row=1, col=col)
        figure.update_yaxes(title_text="CIFAR-10 test top-1 (%)", range=[40, 95], row=1, col=col)
    figure.update_layout(height=460, width=1300, template="plotly_white", legend={"font": {"size": 11}},
                         title="Test accuracy vs epoch (cosine schedules of 25 and 80 epochs; dashed = run stopped)")
    return figure


def render_png(html: Path, png: Path) -> bool:
    """Screenshot ``html`` with Playwright + Chromium; False when either is missing."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return False
    if chromium is None:
        return False
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1320, "height": 480})
        page.goto(html.resolve().as_uri())
        page.wait_for_selector(".main-svg")
        page.screenshot(path=str(png))
        browser.close()
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, default=ROOT / "checkpoints" / "logs")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "curves.png")
    args = parser.parse_args()
    html = args.out.with_suffix(".html")
    curves(args.logs).write_html(html, include_plotlyjs=True)
    if not render_png(html, args.out):
        print(f"wrote {html}; install chromium and playwright to render {args.out}")


if __name__ == "__main__":
    main()
