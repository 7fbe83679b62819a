"""Which checkpoints the explorer can open, loading them once, and which compute path they run on.

A checkpoint is ``name.safetensors`` + ``name.json`` (:mod:`convnn.checkpoint`). Models are loaded in eval mode and
kept in a bounded cache keyed by the card path and both files' sizes and modification times, so switching back
and forth between checkpoints is instant and a replaced or edited file is reloaded. A model with a layer of more
than :data:`convnn.budget.MAX_EXHAUSTIVE_TOKENS` tokens is refused: the explorer's "all" rule scores every token of
a layer against every other, and so is one whose forward pass overflows on a mid-grey image (inf or NaN in any
module's output: every view of it would show meaningless numbers).

What the page names a checkpoint by is resolved by :func:`checkpoint_card` against what exists, never used as a path:
a shipped checkpoint by its stem (the name the model list shows), an upload by the id
:func:`store_upload` returned, inside the session's own :class:`~analysis.session.workspace.Workspace` folder. An
upload is stored under fixed names and accepted only once it loads.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import reprlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from convnn import CheckpointError, ModelCard, load_checkpoint
from convnn.budget import MAX_EXHAUSTIVE_TOKENS, build_on_meta
from convnn.checkpoint import BEFORE_SUFFIX, check_weights_file, checkpoint_paths
from convnn.introspect import LayerInfo, convnn_layers, layer_facts, model_family

from .caching import bounded_cache
from .image_display import model_input
from .image_intake import image_from_array
from .renamed import RenamedAttribute, renamed_keywords
from .workspace import UPLOADS, Workspace

__all__ = [
    "UPLOAD_PREFIX",
    "CheckpointList",
    "LoadedModel",
    "card_summary",
    "checkpoint_card",
    "list_checkpoints",
    "load_model",
    "store_upload",
]

_MODEL_CACHE_SIZE = 4  # loaded models kept in memory (a CIFAR ResNet or ViT is 5–10 MB of fp32 weights)
UPLOAD_PREFIX = "upload:"  # a checkpoint choice naming an upload: this prefix, then its workspace entry id
_CARD_FILE, _WEIGHTS_FILE = "checkpoint.json", "checkpoint.safetensors"  # an upload's stored names (one stem)
_PROBE_GREY = 128  # the overflow probe: an image of this value in every channel, normalised by the card's mean/std


LOCK_CHECK_S = 0.1  # how often a thread waiting for a model's lock runs its wait check (checking_while_waiting), s
_WAIT_CHECK: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("model_lock_wait_check",
                                                                                        default=None)


class _Held(threading.local):
    def __init__(self) -> None:
        self.locks: list[ModelLock] = []  # the ModelLocks this thread holds, once per acquisition


_HELD = _Held()


class ModelLock:
    """The re-entrant lock of one model's forward passes (:attr:`LoadedModel.lock`; ``with lock:``). A thread that
    waits for it runs the check that :func:`checking_while_waiting` set, every :data:`LOCK_CHECK_S`, and stops
    waiting when the check raises (the server's slow runs: a dropped one stops there instead of waiting behind
    other requests' passes through the same model while it holds the slow views' place). It counts the threads
    waiting for it, so that a thread holding it can tell it holds others up (:func:`holds_up_a_waiter`)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count = threading.Lock()
        self.waiting = 0  # threads waiting for it now

    def __enter__(self) -> ModelLock:
        if not self._lock.acquire(blocking=False):
            check = _WAIT_CHECK.get()
            with self._count:
                self.waiting += 1
            try:
                while not self._lock.acquire(timeout=LOCK_CHECK_S if check else -1):
                    check()
            finally:
                with self._count:
                    self.waiting -= 1
        _HELD.locks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _HELD.locks.remove(self)  # one of its acquisitions: they are alike
        self._lock.release()


