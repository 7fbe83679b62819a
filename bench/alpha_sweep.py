"""Issue 16's answer from the runs' cards: accuracy vs the blend rule's α at λ = 0.5 on the ``cnn3`` recipe.

    python bench/alpha_sweep.py --out docs/alpha_sweep.png

Reads every seed's card of ``cnn3-l0.5-blend{0,0.25,0.5,0.75}`` and ``cnn3-l0.5`` (α = 1, the all rule; α = 0 is
the window rule, ``convnn.selection.effective_selection``) and of the λ = 0 baseline ``cnn3-l0`` — the shipped card
``checkpoints/PRESET.json`` for seed 0 where it is shipped, else ``checkpoints/logs/PRESET.card.json``, and
``checkpoints/logs/PRESET-sSEED.card.json`` — and prints a markdown table (every seed, mean ± sample std) and the
verdict: does any 0 < α < 1 *beat* both ends, a difference of means above the sum of the two standard deviations
(the issue's rule)? Accuracy is the card's ``test_top1``: the stored weights' on the 10,000 test images.
Draws mean ± std against α with the baseline as a line (PNG through ``zoo_curves.save_figure``, else HTML).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go
from zoo_curves import ROOT, save_figure

ALPHAS = {0.0: "cnn3-l0.5-blend0", 0.25: "cnn3-l0.5-blend0.25", 0.5: "cnn3-l0.5-blend0.5",
          0.75: "cnn3-l0.5-blend0.75", 1.0: "cnn3-l0.5"}
BASELINE = "cnn3-l0"
SEEDS = 3  # the seeds per α; a verdict on fewer says it is provisional


@dataclass(frozen=True)
class Runs:
    """One preset's finished seeds: {seed: test top-1 %}."""

    preset: str
    accuracy: dict[int, float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.accuracy.values())

    @property
    def std(self) -> float:
        """Sample standard deviation (n − 1); 0 for a single seed."""
        return statistics.stdev(self.accuracy.values()) if len(self.accuracy) > 1 else 0.0


def load_runs(preset: str, root: Path = ROOT) -> Runs:
    """Every seed's card of ``preset`` under ``root/checkpoints`` (see the module docstring for where)."""
    paths = [root / "checkpoints" / f"{preset}.json", root / "checkpoints" / "logs" / f"{preset}.card.json"]
    paths += sorted((root / "checkpoints" / "logs").glob(f"{preset}-s*.card.json"))
    accuracy = {}
    for path in paths:
        if path.is_file():
            card = json.loads(path.read_text())
            accuracy.setdefault(int(card["training"]["seed"]), float(card["metrics"]["test_top1"]))
    return Runs(preset, accuracy)


def beats(a: Runs, b: Runs) -> bool:
    """a beats b: a's mean exceeds b's by more than the sum of their standard deviations."""
    return a.mean - b.mean > a.std + b.std


def verdict(sweep: dict[float, Runs]) -> str:
    """One sentence: which 0 < α < 1 beat both α = 0 and α = 1, or that none does (or what is missing), marked
    provisional while an α has fewer than :data:`SEEDS` seeds."""
    ends = (sweep.get(0.0), sweep.get(1.0))
    if any(end is None or not end.accuracy for end in ends):
        return "not answered: a run of α = 0 or α = 1 is missing"
    middle = [alpha for alpha, runs in sweep.items() if 0 < alpha < 1 and runs.accuracy]
    if not middle:
        return "not answered: no run of 0 < α < 1 yet"
    winners = [alpha for alpha in middle if all(beats(sweep[alpha], end) for end in ends)]
    if winners:
        answer = f"yes: α = {', '.join(f'{a:g}' for a in winners)} beats both ends"
    else:
        answer = f"no: none of α = {', '.join(f'{a:g}' for a in middle)} beats both α = 0 and α = 1"
    short = [f"{alpha:g} ({len(runs.accuracy)})" for alpha, runs in sweep.items() if len(runs.accuracy) < SEEDS]
    return f"{answer} (provisional: α = {', '.join(short)} of {SEEDS} seeds)" if short else answer


def table(sweep: dict[float, Runs], baseline: Runs) -> str:
    rows = ["| α | preset | seeds | mean ± std (%) |", "|---:|---|---|---:|"]
    for alpha, runs in [*sweep.items(), (None, baseline)]:
        seeds = ", ".join(f"{seed}: {acc:.2f}" for seed, acc in sorted(runs.accuracy.items())) or "—"
        summary = "—"
        if len(runs.accuracy) == 1:
            summary = f"{runs.mean:.2f} (one seed: no std)"
        elif runs.accuracy:
            summary = f"{runs.mean:.2f} ± {runs.std:.2f}"
        rows.append(f"| {'λ = 0' if alpha is None else f'{alpha:g}'} | `{runs.preset}` | {seeds} | {summary} |")
    return "\n".join(rows)


def figure(sweep: dict[float, Runs], baseline: Runs) -> go.Figure:
    done = {alpha: runs for alpha, runs in sweep.items() if runs.accuracy}
    alphas = list(done)
    means = [runs.mean for runs in done.values()]
    stds = [runs.std for runs in done.values()]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=alphas + alphas[::-1], y=[m + s for m, s in zip(means, stds, strict=True)]
                             + [m - s for m, s in zip(means[::-1], stds[::-1], strict=True)], fill="toself",
                             fillcolor="rgba(213,94,0,0.2)", line=dict(width=0), name="hybrid λ = 0.5, ± std"))
    fig.add_trace(go.Scatter(x=alphas, y=means, mode="lines+markers", line=dict(color="#D55E00"),
                             name="hybrid λ = 0.5, mean"))
    fig.add_trace(go.Scatter(x=[alpha for alpha, runs in done.items() for _ in runs.accuracy],
                             y=[acc for runs in done.values() for acc in runs.accuracy.values()], mode="markers",
                             marker=dict(color="#D55E00", symbol="circle-open"), name="each seed"))
    if baseline.accuracy:
        fig.add_hline(y=baseline.mean, line=dict(color="#0072B2", dash="dash"),
                      annotation_text=f"λ = 0 (conv): {baseline.mean:.2f} ± {baseline.std:.2f} %")
    fig.update_layout(template="plotly_white", width=760, height=440, xaxis_title="blend α (0 = window, 1 = all)",
                      yaxis_title="CIFAR-10 test top-1 (%)", legend=dict(orientation="h", y=-0.2))
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "alpha_sweep.png")
    args = parser.parse_args()
    sweep = {alpha: load_runs(preset) for alpha, preset in ALPHAS.items()}
    baseline = load_runs(BASELINE)
    print(table(sweep, baseline), "", "Does any 0 < α < 1 beat both ends? " + verdict(sweep), sep="\n")
    print(f"wrote {save_figure(figure(sweep, baseline), args.out, viewport=(760, 440))}")


if __name__ == "__main__":
    main()
