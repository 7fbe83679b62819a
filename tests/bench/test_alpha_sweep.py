"""bench/alpha_sweep.py: issue 16's table and verdict from the runs' cards (values computed here by hand)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import alpha_sweep


def _card(path: Path, seed: int, top1: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"training": {"seed": seed}, "metrics": {"test_top1": top1}}))


def _runs(root: Path, preset: str, accuracies: list[float], shipped: bool = False) -> None:
    first = root / "checkpoints" / (f"{preset}.json" if shipped else f"logs/{preset}.card.json")
    _card(first, 0, accuracies[0])
    for seed, top1 in enumerate(accuracies[1:], start=1):
        _card(root / "checkpoints" / "logs" / f"{preset}-s{seed}.card.json", seed, top1)


def test_seeds_are_read_from_the_shipped_card_and_the_logs(tmp_path):
    _runs(tmp_path, "cnn3-l0.5", [91.0, 91.4, 91.2], shipped=True)
    runs = alpha_sweep.load_runs("cnn3-l0.5", tmp_path)
    assert runs.accuracy == {0: 91.0, 1: 91.4, 2: 91.2}
    assert runs.mean == pytest.approx(91.2)
    assert runs.std == pytest.approx(0.2)  # sqrt(((-0.2)² + 0.2² + 0²) / 2)


def test_the_verdict_needs_a_difference_above_the_sum_of_the_stds(tmp_path):
    _runs(tmp_path, "cnn3-l0.5-blend0", [90.0, 90.2, 90.4])  # 90.2 ± 0.2
    _runs(tmp_path, "cnn3-l0.5", [90.5, 90.6, 90.7])  # 90.6 ± 0.1
    _runs(tmp_path, "cnn3-l0.5-blend0.25", [90.8, 91.0, 91.2])  # 91.0 ± 0.2: 0.4 > 0.3 over α = 1, 0.8 > 0.4 over α = 0
    _runs(tmp_path, "cnn3-l0.5-blend0.5", [91.0, 91.1, 91.2])  # 91.1 ± 0.1: 0.5 > 0.2 over α = 1, 0.9 > 0.3 over α = 0
    sweep = {alpha: alpha_sweep.load_runs(preset, tmp_path) for alpha, preset in alpha_sweep.ALPHAS.items()}
    assert alpha_sweep.beats(sweep[0.25], sweep[1.0])  # 0.4 > 0.3
    assert not alpha_sweep.beats(sweep[1.0], sweep[0.25])
    assert alpha_sweep.verdict(sweep) == "yes: α = 0.25, 0.5 beats both ends (provisional: α = 0.75 (0) of 3 seeds)"
    means = next(trace for trace in alpha_sweep.figure(sweep, sweep[0.0]).data if trace.name.endswith("mean"))
    assert list(means.x) == [0.0, 0.25, 0.5, 1.0]  # α = 0.75 has no run yet
    assert list(means.y) == pytest.approx([90.2, 91.0, 91.1, 90.6])
    _runs(tmp_path, "cnn3-l0.5", [91.0, 91.2, 91.4])  # α = 1 now 91.2 ± 0.2: nothing beats it
    sweep[1.0] = alpha_sweep.load_runs("cnn3-l0.5", tmp_path)
    _runs(tmp_path, "cnn3-l0.5-blend0.75", [90.9, 91.1])
    sweep[0.75] = alpha_sweep.load_runs("cnn3-l0.5-blend0.75", tmp_path)  # 91.0 ± 0.14, two seeds
    assert alpha_sweep.verdict(sweep) == ("no: none of α = 0.25, 0.5, 0.75 beats both α = 0 and α = 1 "
                                          "(provisional: α = 0.75 (2) of 3 seeds)")
    _runs(tmp_path, "cnn3-l0.5-blend0.75", [90.9, 91.1, 91.0])
    sweep[0.75] = alpha_sweep.load_runs("cnn3-l0.5-blend0.75", tmp_path)
    assert alpha_sweep.verdict(sweep) == "no: none of α = 0.25, 0.5, 0.75 beats both α = 0 and α = 1"
    ends_only = {alpha: sweep[alpha] for alpha in (0.0, 1.0)}
    assert alpha_sweep.verdict(ends_only) == "not answered: no run of 0 < α < 1 yet"
    sweep[0.0] = alpha_sweep.Runs("cnn3-l0.5-blend0", {})
    assert alpha_sweep.verdict(sweep).startswith("not answered")
    assert "| 0 | `cnn3-l0.5-blend0` | — | — |" in alpha_sweep.table(sweep, sweep[1.0])
    _runs(tmp_path, "cnn3-l0.5-k16", [91.25])  # a single seed has a mean but no sample std
    single = alpha_sweep.load_runs("cnn3-l0.5-k16", tmp_path)
    assert "| 0.5 | `cnn3-l0.5-k16` | 0: 91.25 | 91.25 (one seed: no std) |" in alpha_sweep.table({0.5: single}, single)