def holds_up_a_waiter() -> bool:
    """Whether this thread holds a model's lock (:class:`ModelLock`) that another thread waits for: the server's
    compute shares never hold such a pass back from every core (its waiters would wait on it)."""
    return any(lock.waiting for lock in _HELD.locks)


@contextlib.contextmanager
def checking_while_waiting(check: Callable[[], None]) -> Iterator[None]:
    """Inside, a wait of this thread (and of threads started with a copy of its context) for a model's lock runs
    ``check()`` every :data:`LOCK_CHECK_S`; what it raises ends the wait and is raised from the ``with``."""
    token = _WAIT_CHECK.set(check)
    try:
        yield
    finally:
        _WAIT_CHECK.reset(token)


@renamed_keywords(probes="layer_infos")
@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A checkpoint loaded for analysis: the model in eval mode, its card and the layers the explorer opens.

    Compared and hashed by identity: :func:`load_model` returns the same object for the same unchanged files, so it
    can key the per-image caches of :mod:`analysis.session.traces`.

    Attributes:
        model (nn.Module): the model, eval mode, on ``device``.
        card (ModelCard): the checkpoint's card.
        layer_infos (tuple[LayerInfo, ...]): the layers the explorer can open, in forward order (looked up by name
            with :meth:`layer_info`).
        device (torch.device): where the model runs.
        lock (ModelLock): held by every forward pass through ``model`` in :mod:`analysis`, so concurrent
            requests never interleave with the neighbour recorder (which is per-module state); re-entrant.
    """

    model: nn.Module
    card: ModelCard
    layer_infos: tuple[LayerInfo, ...] = field(default=())
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    lock: ModelLock = field(default_factory=ModelLock)

    probes = RenamedAttribute("layer_infos")  # the old names, for one release (analysis.session.renamed)
    probe = RenamedAttribute("layer_info")
    first_probe = RenamedAttribute("first_layer_info")

    def layer_info(self, name: str) -> LayerInfo:
        """The layer the explorer opens called ``name``.

        Raises:
            ValueError: no such layer (the message lists the known ones).
        """
        for layer_info in self.layer_infos:
            if layer_info.name == name:
                return layer_info
        raise ValueError(f"layer {name!r} is not a layer of {self.card.name} that the explorer opens; "
                         f"choose one of {[layer_info.name for layer_info in self.layer_infos]}")

    @property
    def first_layer_info(self) -> LayerInfo | None:
        """The layer the explorer opens on: the first of a coarser grid than the input (a stem at full resolution
        says little), else the first; None for a model of no layers the explorer opens."""
        coarser = (layer_info for layer_info in self.layer_infos if layer_info.height < self.card.input_size)
        return next(coarser, self.layer_infos[0]) if self.layer_infos else None

    @property
    def max_heads(self) -> int:
        """The most attention heads of any layer the explorer opens (1 for a model of maps only)."""
        return max((layer_info.num_heads for layer_info in self.layer_infos), default=1)


@dataclass(frozen=True)
class CheckpointList:
    """The checkpoints of a folder that the explorer lists, and those it leaves out.

    Attributes:
        found (list[tuple[str, Path]]): ``(label, card path)`` by name; the label is :func:`card_summary`'s first
            line.
        refused (list[tuple[str, str]]): ``(file name, why it cannot be opened)`` by name; neither names the
            folder (a file name that is not UTF-8 is shown with its bytes escaped).
    """

    found: list[tuple[str, Path]]
    refused: list[tuple[str, str]]


def list_checkpoints(folder: str | Path) -> CheckpointList:
    """The checkpoints in ``folder``: each ``*.json`` card with a ``.safetensors`` file next to it (links followed)
    that can be opened, and why each other ``*.json`` cannot, so one bad file never hides the others.

    A checkpoint is left out when its card cannot be read or checked (:meth:`convnn.ModelCard.read`: not a regular
    file, as a FIFO that would block the reader; not UTF-8 JSON; not a valid card, or one holding a lone surrogate
    that no page can carry), its model cannot be built from the card (:func:`convnn.budget.build_on_meta`), its
    weights are missing or not a whole safetensors file (:func:`convnn.checkpoint.check_weights_file`: one still
    being written), or its file name is not UTF-8 text. Nothing but the card and the weights' header is read; what
    :func:`load_model` checks beyond that is found when the model is opened.

    Args:
        folder (str or Path): folder to scan (not recursive); a missing folder holds no checkpoints.
    """
    found, refused = [], []
    for card_path in sorted(Path(folder).glob("*.json"), key=lambda p: p.stem):
        name = card_path.name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        try:
            found.append((_listed_label(card_path, name), card_path))
        except CheckpointError as err:
            refused.append((name, str(err).removeprefix(f"{name}: ")))
    return CheckpointList(found, refused)


def _listed_label(card_path: Path, name: str) -> str:
    """The model list's label of the checkpoint at ``card_path`` (shown as ``name``): its card's title line, after
    the file's stem where the card names the model otherwise (links and lessons name a checkpoint by its stem: a copy
    of ``cnn-l1`` saved as ``mymodel`` was listed as "cnn-l1" while a lesson said the server lists no ``cnn-l1``).

    Raises:
        CheckpointError: why it cannot be opened (:func:`list_checkpoints`); the message names files by name only.
    """
    if name != card_path.name:
        raise CheckpointError(f"{name}: the file name is not UTF-8 text, which the page cannot show")
    weights_path, _ = checkpoint_paths(card_path)
    card = ModelCard.read(card_path, name)
    if not weights_path.exists():
        raise CheckpointError(f"{name}: no {weights_path.name} next to it")
    check_weights_file(weights_path, weights_path.name)
    title = card_summary(card, name).splitlines()[0]
    return title if card.name == card_path.stem else f"{card_path.stem} · {title}"


def _accuracy_text(value: object) -> str:
    """A recorded accuracy in percent as text: ``"93.10%"``, ``"n/a"`` when not a finite number, or "not recorded"."""
    if value is None:
        return "not recorded"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "n/a"
    return f"{value:.2f}%"


_MIXER_TITLES = {"mhsa": "MHSA", "kvt": "KVT", "convnn": "ConvNN-attention"}


def _layers_summary(card: ModelCard, source: str) -> tuple[str, dict | None]:
    """``"<family>, <what its first attention layer, else its first layer is>"`` and the first layer that selects,
    from the model built on the meta device (:func:`convnn.budget.build_on_meta`; the layers describe themselves)."""
    model = build_on_meta(card, source)
    layers = layer_facts(model)
    first = next((facts for facts in layers if facts["kind"] == "attention"), layers[0] if layers else {"kind": ""})
    selecting = next((facts for facts in layers if facts["record_name"] is not None), None)
    if first["kind"] == "attention":
        what = _MIXER_TITLES.get(first["mixer"], first["mixer"])
    elif first["kind"] == "hybrid":
        what = f"hybrid λ={first['branch_ratio']}"
    elif first["kind"] == "conv":
        what = "plain convolutions (no ConvNN layer)"
    else:
        what = "ConvNN2d" if layers else "no ConvNN layer"
    return f"{model_family(model)}, {what}", selecting


def _selection_text(facts: dict) -> str:
    """A layer's selection with the option that sets it: ``"random (r=32)"``, ``"blend (α=0.5)"``, ``"all"``."""
    if facts["num_candidates"] is not None and facts["selection"] == "random":
        return f"random (r={facts['num_candidates']})"
    if facts.get("blend_alpha") is not None:
        return f"{facts['selection']} (α={facts['blend_alpha']})"
    return str(facts["selection"])


