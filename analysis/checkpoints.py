"""Which checkpoints the explorer can open, loading them once, and which compute path they run on.

A checkpoint is ``name.safetensors`` + ``name.json`` (:mod:`convnn.checkpoint`). Models are loaded in eval mode and
kept in a bounded cache keyed by the card path and both files' sizes and modification times, so switching back
and forth between checkpoints is instant and a replaced or edited file is reloaded. A model with a probe layer of more
than :data:`convnn.checkpoint.MAX_EXHAUSTIVE_TOKENS` tokens is refused: the explorer's "all" rule scores every token of
a layer against every other. :func:`store_upload` accepts a user's checkpoint only once it loads.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from convnn import CheckpointError, ModelCard, load_checkpoint
from convnn.checkpoint import BEFORE_SUFFIX, MAX_EXHAUSTIVE_TOKENS, checkpoint_paths
from kernels import resolve_backend

from .probes import ProbeLayer, find_probe_layers

__all__ = [
    "LoadedModel",
    "card_summary",
    "compute_path",
    "list_checkpoints",
    "load_model",
    "store_upload",
]

logger = logging.getLogger(__name__)

_MODEL_CACHE_SIZE = 4  # loaded models kept in memory (a CIFAR ResNet or ViT is 5–10 MB of fp32 weights)


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A checkpoint loaded for analysis: the model in eval mode, its card and its probe layers.

    Compared and hashed by identity: :func:`load_model` returns the same object for the same unchanged files, so it
    can key the per-image caches of :mod:`analysis.probes`.

    Attributes:
        model (nn.Module): the model, eval mode, on ``device``.
        card (ModelCard): the checkpoint's card.
        probes (tuple[ProbeLayer, ...]): the layers the explorer can open, in forward order.
        device (torch.device): where the model runs.
        lock (threading.RLock): held by every forward pass through ``model`` in :mod:`analysis`, so concurrent
            requests never interleave with the neighbour recorder (which is per-module state).
    """

    model: nn.Module
    card: ModelCard
    probes: tuple[ProbeLayer, ...] = field(default=())
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    lock: threading.RLock = field(default_factory=threading.RLock)

    def probe(self, name: str) -> ProbeLayer:
        """The probe layer called ``name``.

        Raises:
            ValueError: no probe layer of that name (the message lists the known ones).
        """
        for probe in self.probes:
            if probe.name == name:
                return probe
        raise ValueError(f"layer {name!r} is not a probe layer of {self.card.name}; "
                         f"choose one of {[p.name for p in self.probes]}")


def list_checkpoints(folder: str | Path) -> list[tuple[str, Path]]:
    """The checkpoints in ``folder``: each readable ``*.json`` card with a ``.safetensors`` file next to it.

    A card that cannot be read (not JSON, not UTF-8, nested too deeply, not a valid model card, an unreadable file:
    :meth:`convnn.ModelCard.read`) is skipped with a logged warning, so one bad file never hides the others.

    Args:
        folder (str or Path): folder to scan (not recursive); a missing folder holds no checkpoints.

    Returns:
        list[tuple[str, Path]]: ``(label, card path)`` sorted by name; the label is :func:`card_summary`'s first line.
    """
    found = []
    for card_path in sorted(Path(folder).glob("*.json"), key=lambda p: p.stem):
        weights_path, _ = checkpoint_paths(card_path)
        if not weights_path.is_file():
            continue
        try:
            card = ModelCard.read(card_path)
        except CheckpointError as err:
            logger.warning("skipping checkpoint %s: %s", card_path.name, err)
            continue
        found.append((card_summary(card).splitlines()[0], card_path))
    return found


def _accuracy_text(value: object) -> str:
    """A recorded accuracy in percent as text: ``"93.10%"``, ``"n/a"`` when not a finite number, or "not recorded"."""
    if value is None:
        return "not recorded"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "n/a"
    return f"{value:.2f}%"


def card_summary(card: ModelCard) -> str:
    """A short human description of a card: name, architecture, λ, K, selection, test accuracy and storage dtype.

    Fields of an unexpected type are shown as missing (e.g. ``metrics`` that is not a JSON object) and a test
    accuracy that is not a finite number as "n/a", so any card that loads can be described.

    Returns:
        str: one title line, then one line per fact (plain text, no markup).
    """
    args = card.model_args if isinstance(card.model_args, dict) else {}
    metrics = card.metrics if isinstance(card.metrics, dict) else {}
    if str(card.model).startswith("convnn_vit"):
        mixer = str(args.get("attention", "mhsa"))
        arch = f"ViT, {mixer.upper() if mixer != 'convnn' else 'ConvNN-attention'}"
        knn = "" if mixer == "mhsa" else f", K={args.get('num_neighbors', 16)}"
    else:
        arch = f"ResNet, hybrid λ={args.get('branch_ratio', 0.5)}"
        knn = "" if args.get("branch_ratio", 0.5) == 0 else f", K={args.get('num_neighbors', 9)}"
    selection = str(args.get("selection", "all"))
    if selection == "random":
        selection += f" (r={args.get('num_candidates')})"
    elif selection == "blend":
        selection += f" (α={args.get('blend_alpha', 0.5)})"
    title = f"{card.name}: {arch}{knn}" + ("" if knn == "" else f", {selection}")
    return "\n".join([
        title,
        f"architecture: {card.model} {json.dumps(args, sort_keys=True, default=str)}",
        f"λ (ConvNN share of channels): {args.get('branch_ratio', '—')}",
        f"K (neighbours per query): {args.get('num_neighbors', '—') if knn else '—'}",
        f"selection: {selection if knn else '—'}",
        f"test accuracy (top-1): {_accuracy_text(metrics.get('test_top1'))}",
        f"input: {card.input_size}×{card.input_size} px, {len(card.classes)} classes",
        f"weights stored as: {card.weights_dtype}" + (
            f" (per-channel scales; before quantisation: {_accuracy_text(metrics.get('test_top1' + BEFORE_SUFFIX))})"
            if card.weights_dtype == "int8" else ""),
    ])


