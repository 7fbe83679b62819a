"""Checkpoints: weights as safetensors next to a JSON model card that can rebuild the model.

A checkpoint ``name`` is two files: ``name.safetensors`` (the state dict, optionally stored in fp16) and
``name.json``, the card: the registered model name and its arguments (so :func:`convnn.models.create_model`
rebuilds it), the class names and input normalisation, and what a reader needs to trust it (metrics, recipe, data
checksum, hardware, date, and the sha256 of the weights file).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from .models import create_model

__all__ = ["CARD_VERSION", "CheckpointError", "ModelCard", "checkpoint_paths", "load_checkpoint", "save_checkpoint"]

CARD_VERSION = 1
MAX_INPUT_SIZE = 512  # pixels a side: exhaustive ConvNN layers allocate N² scores on the reference path


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing or unreadable files, a card or weights that do not match."""


@dataclass
class ModelCard:
    """The JSON card of a checkpoint.

    Attributes:
        name (str): checkpoint name (file stem).
        model (str): registered model name (:func:`convnn.models.list_models`).
        model_args (dict): keyword arguments of the model constructor.
        classes (list[str]): class names, index = logit.
        input_size (int): square input side in pixels.
        mean (list[float]): per-channel input mean (on [0, 1] pixels).
        std (list[float]): per-channel input std.
        metrics (dict): e.g. ``{"test_top1": 93.1, "test_loss": 0.3}`` (accuracy in percent).
        recipe (dict): the training configuration.
        data (dict): dataset name, splits and checksum.
        training (dict): epochs, seed, train time in seconds, hardware, software versions, date.
        weights_dtype (str): dtype the weights are stored in.
        weights_sha256 (str): sha256 of the ``.safetensors`` file.
        format_version (int): :data:`CARD_VERSION`.
    """

    name: str
    model: str
    model_args: dict
    classes: list[str]
    input_size: int
    mean: list[float]
    std: list[float]
    metrics: dict = field(default_factory=dict)
    recipe: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)
    weights_dtype: str = "float32"
    weights_sha256: str = ""
    format_version: int = CARD_VERSION

    @classmethod
    def from_dict(cls, data: dict, source: str = "card") -> ModelCard:
        """Build a card from parsed JSON. Raises :class:`CheckpointError` on missing or unknown fields."""
        if not isinstance(data, dict):
            raise CheckpointError(f"{source}: a model card must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        required = {"name", "model", "model_args", "classes", "input_size", "mean", "std"}
        missing = required - data.keys()
        if missing:
            raise CheckpointError(f"{source}: model card lacks {sorted(missing)}")
        unknown = data.keys() - known
        if unknown:
            raise CheckpointError(f"{source}: model card has unknown fields {sorted(unknown)}")
        if data.get("format_version", CARD_VERSION) != CARD_VERSION:
            raise CheckpointError(f"{source}: card format {data['format_version']} is not {CARD_VERSION}")
        card = cls(**data)
        card.check(source)
        return card

    def check(self, source: str = "card") -> None:
        """Raise :class:`CheckpointError` for a field of the wrong type or outside its range (named in the message)."""
        def fail(field_name: str, expected: str) -> None:
            value = repr(getattr(self, field_name))
            raise CheckpointError(f"{source}: {field_name} must be {expected}, got "
                                  f"{value if len(value) <= 80 else value[:77] + '...'}")

        for name in ("name", "model"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                fail(name, "a non-empty string")
        for name in ("model_args", "metrics", "recipe", "data", "training"):
            if not isinstance(getattr(self, name), dict):
                fail(name, "a JSON object")
        if (not isinstance(self.classes, list) or not self.classes or len(set(self.classes)) != len(self.classes)
                or not all(isinstance(c, str) for c in self.classes)):
            fail("classes", "a non-empty list of distinct class names")
        if self.model_args.get("num_classes", len(self.classes)) != len(self.classes):
            fail("classes", f"{self.model_args['num_classes']} names (model_args.num_classes)")
        if isinstance(self.input_size, bool) or not isinstance(self.input_size, int) or not (
                1 <= self.input_size <= MAX_INPUT_SIZE):
            fail("input_size", f"an integer in [1, {MAX_INPUT_SIZE}] (pixels)")
        for name, low in (("mean", -math.inf), ("std", 0.0)):
            values = getattr(self, name)
            if not isinstance(values, list) or not values or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) and low < v < math.inf for v in values):
                fail(name, "a non-empty list of finite numbers" + (" > 0" if low == 0.0 else ""))
        if len(self.mean) != len(self.std):
            fail("std", f"as long as mean ({len(self.mean)} channels)")


