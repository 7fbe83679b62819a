"""Evaluate checkpoints on the CIFAR-10 test split, and what a storage dtype costs: ``python -m convnn.evaluate``.

Evaluate (GPU if present, else CPU)::

    python -m convnn.evaluate checkpoints/cnn-l0.json checkpoints/vit-mhsa.json --data-root ../shared/data/cifar10

Store int8 weights (per-channel scales, :mod:`convnn.checkpoint`) and evaluate what was stored::

    python -m convnn.evaluate checkpoints/*.json --data-root ../shared/data/cifar10 --save-dtype int8 --out int8

Each checkpoint is evaluated as :func:`~convnn.checkpoint.load_checkpoint` returns it, with training's test pipeline
(:class:`~convnn.data.DeviceLoader` normalising with the card's mean and std, then :func:`convnn.metrics.test_metrics`)
in fp32 without autocast, so the last digit can differ from the card's numbers, which training measured under bf16
autocast on a GPU. A model with random candidates is measured over ``--draws`` eval draws (5 by default;
:func:`convnn.candidates.candidate_draw`, METHOD §3b): its row gives the mean ± sample std of top-1 over draws 0 … 4 and
each draw's, which is what its card records (``test_top1`` and ``test_loss`` the means, ``test_top1_std``, and the draw
scheme in ``evaluation``). With ``--save-dtype`` and ``--out`` each checkpoint is saved again in that dtype as
``OUT/NAME``: the weights as stored are loaded back and evaluated before the two files are written
(:func:`~convnn.checkpoint.stage_checkpoint` with ``measure``). The new card is the old one but for the storage fields
and the metrics: ``test_top1`` and ``test_loss`` are the stored weights', and, when saved as int8, those of the
checkpoint it was made from (measured here) become ``test_top1_before_quantization`` and
``test_loss_before_quantization``, unless the card has them already (re-saving an int8 checkpoint keeps the float
model's); saved in a float dtype, the new card has no such metrics (they would describe int8 storage). The table of
results goes to stdout, one row per checkpoint.

Re-saving is all or nothing. ``--out`` must be a folder or a path that can become one (not a file, nor under one),
checked before anything is loaded. Before anything is evaluated or written, every checkpoint is loaded and checked (a
CIFAR-10 card whose metrics are finite numbers, weights that load back once stored in ``--save-dtype``) and every new
file's path is planned: the run stops with a message, having written nothing, when one of them exists already (such
as a source, with ``--out`` its own folder), two sources share a name, or a checkpoint cannot be stored. Then every
checkpoint and its stored weights are measured, and only then are the new files written; a new card never holds an
inf or NaN: such a measurement stops the run with nothing written, and a write that fails removes the files the run
wrote before it, so the same command can run again.

Evaluating only (no ``--save-dtype``), one checkpoint that cannot be evaluated (it does not load, is not CIFAR-10,
or measures an inf or NaN) does not hide the others: their rows are printed, then the run exits with a message
naming each one that failed and why.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .checkpoint import (
    BEFORE_SUFFIX,
    WEIGHTS_DTYPES,
    ModelCard,
    StagedCheckpoint,
    checkpoint_paths,
    load_checkpoint,
    stage_checkpoint,
)
from .data import CIFAR10_CLASSES, DeviceLoader, data_fingerprint, load_cifar10
from .metrics import EVAL_DRAWS, draw_evaluation, draw_metrics, summarize_draws

__all__ = ["BEFORE_SUFFIX", "EvaluationData", "main"]

log = logging.getLogger("convnn.evaluate")


@dataclass
class EvaluationData:
    """The CIFAR-10 test images and how to run them through a model.

    Attributes:
        images (np.ndarray): (N, H, W, 3) uint8.
        labels (np.ndarray): (N,) int64, in :data:`~convnn.data.CIFAR10_CLASSES` order.
        batch_size (int): images per forward pass.
        device (torch.device): where images and model run.
        draws (int): eval draws a model with random candidates is measured over, draw indices 0 … draws − 1
            (:func:`convnn.candidates.candidate_draw`); a model without them is measured once. Default:
            :data:`EVAL_DRAWS`
    """

    images: np.ndarray
    labels: np.ndarray
    batch_size: int
    device: torch.device
    draws: int = EVAL_DRAWS

    def check(self, card: ModelCard) -> None:
        """Raise ``ValueError`` for a card whose classes are not CIFAR-10's or whose input size is not the images'."""
        side = self.images.shape[1]
        if tuple(card.classes) != CIFAR10_CLASSES or card.input_size != side:
            raise ValueError(f"{card.name}: not a CIFAR-10 model: classes {card.classes[:2]}..., input_size "
                             f"{card.input_size} (CIFAR-10: {list(CIFAR10_CLASSES[:2])}..., {side} px)")

    def draw_metrics(self, model: nn.Module, card: ModelCard) -> list[dict[str, float]]:
        """``model``'s ``test_top1`` (percent) and ``test_loss`` (mean cross-entropy) per eval draw, in fp32 on
        :attr:`device`: one entry per draw index 0 … :attr:`draws` − 1 for a model with random candidates, one
        entry otherwise.

        Args:
            model (nn.Module): a model of a card :meth:`check` accepts; moved to :attr:`device`.
            card (ModelCard): its card (mean and std of the input normalisation).

        Raises:
            ValueError: a metric that is inf or NaN (it is never written into a card).
        """
        loader = DeviceLoader(self.images, self.labels, self.batch_size, self.device, train=False,
                              mean=tuple(card.mean), std=tuple(card.std))
        measured = draw_metrics(model.to(self.device), loader, self.device, False, self.draws)
        for metrics in measured:
            _check_finite(metrics, card.name)
        return measured

    def metrics(self, model: nn.Module, card: ModelCard) -> dict[str, float]:
        """What a card records: :func:`convnn.metrics.summarize_draws` of :meth:`draw_metrics`.

        Raises:
            ValueError: a metric that is inf or NaN (it is never written into a card).
        """
        return summarize_draws(self.draw_metrics(model, card))

    def evaluation(self, model: nn.Module) -> dict:
        """The card's ``evaluation`` for ``model`` measured here (:func:`convnn.metrics.draw_evaluation`)."""
        return draw_evaluation(model, self.draws)


