"""Evaluate checkpoints on the CIFAR-10 test split, and what a storage dtype costs: ``python -m convnn.evaluate``.

Evaluate (GPU if present, else CPU)::

    python -m convnn.evaluate checkpoints/cnn-l0.json checkpoints/vit-mhsa.json --data-root ../shared/data/cifar10

Store int8 weights (per-channel scales, :mod:`convnn.checkpoint`) and evaluate what was stored::

    python -m convnn.evaluate checkpoints/*.json --data-root ../shared/data/cifar10 --save-dtype int8 --out int8

Each checkpoint is evaluated as :func:`~convnn.checkpoint.load_checkpoint` returns it, with training's test
pipeline (:class:`~convnn.data.DeviceLoader` normalising with the card's mean and std, then
:func:`convnn.train.evaluate`) in fp32 without autocast, so the last digit can differ from the card's numbers,
which training measured under bf16 autocast on a GPU. With ``--save-dtype`` and ``--out`` each checkpoint is saved
again in that dtype as ``OUT/NAME``, loaded back from there and evaluated (:func:`~convnn.checkpoint.measure_stored`).
The new card is the old one but for the storage fields and the metrics: ``test_top1`` and ``test_loss`` are the
stored weights', and, when saved as int8, those of the checkpoint it was made from (measured here) become
``test_top1_before_quantization`` and ``test_loss_before_quantization``, unless the card has them already (re-saving
an int8 checkpoint keeps the float model's). The table of results goes to stdout, one row per checkpoint.

Before anything is evaluated or written, every checkpoint is loaded and checked (a CIFAR-10 card whose metrics are
finite numbers) and every new file's path is planned: the run stops with a message, having written nothing, when
one of them exists already (such as a source, with ``--out`` its own folder) or two sources share a name. A new
card never holds an inf or NaN: such a measurement stops the run and removes that checkpoint's two new files.
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
    checkpoint_paths,
    load_checkpoint,
    measure_stored,
    save_checkpoint,
)
from .data import CIFAR10_CLASSES, DeviceLoader, data_fingerprint, load_cifar10
from .train import evaluate

__all__ = ["BEFORE_SUFFIX", "EvaluationData", "main", "resave"]

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
        """``model``'s ``test_top1`` (percent) and ``test_loss`` (mean cross-entropy), in fp32.

        Raises:
            ValueError: a card :meth:`check` refuses.
        """
        self.check(card)
        loader = DeviceLoader(self.images, self.labels, self.batch_size, self.device, train=False,
                              mean=tuple(card.mean), std=tuple(card.std))
        return evaluate(model, loader, self.device, amp=False)


def _check_finite(metrics: dict, source: str) -> None:
    """Raise ``ValueError`` naming ``source`` and the key when a value of ``metrics`` is not a finite number."""
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{source}: metrics.{key} must be a finite number, got {value!r}")


def _new_paths(source: Path, out: Path) -> tuple[Path, Path]:
    """Weights and card paths of ``source`` re-saved into the folder ``out`` (same name).

    Raises:
        ValueError: either file exists already (re-saving never overwrites; with ``out`` the source's own folder,
            that file is the source itself).
    """
    paths = checkpoint_paths(out / checkpoint_paths(source)[0].stem)
    for path in paths:
        if path.exists():
            raise ValueError(f"--out {out}: {path.name} exists there already (from {source}: re-saving never "
                             f"overwrites a file); choose another folder")
    return paths


def resave(source: Path, model: nn.Module, card: ModelCard, metrics: dict[str, float], out: Path,
           dtype: torch.dtype, data: EvaluationData) -> tuple[Path, dict[str, float]]:
    """Save ``model`` in ``dtype`` as ``out/<source's name>``, load it back, evaluate it, note that in its card.

    The new card's metrics are :func:`~convnn.checkpoint.measure_stored`'s. The checkpoint is first saved as
    ``out/.<name>.partial`` and measured from there; only then are the weights renamed and the card written, so an
    interrupted run leaves no card with the source's metrics under the new name (a ``.partial`` pair at most, which
    the next run overwrites). When anything fails after the save, the new files are removed again.

    Args:
        source (Path): the checkpoint ``model`` was loaded from (never overwritten).
        model (nn.Module): the loaded checkpoint.
        card (ModelCard): its card (left unmodified).
        metrics (dict[str, float]): ``model``'s test metrics; an int8 card keeps them with :data:`BEFORE_SUFFIX`.
        out (Path): folder of the new checkpoint (created if needed).
        dtype (torch.dtype): storage dtype, e.g. ``torch.int8``.
        data (EvaluationData): the test data.

    Returns:
        tuple[Path, dict[str, float]]: the new weights file and the stored weights' test metrics.

    Raises:
        ValueError: a new file exists already (:func:`_new_paths`), a tensor that cannot be stored in ``dtype``
            (:func:`~convnn.checkpoint.save_checkpoint`), or a new card metric that is inf or NaN.
        CheckpointError: the written checkpoint does not load back.
    """
    weights_path, card_path = _new_paths(source, out)
    partial_weights, partial_card = save_checkpoint(model, out / f".{weights_path.stem}.partial", replace(card),
                                                    dtype=dtype)
    try:
        stored_card, stored = measure_stored(partial_card, metrics, data.metrics, data.device)
        _check_finite(stored_card.metrics, f"{card_path.name} (saved from {source})")
        partial_weights.replace(weights_path)
    except BaseException:
        partial_weights.unlink(missing_ok=True)
        raise
    finally:
        partial_card.unlink(missing_ok=True)
    stored_card.name = weights_path.stem
    stored_card.write(card_path)
    return weights_path, stored


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


def _plan(sources: list[Path], out: Path | None) -> None:
    """Raise ``ValueError`` when a re-saved file exists already (:func:`_new_paths`) or two sources share a name."""
    if out is None:
        return
    planned: dict[Path, Path] = {}
    for source in sources:
        card_path = _new_paths(source, out)[1].resolve()
        if card_path in planned:
            raise ValueError(f"{planned[card_path]} and {source} would both be re-saved as {card_path}: "
                             f"evaluate them in two runs with different --out folders")
        planned[card_path] = source


def _evaluate_one(source: Path, model: nn.Module, card: ModelCard, args: argparse.Namespace, data: EvaluationData,
                  fingerprint: str) -> dict[str, str]:
    """Evaluate (and with ``--out`` re-save) one loaded checkpoint; returns its table row."""
    model = model.to(data.device)
    if card.data.get("test_sha256", fingerprint) != fingerprint:
        log.warning("%s: the card's test_sha256 is not that of these test images", card.name)
    metrics = data.metrics(model, card)
    row = {"checkpoint": card.name, "stored": card.weights_dtype, "size": _megabytes(checkpoint_paths(source)[0]),
           "card top-1": f"{card.metrics['test_top1']:.2f}" if "test_top1" in card.metrics else "-",
           "top-1": f"{metrics['test_top1']:.2f}", "loss": f"{metrics['test_loss']:.4f}"}
    if args.out is not None:
        weights, stored = resave(source, model, card, metrics, args.out, getattr(torch, args.save_dtype), data)
        row.update({"saved as": args.save_dtype, "new size": _megabytes(weights),
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
        _plan(sources, args.out)
        images, labels = load_cifar10(args.data_root, "test")
        data = EvaluationData(images, labels, args.batch_size, torch.device(args.device))
        for _, card in loaded:
            data.check(card)
        fingerprint = data_fingerprint(images, labels)
        rows = [_evaluate_one(source, model, card, args, data, fingerprint)
                for source, (model, card) in zip(sources, loaded, strict=True)]
    except (ValueError, OSError) as err:  # CheckpointError is a ValueError
        sys.exit(f"python -m convnn.evaluate: {err}")
    print(_format_table(rows))


if __name__ == "__main__":
    main()
