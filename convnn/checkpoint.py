"""Checkpoints: weights as safetensors next to a JSON model card that can rebuild the model.

A checkpoint ``name`` is two files: ``name.safetensors`` (the state dict, optionally stored in fp16, bf16 or
int8) and ``name.json``, the card (:class:`convnn.card.ModelCard`, re-exported here): the registered model name and
its arguments (so :func:`convnn.models.create_model` rebuilds it), the class names and input normalisation, and what
a reader needs to trust it (metrics, recipe, data checksum, hardware, date, the storage dtype and the sha256 of the
weights file).

How the weights are stored (fp16, bf16, fp32, or int8 with per-channel scales) is :mod:`convnn.storage`.

Saving and loading agree: :func:`save_checkpoint` serialises the weights and the card in memory, reads them back
with :func:`load_checkpoint`'s own checks (so it refuses whatever the loader would refuse), optionally measures that
loaded model, and only then writes the two files, each through a temporary file renamed into place, so a save that
fails leaves an existing checkpoint as it was. Every model is checked on the ``meta`` device before it is built (its
size, the token count of exhaustive ConvNN layers, and one logit per class at the card's input size), so a card
cannot make the loader allocate more than :data:`convnn.budget.MAX_PARAMETERS` values. Measured metrics
(``save_checkpoint(..., measure=...)``): ``test_top1`` and ``test_loss`` are those of the weights as stored; an int8
card also keeps the saved model's as ``test_top1_before_quantization`` and ``test_loss_before_quantization``
(:data:`BEFORE_SUFFIX`), which a card of weights stored otherwise never holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import safetensors.torch
import torch
from safetensors import SafetensorError
from torch import nn

from .budget import check_model
from .card import CARD_VERSION, WEIGHTS_DTYPES, CheckpointError, ModelCard, check_regular_file
from .models import create_model
from .storage import (
    INT8_SCALE_SUFFIX,
    dequantize,
    describe_problems,
    not_finite,
    storage_state,
    weights_dtype_name,
)

__all__ = ["BEFORE_SUFFIX", "CARD_VERSION", "INT8_SCALE_SUFFIX", "STORED_METRICS", "WEIGHTS_DTYPES",
           "CheckpointError", "ModelCard", "StagedCheckpoint", "check_weights_file", "checkpoint_paths",
           "load_checkpoint", "save_checkpoint", "stage_checkpoint"]

ALIASES_KEY = "tied"  # safetensors metadata: JSON {alias: stored name} of tied tensors stored once
STORED_METRICS = ("test_top1", "test_loss")  # the metrics save_checkpoint(measure=...) replaces by the stored weights'
BEFORE_SUFFIX = "_before_quantization"  # int8 card: the float model's metrics, e.g. test_top1<suffix>


def checkpoint_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """``(weights, card)`` paths of a checkpoint given as its stem, its ``.json`` or its ``.safetensors``."""
    path = Path(path)
    stem = path.with_suffix("") if path.suffix in (".json", ".safetensors") else path
    return stem.with_name(stem.name + ".safetensors"), stem.with_name(stem.name + ".json")


def check_weights_file(path: str | os.PathLike, source: str) -> None:
    """Refuse a weights file that cannot be opened, without reading its tensors: not a regular file
    (:func:`~convnn.card.check_regular_file`), or not a whole safetensors file (a header that cannot be read, or a
    file shorter or longer than its header says: one still being written). What :func:`load_checkpoint` checks
    beyond that (the card's sha256, the tensors against the model) needs the whole file.

    Raises:
        CheckpointError: the file is not one; the message names ``source``.
    """
    check_regular_file(path, source)
    try:
        with safetensors.safe_open(path, framework="pt"):
            pass
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{source}: not a whole safetensors file ({err})") from err


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _aliases(data: bytes, source: str) -> dict[str, str]:
    """The tied names a weights file leaves out (alias → stored name), from its safetensors metadata, as written;
    :func:`_check_aliases` checks them against the file and the model.

    The metadata is the JSON header the safetensors format puts first: an 8-byte little-endian length, then the
    header, whose ``"__metadata__"`` holds :data:`ALIASES_KEY` (written by :func:`stage_checkpoint`).

    Raises:
        CheckpointError: an aliases entry that is not JSON (nested too deeply for the parser included) or not a JSON
            object of names; the message names ``source``.
    """
    header_size = int.from_bytes(data[:8], "little")
    try:
        metadata = json.loads(data[8:8 + header_size]).get("__metadata__") or {}
        aliases = json.loads(metadata[ALIASES_KEY]) if ALIASES_KEY in metadata else {}
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"{source}: the tied-weight aliases are not readable JSON ({type(err).__name__}: "
                              f"{str(err)[:200]})") from err
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
        raise CheckpointError(f"{source}: the tied-weight aliases must be a JSON object of tensor names")
    return aliases


def _check_aliases(aliases: dict[str, str], state: dict[str, torch.Tensor], own: dict[str, torch.Tensor],
                   source: str) -> None:
    """Refuse a tie the model cannot hold: each alias must be a tensor the file leaves out, tied to one it stores
    (not an int8 scale, not another alias), and the model must hold both with the same shape and dtype.

    Args:
        aliases (dict[str, str]): alias → stored name (:func:`_aliases`), every alias a tensor of ``own``.
        state (dict[str, Tensor]): the stored tensors, int8 scales removed, every name a tensor of ``own``.
        own (dict[str, Tensor]): the state dict of the model built from the card.
        source (str): the file name, for messages.

    Raises:
        CheckpointError: the first alias (by name) that breaks a rule; the message names it, its target and why.
    """
    for alias, target in sorted(aliases.items()):
        if alias in state or target not in state:
            raise CheckpointError(f"{source}: the tied-weight alias {alias!r} → {target!r} must tie a tensor the file "
                                  "leaves out to one it stores")
        expected, tied = own[alias], own[target]
        if expected.shape != tied.shape or expected.dtype != tied.dtype:
            raise CheckpointError(
                f"{source}: the tied-weight alias {alias!r} → {target!r} ties tensors of different shapes or dtypes: "
                f"the model holds {tuple(expected.shape)} {str(expected.dtype).removeprefix('torch.')} and "
                f"{tuple(tied.shape)} {str(tied.dtype).removeprefix('torch.')}")


def _restore(data: bytes, card: ModelCard, weights_path: Path, card_path: Path) -> nn.Module:
    """The model ``card`` describes, holding the weights serialised in ``data``, in eval mode on the CPU.

    The checks of :func:`load_checkpoint` after the card is read: :func:`save_checkpoint` runs them on what it is
    about to write. The model is checked from its card and on the ``meta`` device (:func:`convnn.budget.check_model`)
    before it is built, and shapes are checked before anything is dequantized.

    Args:
        data (bytes): the contents of a ``.safetensors`` weights file.
        card (ModelCard): its card (already checked).
        weights_path (Path): the weights file, for messages.
        card_path (Path): the card file, for messages.

    Raises:
        CheckpointError: a model the card cannot have (:func:`convnn.budget.check_model`: one that costs too much,
            cannot be built, holds too many values, does not run at the card's input size, has a ConvNN layer that
            would score too many tokens there, or gives a number of logits other than the card's classes), an
            unreadable safetensors
            file, weights that do not fit the model (missing, unexpected or mis-shaped tensors), tied-weight
            aliases that are not JSON or tie what the model cannot (:func:`_check_aliases`), tensors that do not
            match the card's ``weights_dtype`` (:func:`convnn.storage.dequantize`), or a weight that is inf or NaN
            once loaded.
    """
    check_model(card, str(card_path))
    try:
        state = safetensors.torch.load(data)
    except SafetensorError as err:
        raise CheckpointError(f"{weights_path}: not a readable safetensors file ({err})") from err
    aliases = _aliases(data, weights_path.name)
    model = create_model(card.model, **card.model_args)
    own = model.state_dict()
    scales = {name.removesuffix(INT8_SCALE_SUFFIX): state.pop(name) for name in list(state)
              if name.endswith(INT8_SCALE_SUFFIX)}
    common = own.keys() & state.keys()
    stored = state.keys() | aliases.keys()
    problems = {"missing": sorted(own.keys() - stored), "unexpected": sorted(stored - own.keys()),
                "mis-shaped": sorted(name for name in common if own[name].shape != state[name].shape)}
    if any(problems.values()):
        raise CheckpointError(f"{weights_path.name}: weights do not fit {card.model!r} built from the card: "
                              + describe_problems(problems))
    _check_aliases(aliases, state, own, weights_path.name)
    stored_dtypes = {name: tensor.dtype for name, tensor in state.items()}
    state = dequantize(state, scales, own, card.weights_dtype, weights_path.name)
    state.update({alias: state[name] for alias, name in aliases.items()})  # tied weights: one stored tensor
    stored_dtypes.update({alias: stored_dtypes[name] for alias, name in aliases.items()})
    broken = not_finite(state)
    if broken:
        hint = ", which ends at ±65504" if stored_dtypes[broken[0]] == torch.float16 else ""
        raise CheckpointError(f"{weights_path.name}: {len(broken)} tensors hold an inf or NaN once loaded (e.g. "
                              f"{broken[0]}, stored as {stored_dtypes[broken[0]]}{hint})")
    model.load_state_dict({name: t.to(own[name].dtype) for name, t in state.items()}, strict=True)
    return model.eval()


@dataclass(frozen=True)
class StagedCheckpoint:
    """A checkpoint checked, measured and serialised by :func:`stage_checkpoint`, not yet on disk.

    Attributes:
        weights_path (Path): where the weights go.
        card_path (Path): where the card goes (same folder).
        card (ModelCard): the card as :func:`load_checkpoint` will read it back.
        weights (bytes): the ``.safetensors`` file.
        card_text (str): the ``.json`` file.
    """

    weights_path: Path
    card_path: Path
    card: ModelCard
    weights: bytes
    card_text: str

    def write(self) -> tuple[Path, Path]:
        """Write the two files, overwriting existing ones, all-or-nothing up to the last step.

        Each file is written to a temporary file in the destination folder (created if needed) and synced, then
        both are renamed over their destinations (``os.replace``, weights first). A failure before the renames
        leaves an existing checkpoint at these paths as it was and removes the temporary files.

        Returns:
            tuple[Path, Path]: the weights and card paths.

        Raises:
            OSError: the folder or a file cannot be written.
        """
        self.weights_path.parent.mkdir(parents=True, exist_ok=True)
        files = ((self.weights_path, self.weights), (self.card_path, self.card_text.encode("utf-8")))
        temporary: list[Path] = []
        try:
            for path, content in files:
                partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
                with partial.open("xb") as file:  # the usual permissions (0o666 less the umask), never an old file
                    temporary.append(partial)
                    file.write(content)
                    file.flush()
                    os.fsync(file.fileno())
            for partial, (path, _) in zip(temporary, files, strict=True):
                os.replace(partial, path)
        finally:
            for partial in temporary:
                partial.unlink(missing_ok=True)
        return self.weights_path, self.card_path


def _card_metrics(metrics: dict, measured: dict | None, weights_dtype: str) -> dict:
    """The metrics of a staged card: the :data:`STORED_METRICS` of ``measured`` (the weights as stored) over the
    card's own, which an int8 card keeps as ``<name>`` + :data:`BEFORE_SUFFIX` (unless it has those already); a card
    of weights stored otherwise keeps no ``*_before_quantization`` metrics."""
    before_names = {name + BEFORE_SUFFIX for name in STORED_METRICS}
    if measured is not None:
        before = {name + BEFORE_SUFFIX: metrics[name] for name in STORED_METRICS
                  if weights_dtype == "int8" and name in metrics}
        metrics = {**before, **metrics, **measured}
    if weights_dtype != "int8":
        metrics = {key: value for key, value in metrics.items() if key not in before_names}
    return metrics


def stage_checkpoint(model: nn.Module, path: str | os.PathLike, card: ModelCard, dtype: torch.dtype | None = None,
                     measure: Callable[[nn.Module, ModelCard], dict[str, float]] | None = None) -> StagedCheckpoint:
    """Everything :func:`save_checkpoint` does but write: ``model`` and ``card`` checked, measured and serialised.

    The weights are serialised in memory and the card (a copy: ``card`` itself is left as it is) is given the
    checkpoint's ``name``, ``weights_dtype`` and ``weights_sha256``, serialised as JSON and read back as
    :func:`load_checkpoint` reads it (:meth:`ModelCard.from_json`: every field checked); the weights are loaded back
    with the loader's checks, so a checkpoint the loader would refuse is never staged. With ``measure``, that loaded
    model (the weights exactly as stored) is measured, and its :data:`STORED_METRICS` replace the card's; when
    stored as int8, the card's own values of those metrics (the saved model's, measured by the caller) are kept as
    ``<name>`` + :data:`BEFORE_SUFFIX`, unless the card has those keys already (an int8 checkpoint saved again as
    int8 keeps the original float model's). Weights not stored as int8 keep no ``*_before_quantization`` metrics
    (they would describe another storage). The final card is serialised once more, so nothing can fail writing it.

    Args: as :func:`save_checkpoint`.

    Returns:
        StagedCheckpoint: the paths, the final card and both files' contents; :meth:`StagedCheckpoint.write`
        writes them.

    Raises:
        ValueError: ``dtype`` not one of :data:`WEIGHTS_DTYPES`; a model without floating tensors, or one that
            holds an inf or NaN; with int8, an empty floating tensor of ndim ≥ 2; with None, floating tensors of
            several dtypes or of one outside :data:`WEIGHTS_DTYPES`. The message names the tensor or dtypes.
        CheckpointError: a card value JSON cannot represent (:meth:`ModelCard.to_json`: numpy and torch scalars
            are converted, other objects refused), before or after ``measure``; or what would be written does not
            load back (:func:`load_checkpoint`: a card field it refuses, such as a zero std, another
            ``format_version`` or nesting deeper than 16 levels; a card that does not fit the model, such as a class
            count other than its logits or an input size it cannot run; a weight that overflows ``dtype``, such as
            1e6 in float16 or ±float32-max in int8); the message names the tensor or card field.
        Exception: whatever ``measure`` raises.
    """
    if dtype is not None and str(dtype).removeprefix("torch.") not in WEIGHTS_DTYPES:
        raise ValueError(f"dtype must be None or one of {[f'torch.{name}' for name in WEIGHTS_DTYPES]}, got {dtype}")
    broken = not_finite(model.state_dict())
    if broken:
        raise ValueError(f"{len(broken)} tensors of the model hold an inf or NaN (e.g. {broken[0]}): not saved")
    weights_path, card_path = checkpoint_paths(path)
    state, aliases = storage_state(model, dtype)
    weights_dtype = weights_dtype_name(state, dtype)
    metadata = {"model": card.model, "format_version": str(CARD_VERSION)}
    if aliases:
        metadata[ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
    data = safetensors.torch.save(state, metadata=metadata)
    draft = replace(card, name=weights_path.stem, weights_dtype=weights_dtype, weights_sha256=_sha256(data))
    text = draft.to_json(str(card_path))
    try:
        checked = ModelCard.from_json(text, str(card_path))
        stored = _restore(data, checked, weights_path, card_path)
    except CheckpointError as err:
        raise CheckpointError(f"not saved, as load_checkpoint would refuse it: {err}") from err
    measured = measure(stored, checked) if measure is not None else None
    text = replace(checked, metrics=_card_metrics(checked.metrics, measured, weights_dtype)).to_json(str(card_path))
    return StagedCheckpoint(weights_path, card_path, ModelCard.from_json(text, str(card_path)), data, text)


def save_checkpoint(model: nn.Module, path: str | os.PathLike, card: ModelCard, dtype: torch.dtype | None = None,
                    measure: Callable[[nn.Module, ModelCard], dict[str, float]] | None = None,
                    write: bool = True) -> tuple[Path, Path]:
    """Write ``model``'s state dict as safetensors and ``card`` as JSON, after loading back what would be written.

    :func:`stage_checkpoint` checks, measures and serialises both files in memory (a checkpoint the loader would
    refuse, or a card that JSON cannot hold, raises before anything is written); then
    :meth:`StagedCheckpoint.write` writes them through temporary files renamed into place, so a failure leaves an
    existing checkpoint at ``path`` as it was. A card never claims metrics that were not measured.

    Args:
        model (nn.Module): the model (unwrap DDP first).
        path (str or Path): checkpoint stem (or either file's path).
        card (ModelCard): the card. Only on success are its ``name``, ``weights_dtype``, ``weights_sha256`` and
            ``metrics`` set to the written card's (measured metrics, numpy or torch scalars as Python numbers); a
            call that raises leaves it as it was.
        dtype (torch.dtype, optional): store floating-point tensors in this dtype (``torch.float32``,
            ``torch.float16`` or ``torch.bfloat16``), or ``torch.int8``: floating tensors with ndim ≥ 2 as int8 with
            per-output-channel scales, the others in fp16 (module docstring); None keeps each tensor's dtype, so a
            save → load round-trips bit-exactly. Default: None
        measure (Callable[[nn.Module, ModelCard], dict[str, float]], optional): the :data:`STORED_METRICS` of a
            model (float, eval mode, on the CPU: move it where it should run) with its card, e.g.
            :meth:`convnn.evaluate.EvaluationData.metrics`. In a distributed run every rank calls
            ``save_checkpoint`` (``measure`` may reduce over the ranks), and only one writes. Default: None
        write (bool): write the two files; False only checks (and measures) what would be written. Default: True

    Returns:
        tuple[Path, Path]: the weights and card paths.

    Raises:
        ValueError: an unstorable dtype or model (:func:`stage_checkpoint`).
        CheckpointError: a card JSON cannot hold, or what would be written does not load back
            (:func:`stage_checkpoint`); nothing is written then.
        OSError: a file cannot be written (:meth:`StagedCheckpoint.write`); an existing checkpoint is left as it was.
        Exception: whatever ``measure`` raises; nothing is written then.
    """
    staged = stage_checkpoint(model, path, card, dtype, measure)
    if write:
        staged.write()
    for name in ("name", "weights_dtype", "weights_sha256", "metrics"):
        setattr(card, name, getattr(staged.card, name))
    return staged.weights_path, staged.card_path


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[nn.Module, ModelCard]:
    """Rebuild a model from its card and load its weights, in eval mode.

    Stored fp16 weights are cast to the dtype of the model's own parameters (fp32); int8 weights (card
    ``weights_dtype == "int8"``) are multiplied by their scales first (module docstring), so the model is the same
    kind of float model either way. Shapes are checked before anything is dequantized.

    Args:
        path (str or Path): checkpoint stem, ``.json`` or ``.safetensors`` path.
        device (str or torch.device): where to put the model. Default: ``"cpu"``

    Returns:
        tuple[nn.Module, ModelCard]: the model (eval mode) and its card.

    Raises:
        CheckpointError: a missing file, a card that is not valid JSON or lacks fields (:meth:`ModelCard.read`), a
            weights file whose sha256 differs from the card's, an unreadable safetensors file, an unknown model,
            weights that do not fit the model (missing, unexpected or mis-shaped tensors, tied-weight aliases it
            cannot hold), floating tensors or int8 tensors and scales that do not match each other or the card's
            ``weights_dtype`` or are not finite (:func:`convnn.storage.dequantize`), a weight that is inf or NaN once
            loaded, or a model the card cannot have (:func:`convnn.budget.check_model`: over the budget, not runnable
            at the card's input size, a ConvNN layer that would score too many tokens there, or a number of logits
            other than the card's classes).
    """
    weights_path, card_path = checkpoint_paths(path)
    for file in (weights_path, card_path):
        if not file.exists():
            raise CheckpointError(f"checkpoint file {file} does not exist")
        check_regular_file(file, str(file))  # a FIFO would block the reader
    card = ModelCard.read(card_path)
    try:
        data = weights_path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"{weights_path}: cannot be read ({err})") from err
    if card.weights_sha256 and _sha256(data) != card.weights_sha256:
        raise CheckpointError(f"{weights_path}: sha256 differs from the card's: the file is corrupt or replaced")
    return _restore(data, card, weights_path, card_path).to(device), card
