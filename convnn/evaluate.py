"""Evaluate checkpoints on the CIFAR-10 test split, and what a storage dtype costs: ``python -m convnn.evaluate``.

Evaluate (GPU if present, else CPU)::

    python -m convnn.evaluate checkpoints/cnn-l0.json checkpoints/vit-mhsa.json --data-root ../shared/data/cifar10

Store int8 weights (per-channel scales, :mod:`convnn.checkpoint`) and evaluate what was stored::

    python -m convnn.evaluate checkpoints/*.json --data-root ../shared/data/cifar10 --save-dtype int8 --out int8

Each checkpoint is evaluated as :func:`~convnn.checkpoint.load_checkpoint` returns it, with training's test
pipeline (:class:`~convnn.data.DeviceLoader` normalising with the card's mean and std, then
:func:`convnn.train.evaluate`) in fp32 without autocast, so the last digit can differ from the card's numbers,
which training measured under bf16 autocast on a GPU. With ``--save-dtype`` and ``--out`` each checkpoint is saved
again in that dtype as ``OUT/NAME``: the weights as stored are loaded back and evaluated before the two files are
written (:func:`~convnn.checkpoint.save_checkpoint` with ``measure``). The new card is the old one but for the
storage fields and the metrics: ``test_top1`` and ``test_loss`` are the stored weights', and, when saved as int8,
those of the checkpoint it was made from (measured here) become ``test_top1_before_quantization`` and
``test_loss_before_quantization``, unless the card has them already (re-saving an int8 checkpoint keeps the float
model's). The table of results goes to stdout, one row per checkpoint.

Before anything is evaluated or written, every checkpoint is loaded and checked (a CIFAR-10 card whose metrics are
finite numbers, weights that load back once stored in ``--save-dtype``) and every new file's path is planned: the
run stops with a message, having written nothing, when one of them exists already (such as a source, with ``--out``
its own folder), two sources share a name, or a checkpoint cannot be stored. A new card never holds an inf or NaN:
such a measurement stops the run before that checkpoint's files are written.
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

from .checkpoint import BEFORE_SUFFIX, WEIGHTS_DTYPES, ModelCard, checkpoint_paths, load_checkpoint, save_checkpoint
from .data import CIFAR10_CLASSES, DeviceLoader, data_fingerprint, load_cifar10
from .train import evaluate

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
    """

    images: np.ndarray
    labels: np.ndarray
    batch_size: int
    device: torch.device

    def check(self, card: ModelCard) -> None:
        """Raise ``ValueError`` for a card whose classes are not CIFAR-10's or whose input size is not the images'."""
        side = self.images.shape[1]
        if tuple(card.classes) != CIFAR10_CLASSES or card.input_size != side:
            raise ValueError(f"{card.name}: not a CIFAR-10 model: classes {card.classes[:2]}..., input_size "
                             f"{card.input_size} (CIFAR-10: {list(CIFAR10_CLASSES[:2])}..., {side} px)")

    def metrics(self, model: nn.Module, card: ModelCard) -> dict[str, float]:
        """``model``'s ``test_top1`` (percent) and ``test_loss`` (mean cross-entropy), in fp32 on :attr:`device`.

        Args:
            model (nn.Module): a model of a card :meth:`check` accepts; moved to :attr:`device`.
            card (ModelCard): its card (mean and std of the input normalisation).

        Raises:
            ValueError: a metric that is inf or NaN (it is never written into a card).
        """
        loader = DeviceLoader(self.images, self.labels, self.batch_size, self.device, train=False,
                              mean=tuple(card.mean), std=tuple(card.std))
        metrics = evaluate(model.to(self.device), loader, self.device, amp=False)
        _check_finite(metrics, card.name)
        return metrics


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


def _megabytes(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.2f} MB"  # decimal MB, as the repository's size limits


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m convnn.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cards", nargs="+", metavar="CARD.json", help="checkpoints (card, weights or stem)")
    parser.add_argument("--data-root", help="CIFAR-10 folder (convnn.data.load_cifar10). Default: $CONVNN_CIFAR10")
    parser.add_argument("--save-dtype", choices=WEIGHTS_DTYPES,
                        help="re-save each checkpoint in this dtype (with --out)")
    parser.add_argument("--out", type=Path, help="folder for the re-saved checkpoints (with --save-dtype)")
    parser.add_argument("--batch-size", type=int, default=1000, help="images per forward pass. Default: 1000")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help="Default: cuda when there is a GPU, else cpu")
    args = parser.parse_args(argv)
    if (args.save_dtype is None) != (args.out is None):
        parser.error("--save-dtype and --out go together")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {args.out} is a file: give a folder for the re-saved checkpoints")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be ≥ 1, got {args.batch_size}")
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


def _evaluate_one(source: Path, model: nn.Module, card: ModelCard, target: Path | None, save_dtype: str | None,
                  data: EvaluationData, fingerprint: str) -> dict[str, str]:
    """Evaluate one loaded checkpoint and, with a ``target`` stem, re-save it there in ``save_dtype``; its table row.

    The new card is ``card`` with ``model``'s metrics measured here, which
    :func:`~convnn.checkpoint.save_checkpoint` replaces by the stored weights' (keeping them with
    :data:`BEFORE_SUFFIX` for int8) before it writes anything.
    """
    if card.data.get("test_sha256", fingerprint) != fingerprint:
        log.warning("%s: the card's test_sha256 is not that of these test images", card.name)
    metrics = data.metrics(model, card)
    row = {"checkpoint": card.name, "stored": card.weights_dtype, "size": _megabytes(checkpoint_paths(source)[0]),
           "card top-1": f"{card.metrics['test_top1']:.2f}" if "test_top1" in card.metrics else "-",
           "top-1": f"{metrics['test_top1']:.2f}", "loss": f"{metrics['test_loss']:.4f}"}
    if target is not None:
        new_card = replace(card, metrics={**card.metrics, **metrics})
        weights, _ = save_checkpoint(model, target, new_card, getattr(torch, save_dtype), measure=data.metrics)
        stored = new_card.metrics
        row.update({"saved as": save_dtype, "new size": _megabytes(weights),
                    "new top-1": f"{stored['test_top1']:.2f}", "new loss": f"{stored['test_loss']:.4f}",
                    "Δ top-1": f"{stored['test_top1'] - metrics['test_top1']:+.2f}"})
    log.info("%s: %s", card.name, ", ".join(f"{key} {value}" for key, value in row.items() if "top-1" in key))
    return row


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = _parse_args(argv)
    sources = [Path(source) for source in args.cards]
    try:
        loaded = [_load_source(source) for source in sources]
        targets = _plan(sources, args.out)
        images, labels = load_cifar10(args.data_root, "test")
        data = EvaluationData(images, labels, args.batch_size, torch.device(args.device))
        for (model, card), target in zip(loaded, targets, strict=True):
            data.check(card)
            if target is not None:  # storable? (loads back once stored; writes nothing)
                save_checkpoint(model, target, replace(card), getattr(torch, args.save_dtype), write=False)
        fingerprint = data_fingerprint(images, labels)
        rows = [_evaluate_one(source, model, card, target, args.save_dtype, data, fingerprint)
                for source, (model, card), target in zip(sources, loaded, targets, strict=True)]
    except (ValueError, OSError) as err:  # CheckpointError is a ValueError
        sys.exit(f"python -m convnn.evaluate: {err}")
    print(_format_table(rows))


if __name__ == "__main__":
    main()