def _check_probe_tokens(probes: Sequence[ProbeLayer], card: ModelCard, source: str) -> None:
    """Refuse a model whose probe layers the explorer cannot analyse within memory.

    The "all" rule and the attention equivalence demo score all N tokens of a layer against each other (N² scores)
    whatever the layer's own selection, so N is held to :data:`MAX_EXHAUSTIVE_TOKENS`, the budget
    :mod:`convnn.checkpoint` applies only to layers that select exhaustively.

    Raises:
        CheckpointError: a probe layer with more tokens; the message names ``source``, the layer, N and the limit.
    """
    for probe in probes:
        if probe.num_tokens > MAX_EXHAUSTIVE_TOKENS:
            raise CheckpointError(
                f"{source}: at input_size {card.input_size}, layer {probe.name} has N = {probe.num_tokens} tokens "
                f"({probe.height}×{probe.width}); the explorer compares every token with every other, so it opens "
                f"models of at most {MAX_EXHAUSTIVE_TOKENS} tokens per layer: use a smaller input_size")


@functools.lru_cache(maxsize=_MODEL_CACHE_SIZE)
def _load_cached(card_path: Path, stamps: tuple[tuple[int, int], tuple[int, int]], device: str) -> LoadedModel:
    """The model of ``card_path``; ``stamps`` (the weights' and the card's size and mtime) only key the cache."""
    model, card = load_checkpoint(card_path, device=device)
    probes = find_probe_layers(model, card.input_size, device=torch.device(device))
    _check_probe_tokens(probes, card, card_path.name)
    return LoadedModel(model, card, probes, torch.device(device))


def load_model(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Load a checkpoint (cached: the same unchanged files give the same :class:`LoadedModel`; a change to either
    file's size or modification time loads it again).

    Args:
        path (str or Path): the card's ``.json`` path, the ``.safetensors`` path or the stem.
        device (str or torch.device): where the model runs. Default: ``"cpu"``

    Returns:
        LoadedModel: the model in eval mode with its card and probe layers.

    Raises:
        CheckpointError: a missing or corrupt file, or weights that do not fit the card (from
            :func:`convnn.load_checkpoint`), or a probe layer of more than
            :data:`~convnn.checkpoint.MAX_EXHAUSTIVE_TOKENS` tokens at the card's input size.
    """
    weights_path, card_path = checkpoint_paths(path)
    if not weights_path.is_file() or not card_path.is_file():
        raise CheckpointError(f"checkpoint {Path(path).name!r} needs both {weights_path.name} and {card_path.name}")
    stamps = tuple((stat.st_size, stat.st_mtime_ns) for stat in (weights_path.stat(), card_path.stat()))
    return _load_cached(card_path.resolve(), stamps, str(torch.device(device)))


def store_upload(files: Sequence[str | Path], folder: str | Path, device: str | torch.device = "cpu") -> Path:
    """Keep an uploaded checkpoint: copy its two files into a new subfolder of ``folder`` and load it once.

    Args:
        files (Sequence[str or Path]): the uploaded files, exactly one ``.safetensors`` and one ``.json``.
        folder (str or Path): where uploads are kept, one fresh subfolder each (so equal names never clash).
        device (str or torch.device): where the check load runs. Default: ``"cpu"``

    Returns:
        Path: the stored card, for :func:`load_model`.

    Raises:
        ValueError: not one file of each kind, or a checkpoint that does not load (a :class:`CheckpointError`,
            re-raised naming the uploaded file instead of the storage folder). Whatever is raised, the subfolder
            is removed: no half-accepted upload stays behind.
    """
    paths = [Path(f) for f in files]
    cards = [p for p in paths if p.suffix == ".json"]
    weights = [p for p in paths if p.suffix == ".safetensors"]
    if len(cards) != 1 or len(weights) != 1:
        raise ValueError("upload exactly two files: the weights (.safetensors) and the model card (.json)")
    target = Path(folder) / uuid.uuid4().hex
    target.mkdir(parents=True)
    card_path = target / cards[0].name
    try:
        shutil.copyfile(cards[0], card_path)
        shutil.copyfile(weights[0], card_path.with_suffix(".safetensors"))
        load_model(card_path, device)
    except Exception as err:  # whatever refused the checkpoint, no half-accepted upload stays behind
        shutil.rmtree(target, ignore_errors=True)
        if isinstance(err, ValueError):  # name the user's file, not the server's upload folder
            raise ValueError(str(err).replace(f"{target}{os.sep}", "")) from err
        raise
    return card_path


def compute_path(device: str | torch.device) -> str:
    """Which ConvNN compute path runs on ``device``: the fused Triton kernel or the PyTorch reference.

    Resolved by :func:`kernels.resolve_backend` (``"auto"``, honouring ``CONVNN_BACKEND``).

    Returns:
        str: e.g. ``"fused Triton kernel on cuda:0"`` or ``"PyTorch reference on cpu"``.
    """
    device = torch.device(device)
    backend = resolve_backend("auto", device)
    name = "fused Triton kernel" if backend == "triton" else "PyTorch reference"
    return f"{name} on {device}"