def card_summary(card: ModelCard, source: str = "card") -> str:
    """A short human description of a card: name, architecture, λ, K, selection, test accuracy and storage dtype.

    The architecture comes from the model's own layers (built on the meta device, so nothing is allocated); fields
    of an unexpected type are shown as missing (e.g. ``metrics`` that is not a JSON object) and a test accuracy
    that is not a finite number as "n/a", so any card that loads can be described.

    Args:
        card (ModelCard): the card.
        source (str): what a message calls the card. Default: ``"card"``

    Returns:
        str: one title line, then one line per fact (plain text, no markup).

    Raises:
        CheckpointError: a model that cannot be built from the card (:func:`convnn.budget.build_on_meta`), which
            no checkpoint that loads has.
    """
    args = card.model_args if isinstance(card.model_args, dict) else {}
    metrics = card.metrics if isinstance(card.metrics, dict) else {}
    arch, selecting = _layers_summary(card, source)
    selection = _selection_text(selecting) if selecting else "—"
    title = f"{card.name}: {arch}" + (f", K={selecting['num_neighbors']}, {selection}" if selecting else "")
    return "\n".join([
        title,
        f"architecture: {card.model} {json.dumps(args, sort_keys=True, default=str)}",
        f"λ (ConvNN share of channels): {args.get('branch_ratio', '—')}",
        f"K (neighbours per query): {selecting['num_neighbors'] if selecting else '—'}",
        f"selection: {selection}",
        f"test accuracy (top-1): {_accuracy_text(metrics.get('test_top1'))}{_draws_text(card, metrics)}",
        f"input: {card.input_size}×{card.input_size} px, {len(card.classes)} classes",
        f"weights stored as: {card.weights_dtype}" + (
            f" (per-channel scales; before quantisation: {_accuracy_text(metrics.get('test_top1' + BEFORE_SUFFIX))})"
            if card.weights_dtype == "int8" else ""),
    ])