def checkpoint_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """``(weights, card)`` paths of a checkpoint given as its stem, its ``.json`` or its ``.safetensors``."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in (".json", ".safetensors") else path
    return stem.with_name(stem.name + ".safetensors"), stem.with_name(stem.name + ".json")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_checkpoint(model: nn.Module, path: str | os.PathLike, card: ModelCard,
                    dtype: torch.dtype | None = None) -> tuple[Path, Path]:
    """Write ``model``'s state dict as safetensors and ``card`` as JSON.

    Args:
        model (nn.Module): the model (unwrap DDP first).
        path (str or Path): checkpoint stem (or either file's path).
        card (ModelCard): the card; ``name``, ``weights_dtype`` and ``weights_sha256`` are filled in here.
        dtype (torch.dtype, optional): store floating-point tensors in this dtype (e.g. ``torch.float16``);
            None keeps each tensor's dtype, so a save → load round-trips bit-exactly. Default: None

    Returns:
        tuple[Path, Path]: the weights and card paths.
    """
    weights_path, card_path = checkpoint_paths(path)
    weights_path.parent.mkdir(parents=True, exist_ok=True)
    state = {name: (t.to(dtype) if dtype is not None and t.is_floating_point() else t).detach().cpu().contiguous()
             for name, t in model.state_dict().items()}
    save_file(state, str(weights_path), metadata={"model": card.model, "format_version": str(CARD_VERSION)})
    card.name = weights_path.stem
    card.weights_dtype = str(dtype or next(iter(state.values())).dtype).removeprefix("torch.")
    card.weights_sha256 = _sha256(weights_path)
    card_path.write_text(json.dumps(asdict(card), indent=2) + "\n")
    return weights_path, card_path


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[nn.Module, ModelCard]:
    """Rebuild a model from its card and load its weights, in eval mode.

    Stored fp16 weights are cast to the dtype of the model's own parameters (fp32).

    Args:
        path (str or Path): checkpoint stem, ``.json`` or ``.safetensors`` path.
        device (str or torch.device): where to put the model. Default: ``"cpu"``

    Returns:
        tuple[nn.Module, ModelCard]: the model (eval mode) and its card.

    Raises:
        CheckpointError: a missing file, a card that is not valid JSON or lacks fields, a weights file whose
            sha256 differs from the card's, an unreadable safetensors file, an unknown model, or weights that do
            not fit the model (missing, unexpected or mis-shaped tensors).
    """
    weights_path, card_path = checkpoint_paths(path)
    for file in (weights_path, card_path):
        if not file.is_file():
            raise CheckpointError(f"checkpoint file {file} does not exist")
    try:
        card = ModelCard.from_dict(json.loads(card_path.read_text()), str(card_path))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{card_path}: not a valid JSON model card ({err})") from err
    if card.weights_sha256 and _sha256(weights_path) != card.weights_sha256:
        raise CheckpointError(f"{weights_path}: sha256 differs from the card's: the file is corrupt or replaced")
    try:
        state = load_file(str(weights_path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{weights_path}: not a readable safetensors file ({err})") from err
    try:
        model = create_model(card.model, **card.model_args)
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{card_path}: cannot build model {card.model!r} ({err})") from err
    own = model.state_dict()
    missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
    misshaped = sorted(name for name in own.keys() & state.keys() if own[name].shape != state[name].shape)
    if missing or unexpected or misshaped:
        problems = [f"{len(names)} {kind} (e.g. {names[0]})"
                    for kind, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
                    if names]
        raise CheckpointError(f"{weights_path.name}: weights do not fit {card.model!r} built from the card: "
                              + ", ".join(problems))
    model.load_state_dict({name: t.to(own[name].dtype) for name, t in state.items()}, strict=True)
    return model.to(device).eval(), card