def _check_finite(metrics: dict, source: str) -> None:
    """Raise ``ValueError`` naming ``source`` and the key when a value of ``metrics`` is not a finite number."""
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{source}: metrics.{key} must be a finite number, got {value!r}")


def _format_table(rows: list[dict[str, str]]) -> str:
    """Rows with the same keys → a text table, the keys as header, each column as wide as its widest entry."""
    widths = {key: max(len(key), *(len(row[key]) for row in rows)) for key in rows[0]}
    lines = [[key.ljust(width) for key, width in widths.items()]]
    lines += [[row[key].ljust(width) for key, width in widths.items()] for row in rows]
    return "\n".join("  ".join(cells).rstrip() for cells in lines)


def _top1_text(metrics: dict) -> str:
    """``test_top1`` as a table shows it: ``"81.40"``, or ``"81.40 ± 0.12"`` with a spread over draws."""
    spread = f" ± {metrics['test_top1_std']:.2f}" if "test_top1_std" in metrics else ""
    return f"{metrics['test_top1']:.2f}{spread}"


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.2f} MB"  # decimal MB, as the repository's size limits


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m convnn.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cards", nargs="+", metavar="CARD.json", help="checkpoints (card, weights or stem)")
    parser.add_argument("--data-root", help="CIFAR-10 folder (convnn.data.load_cifar10). Default: $CONVNN_CIFAR10")
    parser.add_argument("--save-dtype", choices=WEIGHTS_DTYPES,
                        help="re-save each checkpoint in this dtype (with --out)")
    parser.add_argument("--out", type=Path, help="folder for the re-saved checkpoints (with --save-dtype)")
    parser.add_argument("--batch-size", type=int, default=1000, help="images per forward pass. Default: 1000")
    parser.add_argument("--draws", type=int, default=EVAL_DRAWS,
                        help=f"eval draws of a model with random candidates. Default: {EVAL_DRAWS}")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help="Default: cuda when there is a GPU, else cpu")
    args = parser.parse_args(argv)
    if (args.save_dtype is None) != (args.out is None):
        parser.error("--save-dtype and --out go together")
    if args.out is not None:  # the nearest existing path at or above --out must be a folder (mkdir makes the rest)
        existing = next(path for path in (args.out, *args.out.parents) if path.exists())
        if not existing.is_dir():
            where = "a file" if existing == args.out else f"under the file {existing}"
            parser.error(f"--out {args.out} is {where}: give a folder for the re-saved checkpoints")
    for flag in ("batch_size", "draws"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be ≥ 1, got {getattr(args, flag)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but PyTorch sees no CUDA GPU")
    return args


def _load_source(source: Path) -> tuple[nn.Module, ModelCard]:
    """Load a checkpoint to evaluate (on the CPU); its card's metrics must be finite numbers (a new card copies them).

    Raises:
        CheckpointError: it does not load (:func:`~convnn.checkpoint.load_checkpoint`).
        ValueError: a metric of its card is not a finite number.
    """
    model, card = load_checkpoint(source)
    _check_finite(card.metrics, str(checkpoint_paths(source)[1]))
    return model, card


def _plan(sources: list[Path], out: Path | None) -> list[Path | None]:
    """The stem each source is re-saved as in the folder ``out`` (same name), or Nones without ``out``.

    Raises:
        ValueError: a new file exists already (re-saving never overwrites; with ``out`` the source's own folder,
            that file is the source itself), or two sources share a name.
    """
    if out is None:
        return [None] * len(sources)
    targets, planned = [], {}
    for source in sources:
        target = out / checkpoint_paths(source)[0].stem
        weights_path, card_path = checkpoint_paths(target)
        for path in (weights_path, card_path):
            if path.exists():
                raise ValueError(f"--out {out}: {path.name} exists there already (from {source}: re-saving never "
                                 f"overwrites a file); choose another folder")
        card_path = card_path.resolve()
        if card_path in planned:
            raise ValueError(f"{planned[card_path]} and {source} would both be re-saved as {card_path}: "
                             f"evaluate them in two runs with different --out folders")
        planned[card_path] = source
        targets.append(target)
    return targets


def _load_data(args: argparse.Namespace) -> tuple[EvaluationData, str]:
    """The CIFAR-10 test split as :class:`EvaluationData`, and its fingerprint.

    Raises:
        OSError, ValueError: the data cannot be read (:func:`~convnn.data.load_cifar10`).
    """
    images, labels = load_cifar10(args.data_root, "test")
    return (EvaluationData(images, labels, args.batch_size, torch.device(args.device), args.draws),
            data_fingerprint(images, labels))


def _evaluate_one(source: Path, model: nn.Module, card: ModelCard, data: EvaluationData,
                  fingerprint: str) -> tuple[dict[str, str], dict[str, float]]:
    """Evaluate one loaded checkpoint (of a card :meth:`EvaluationData.check` accepts): its table row and metrics.

    Raises:
        ValueError: a metric that is inf or NaN (:meth:`EvaluationData.metrics`).
    """
    if card.data.get("test_sha256", fingerprint) != fingerprint:
        log.warning("%s: the card's test_sha256 is not that of these test images", card.name)
    measured = data.draw_metrics(model, card)
    metrics = summarize_draws(measured)
    row = {"checkpoint": card.name, "stored": card.weights_dtype,
           "size": _megabytes(checkpoint_paths(source)[0].stat().st_size),
           "card top-1": _top1_text(card.metrics) if "test_top1" in card.metrics else "-",
           "top-1": _top1_text(metrics) + (f" over {len(measured)} draws (" + ", ".join(
               f"{m['test_top1']:.2f}" for m in measured) + ")" if len(measured) > 1 else ""),
           "loss": f"{metrics['test_loss']:.4f}"}
    log.info("%s: top-1 %s (card %s)", card.name, row["top-1"], row["card top-1"])
    return row, metrics


def _evaluate_only(sources: list[Path], args: argparse.Namespace) -> tuple[list[dict[str, str]], list[str]]:
    """Evaluate each source on its own: the rows of those that could be, and why each other one could not.

    Raises:
        OSError, ValueError: the test data cannot be read (a failing checkpoint is reported, not raised).
    """
    data, fingerprint = _load_data(args)
    rows, failures = [], []
    for source in sources:
        try:
            model, card = _load_source(source)
            data.check(card)
            rows.append(_evaluate_one(source, model, card, data, fingerprint)[0])
        except ValueError as err:  # CheckpointError is a ValueError
            log.error("%s: %s", source, err)
            failures.append(f"{source}: {err}")
    return rows, failures


def _resave(sources: list[Path], args: argparse.Namespace) -> list[dict[str, str]]:
    """Evaluate every source and re-save it in ``args.out`` as ``args.save_dtype``, all or nothing; the table rows.

    Every source is loaded, checked and planned, then every source and its stored weights are measured
    (:func:`~convnn.checkpoint.stage_checkpoint` with ``measure``: the new card is the source's with the metrics
    measured here, which it replaces by the stored weights', keeping them with :data:`BEFORE_SUFFIX` for int8), and
    only then is anything written (:func:`_write_all`).

    Raises:
        ValueError: a source that does not load, is not CIFAR-10, cannot be stored in ``args.save_dtype`` or
            measures an inf or NaN; a new file that exists already; two sources of one name. Nothing is written then.
        OSError: the data cannot be read, or a file cannot be written (:func:`_write_all`).
    """
    loaded = [_load_source(source) for source in sources]
    targets = _plan(sources, args.out)
    data, fingerprint = _load_data(args)
    dtype = getattr(torch, args.save_dtype)
    for (model, card), target in zip(loaded, targets, strict=True):
        data.check(card)
        stage_checkpoint(model, target, card, dtype)  # storable? (loads back once stored)
    rows, staged = [], []
    for source, (model, card), target in zip(sources, loaded, targets, strict=True):
        row, metrics = _evaluate_one(source, model, card, data, fingerprint)
        new = stage_checkpoint(model, target, replace(card, metrics={**card.metrics, **metrics},
                                                      evaluation=data.evaluation(model)), dtype, measure=data.metrics)
        stored = new.card.metrics
        row.update({"saved as": args.save_dtype, "new size": _megabytes(len(new.weights)),
                    "new top-1": f"{stored['test_top1']:.2f}", "new loss": f"{stored['test_loss']:.4f}",
                    "Δ top-1": f"{stored['test_top1'] - metrics['test_top1']:+.2f}"})
        log.info("%s: stored as %s, top-1 %s", card.name, args.save_dtype, row["new top-1"])
        rows.append(row)
        staged.append(new)
    _write_all(staged)
    return rows


def _write_all(staged: list[StagedCheckpoint]) -> None:
    """Write every staged checkpoint; when one cannot be written, remove the files of it and of those before it.

    :func:`_plan` made sure that none of these files existed, so what is removed is what this run wrote, and the
    same command can run again.

    Raises:
        OSError: a file cannot be written (:meth:`~convnn.checkpoint.StagedCheckpoint.write`).
    """
    for done, checkpoint in enumerate(staged):
        try:
            checkpoint.write()
        except OSError:
            for written in staged[:done + 1]:
                written.weights_path.unlink(missing_ok=True)
                written.card_path.unlink(missing_ok=True)
            raise


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = _parse_args(argv)
    sources = [Path(source) for source in args.cards]
    try:
        rows, failures = _evaluate_only(sources, args) if args.out is None else (_resave(sources, args), [])
    except (ValueError, OSError) as err:  # CheckpointError is a ValueError
        sys.exit(f"python -m convnn.evaluate: {err}")
    if rows:
        print(_format_table(rows))
    if failures:
        sys.exit(f"python -m convnn.evaluate: {len(failures)} of {len(sources)} checkpoints could not be evaluated"
                 f"{' (the others are in the table above)' if rows else ''}: " + "; ".join(failures))


if __name__ == "__main__":
    main()