def _draws_text(card: ModelCard, metrics: dict) -> str:
    """How a random-candidate model's accuracy was measured, after the number: ``" ± 0.18 (mean ± std over 5 eval
    draws, input-bits-splitmix64/v2)"`` from the card's ``test_top1_std`` and ``evaluation`` (METHOD §3b); ``""``
    for a card without them."""
    evaluation = card.evaluation if isinstance(card.evaluation, dict) else {}
    spread, draws = metrics.get("test_top1_std"), evaluation.get("draws")
    if isinstance(spread, bool) or not isinstance(spread, int | float) or not math.isfinite(spread) or not draws:
        return ""
    return f" ± {spread:.2f} (mean ± std over {draws} eval draws, {evaluation.get('draw_scheme', 'scheme unrecorded')})"


def _check_layer_tokens(layer_infos: Sequence[LayerInfo], card: ModelCard, source: str) -> None:
    """Refuse a model whose layers the explorer cannot analyse within memory.

    The "all" rule and the attention equivalence demo score all N tokens of a layer against each other (N² scores)
    whatever the layer's own selection, so N is held to :data:`MAX_EXHAUSTIVE_TOKENS`, the budget
    :mod:`convnn.checkpoint` applies only to layers that select exhaustively.

    Raises:
        CheckpointError: a layer with more tokens; the message names ``source``, the layer, N and the limit.
    """
    for layer_info in layer_infos:
        if layer_info.num_tokens > MAX_EXHAUSTIVE_TOKENS:
            raise CheckpointError(
                f"{source}: at input_size {card.input_size}, layer {layer_info.name} has N = {layer_info.num_tokens} "
                f"tokens ({layer_info.height}×{layer_info.width}); the explorer compares every token with every other, "
                f"so it opens models of at most {MAX_EXHAUSTIVE_TOKENS} tokens per layer: use a smaller input_size")


def _outputs(value: object) -> list[Tensor]:
    """The tensors of a module's output (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(value, Tensor):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else ()
    return [t for item in items for t in _outputs(item)]


def _check_finite_forward(model: nn.Module, card: ModelCard, device: str, source: str) -> None:
    """Refuse a model whose forward pass on a mid-grey image gives an inf or NaN anywhere.

    Forward hooks on every module record, in call order, the first whose output is not finite, so the message
    names where the overflow starts (weights scaled far past float32's range reach every later layer as inf).

    Raises:
        CheckpointError: the normalised input or a module's output holds an inf or NaN; the message names ``source``
            and the first module, as ``name (ClassName)``.
    """
    side = card.input_size
    x = model_input(image_from_array(np.full((side, side, 3), _PROBE_GREY, np.uint8)), card).to(device)
    first: list[str] = []

    def hook(name: str):
        def check(module: nn.Module, args: tuple, output: object) -> None:
            if not first and not all(bool(torch.isfinite(t).all()) for t in _outputs(output)):
                first.append(f"{name or 'the whole model'} ({type(module).__name__})")
        return check

    handles = [module.register_forward_hook(hook(name)) for name, module in model.named_modules()]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    where = "the normalised input (the card's mean/std)" if not torch.isfinite(x).all() else first[0] if first else None
    if where is not None:
        raise CheckpointError(f"{source}: on a mid-grey image the output of {where} is not finite (inf or NaN): the "
                              "weights overflow float32, so nothing this model computes means anything")


@bounded_cache(_MODEL_CACHE_SIZE)
def _load_cached(card_path: Path, stamps: tuple[tuple[int, int], tuple[int, int]], device: str) -> LoadedModel:
    """The model of ``card_path``; ``stamps`` (the weights' and the card's size and mtime) only key the cache."""
    model, card = load_checkpoint(card_path, device=device)
    _check_finite_forward(model, card, device, card_path.name)
    layer_infos = convnn_layers(model, card.input_size, device=torch.device(device))
    if not layer_infos:
        raise CheckpointError(f"{card_path.name}: {card.model!r} has no layer these views open (a ConvNN layer, a "
                              "convolution wider than 1×1, or attention over at most "
                              f"{MAX_EXHAUSTIVE_TOKENS} tokens)")
    _check_layer_tokens(layer_infos, card, card_path.name)
    return LoadedModel(model, card, layer_infos, torch.device(device))


def load_model(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Load a checkpoint (cached: the same unchanged files give the same :class:`LoadedModel`; a change to either
    file's size or modification time loads it again).

    Args:
        path (str or Path): the card's ``.json`` path, the ``.safetensors`` path or the stem.
        device (str or torch.device): where the model runs. Default: ``"cpu"``

    Returns:
        LoadedModel: the model in eval mode with its card and layers.

    Raises:
        CheckpointError: a missing or corrupt file, or weights that do not fit the card (from
            :func:`convnn.load_checkpoint`), a layer of more than
            :data:`~convnn.budget.MAX_EXHAUSTIVE_TOKENS` tokens at the card's input size, or a forward pass on a
            mid-grey image that is not finite somewhere (the message names the first module).
    """
    weights_path, card_path = checkpoint_paths(path)
    if not weights_path.is_file() or not card_path.is_file():
        raise CheckpointError(f"checkpoint {Path(path).name!r} needs both {weights_path.name} and {card_path.name}")
    stamps = tuple((stat.st_size, stat.st_mtime_ns) for stat in (weights_path.stat(), card_path.stat()))
    # not resolved: a card that is a link pairs with the weights next to the link, not next to its target
    return _load_cached(card_path.absolute(), stamps, str(torch.device(device)))


def store_upload(files: Sequence[str | Path], workspace: Workspace, session: str | None,
                 device: str | torch.device = "cpu", visitor: str | None = None, address: str | None = None) -> str:
    """Keep an uploaded checkpoint: store its two files as a new entry of ``session`` in ``workspace``, under fixed
    names (nothing the upload says names a path), and load it once.

    Args:
        files (Sequence[str or Path]): the uploaded files, exactly one ``.safetensors`` and one ``.json``.
        workspace (Workspace): where uploads are kept (bounded in bytes and time).
        session (str or None): the uploading session; only it can open the upload (:func:`checkpoint_card`).
        device (str or torch.device): where the check load runs. Default: ``"cpu"``
        visitor (str, optional): whose share of the workspace the files count against. Default: the session's
        address (str, optional): the network address whose ceiling they count against too. Default: None (none)

    Returns:
        str: the choice that names the upload: :data:`UPLOAD_PREFIX` + its entry id.

    Raises:
        ValueError: not one file of each kind, a workspace (or visitor's share, or address's ceiling) without room
            for them or a full disk (nothing is written), or a checkpoint that does not load (a
            :class:`CheckpointError`, re-raised naming the uploaded files instead of the stored ones). Whatever is
            raised after the files are stored, the entry is removed: no half-accepted upload stays behind.
    """
    paths = [Path(f) for f in files]
    cards = [p for p in paths if p.suffix == ".json"]
    weights = [p for p in paths if p.suffix == ".safetensors"]
    if len(cards) != 1 or len(weights) != 1:
        raise ValueError("upload exactly two files: the weights (.safetensors) and the model card (.json)")
    entry = workspace.add(session, UPLOADS, {_CARD_FILE: cards[0], _WEIGHTS_FILE: weights[0]}, visitor, address)
    try:
        load_model(entry / _CARD_FILE, device)
    except Exception as err:  # whatever refused the checkpoint, no half-accepted upload stays behind
        workspace.remove(entry)
        if isinstance(err, ValueError):  # name the user's files, not the stored ones
            message = str(err)
            for stored, uploaded in ((_CARD_FILE, cards[0].name), (_WEIGHTS_FILE, weights[0].name)):
                message = message.replace(str(entry / stored), uploaded).replace(stored, uploaded)
            raise ValueError(message) from err
        raise
    return UPLOAD_PREFIX + entry.name


def checkpoint_card(choice: str | None, folder: str | Path, workspace: Workspace, session: str | None) -> Path:
    """The card file a checkpoint choice names, looked up among what exists: the text is compared with the names of
    the files that are there, never opened, resolved or joined into a path, so it reveals nothing about the server's
    folders.

    Args:
        choice (str or None): a shipped checkpoint's name as the model list offers it, its card's stem
            (``"cnn-l0.5"``), or :data:`UPLOAD_PREFIX` + the id :func:`store_upload` returned; anything else a request
            sends (a path, a number, a list) names no checkpoint.
        folder (str or Path): the shipped checkpoints.
        workspace (Workspace): the uploads.
        session (str or None): the asking session; it reaches its own uploads only.

    Returns:
        Path: the card, for :func:`load_model`.

    Raises:
        ValueError: no choice; a choice that is not text, or not the stem of a ``*.json`` of ``folder`` (the message
            quotes it shortened); an upload that this session does not have (never had, or deleted after its age).
    """
    unknown = ValueError(f"unknown checkpoint {reprlib.repr(choice)}: choose one from the list or upload one")
    if choice is not None and not isinstance(choice, str):
        raise unknown
    if not choice:
        raise ValueError("Choose a model first (or upload a .safetensors + .json checkpoint).")
    if choice.startswith(UPLOAD_PREFIX):
        return workspace.open(session, UPLOADS, choice.removeprefix(UPLOAD_PREFIX)) / _CARD_FILE
    cards = {path.stem: path for path in Path(folder).glob("*.json")}
    if choice in cards:
        return cards[choice]
    if "/" in choice or "\\" in choice:  # not echoed: the page shortens a path to its last part, a model's name
        raise ValueError("unknown checkpoint: a model is named as the list names it (e.g. "
                         f"{reprlib.repr(min(cards, default='cnn-l0.5'))}), never by a path")
    raise unknown
