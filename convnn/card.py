"""The model card: the JSON half of a checkpoint, which rebuilds the model and says what a reader needs to trust it.

Fields, types and ranges are checked on reading (:meth:`ModelCard.check`); :mod:`convnn.checkpoint` reads and
writes cards next to their weights.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

__all__ = ["CARD_VERSION", "MAX_INPUT_SIZE", "WEIGHTS_DTYPES", "CheckpointError", "ModelCard", "check_regular_file"]

CARD_VERSION = 1
MAX_INPUT_SIZE = 512  # pixels a side
_MIN_STD = 1e-6  # the card's std: smaller ones blow normalised inputs up past fp32
WEIGHTS_DTYPES = ("float32", "float16", "bfloat16", "int8")  # the card's weights_dtype: torch dtype names
MAX_CARD_BYTES = 256 * 1024  # a card's JSON, at most (cards are ≈ 2.5 KB): parsing costs ≈ 3 s and 300 MB per MB
_PLACEMENT_ARGS = frozenset({"device", "dtype"})  # constructor arguments a card may not give (the loader places)
_MAX_CARD_NESTING = 16  # JSON levels a card may nest; cards use 4 (card → recipe → model_args → widths)


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
        mean (list[float]): input mean per RGB channel (3 values, on [0, 1] pixels).
        std (list[float]): input std per RGB channel (3 values, each ≥ 1e-6).
        metrics (dict): e.g. ``{"test_top1": 93.1, "test_loss": 0.3}`` (accuracy in percent).
        recipe (dict): the training configuration.
        data (dict): dataset name, splits and checksum.
        training (dict): epochs, seed, train time in seconds, hardware, software versions, date.
        evaluation (dict): how the metrics were measured, where a reader needs it: for a model with random
            candidates, ``draw_scheme`` (:data:`convnn.candidates.DRAW_SCHEME`) and ``draws`` (the number of eval
            draws that ``test_top1`` and ``test_loss`` average and ``test_top1_std`` spreads over, METHOD §3b);
            empty otherwise.
        weights_dtype (str): dtype the weights are stored in: ``"float32"``, ``"float16"``, ``"bfloat16"`` or
            ``"int8"`` (int8 with per-channel scales, fp16 for tensors with ndim < 2; module docstring).
        weights_sha256 (str): sha256 of the ``.safetensors`` file (64 lowercase hex digits), or ``""``: not
            recorded, so not checked on load.
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
    evaluation: dict = field(default_factory=dict)
    weights_dtype: str = "float32"
    weights_sha256: str = ""
    format_version: int = CARD_VERSION

    @classmethod
    def read(cls, path: str | os.PathLike, source: str | None = None) -> ModelCard:
        """Read and check the card at ``path`` (the ``.json`` file; a link is followed).

        Args:
            path (str or Path): the card file.
            source (str, optional): what messages call the file. Default: ``path``

        Raises:
            CheckpointError: the file cannot be read or is not a regular file (:func:`check_regular_file`: a FIFO
                would block the reader), is larger than :data:`MAX_CARD_BYTES` (refused before it is read), is not
                UTF-8 JSON (or nests too deeply to parse), or is not a valid card (:meth:`from_json`); the message
                names ``source``.
        """
        source = str(path) if source is None else source
        size = check_regular_file(path, source)
        if size > MAX_CARD_BYTES:
            raise CheckpointError(_too_large(source, size))
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{source}: not a readable JSON model card ({type(err).__name__}: {err})") from err
        return cls.from_json(text, source)

    @classmethod
    def from_json(cls, text: str, source: str = "card") -> ModelCard:
        """Parse and check a card's JSON text (what :meth:`read` reads and :meth:`to_json` writes).

        Raises:
            CheckpointError: ``text`` is over :data:`MAX_CARD_BYTES` in UTF-8, not JSON (or nests too deeply, or
                holds an integer too long, to parse), or not a valid card (:meth:`from_dict`); the message names
                ``source``.
        """
        size = len(text.encode("utf-8", errors="surrogatepass"))
        if size > MAX_CARD_BYTES:
            raise CheckpointError(_too_large(source, size))
        try:
            data = json.loads(text)
        except ValueError as err:
            if "integer string conversion" in str(err):  # Python's bound on int("…") (sys.get_int_max_str_digits)
                raise CheckpointError(f"{source}: the model card holds an integer of more than "
                                      f"{sys.get_int_max_str_digits():,} digits: no field needs one") from err
            raise CheckpointError(f"{source}: not a readable JSON model card ({type(err).__name__}: {err})") from err
        except RecursionError as err:
            raise CheckpointError(f"{source}: not a readable JSON model card ({type(err).__name__}: {err})") from err
        return cls.from_dict(data, source)

    @classmethod
    def from_dict(cls, data: dict, source: str = "card") -> ModelCard:
        """Build a card from parsed JSON.

        Raises:
            CheckpointError: not a JSON object, nested deeper than ``_MAX_CARD_NESTING`` levels, missing or unknown
                fields, or a field :meth:`check` refuses.
        """
        if not isinstance(data, dict):
            raise CheckpointError(f"{source}: a model card must be a JSON object, got {type(data).__name__}")
        if _nesting(data) > _MAX_CARD_NESTING:
            raise CheckpointError(f"{source}: the model card nests more than {_MAX_CARD_NESTING} levels deep")
        try:  # JSON may escape a lone surrogate ("\\ud800"), which no UTF-8 text (a page, a reply) can carry
            json.dumps(data, ensure_ascii=False, default=str).encode("utf-8")
        except UnicodeEncodeError as err:
            raise CheckpointError(f"{source}: the model card holds text that is not valid Unicode (a lone "
                                  "surrogate, such as \\ud800 in its JSON)") from err
        known = {f.name for f in fields(cls)}
        required = {"name", "model", "model_args", "classes", "input_size", "mean", "std"}
        missing = required - data.keys()
        if missing:
            raise CheckpointError(f"{source}: model card lacks {sorted(missing)}")
        unknown = data.keys() - known
        if unknown:
            raise CheckpointError(f"{source}: model card has unknown fields {sorted(unknown)}")
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
        for name in ("model_args", "metrics", "recipe", "data", "training", "evaluation"):
            if not isinstance(getattr(self, name), dict):
                fail(name, "a JSON object")
        if (not isinstance(self.classes, list) or not self.classes or len(set(self.classes)) != len(self.classes)
                or not all(isinstance(c, str) for c in self.classes)):
            fail("classes", "a non-empty list of distinct class names")
        placed = sorted(_PLACEMENT_ARGS & self.model_args.keys())
        if placed:
            raise CheckpointError(f"{source}: model_args may not set {', '.join(placed)}: where a model is built and "
                                  "its number type are the loader's to choose, not the card's")
        num_classes = self.model_args.get("num_classes", len(self.classes))
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise CheckpointError(f"{source}: model_args.num_classes must be a positive integer, got "
                                  f"{repr(num_classes)[:80]}")
        if num_classes != len(self.classes):
            fail("classes", f"{num_classes} names (model_args.num_classes)")
        if isinstance(self.input_size, bool) or not isinstance(self.input_size, int) or not (
                1 <= self.input_size <= MAX_INPUT_SIZE):
            fail("input_size", f"an integer in [1, {MAX_INPUT_SIZE}] (pixels)")
        for name, low in (("mean", -math.inf), ("std", _MIN_STD)):
            values = getattr(self, name)
            if not isinstance(values, list) or len(values) != 3 or not all(
                    isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= low
                    for v in values):
                fail(name, "3 finite numbers, one per RGB channel" + (f", each ≥ {low:g}" if name == "std" else ""))
        if self.weights_dtype not in WEIGHTS_DTYPES:
            fail("weights_dtype", f"one of {list(WEIGHTS_DTYPES)}")
        if not isinstance(self.weights_sha256, str) or not re.fullmatch("|[0-9a-f]{64}", self.weights_sha256):
            fail("weights_sha256", "64 lowercase hex digits, or '' (not recorded)")
        if type(self.format_version) is not int or self.format_version != CARD_VERSION:
            fail("format_version", f"the integer {CARD_VERSION} (the card format this code reads)")

    def to_json(self, source: str = "card") -> str:
        """The card as indented JSON text, one field per key in field order, ending in a newline.

        A numpy or PyTorch scalar (anything 0-d with ``.item()``, such as ``np.float32(61.5)`` or a 0-d tensor) is
        written as the Python number ``.item()`` returns, so a metric computed with numpy or torch can be stored.
        Nothing is checked here: :meth:`from_json` reads the text back as a card.

        Raises:
            CheckpointError: a value JSON cannot represent (any other object, e.g. a set or a tensor of several
                elements), a circular reference, or nesting too deep to serialise; the message names ``source``
                and the value's type.
        """
        try:
            return json.dumps({f.name: getattr(self, f.name) for f in fields(self)}, indent=2,
                              default=_json_scalar) + "\n"
        except (TypeError, ValueError, RuntimeError) as err:  # RecursionError is a RuntimeError
            raise CheckpointError(f"{source}: the model card cannot be written as JSON ({err})") from err


def check_regular_file(path: str | os.PathLike, source: str) -> int:
    """The size in bytes of ``path``, a regular file once links are followed (not a folder, a FIFO or a device,
    which a reader would wait on forever), checked without opening it.

    Raises:
        CheckpointError: ``path`` cannot be looked up (missing, a broken link, no permission) or is not a regular
            file; the message names ``source``.
    """
    try:
        status = os.stat(path)
    except OSError as err:
        raise CheckpointError(f"{source}: cannot be read ({err.strerror})") from err
    if not stat.S_ISREG(status.st_mode):
        raise CheckpointError(f"{source}: not a regular file")
    return status.st_size


def _json_scalar(value: object) -> object:
    """``json.dumps``'s ``default``: a 0-d numpy or PyTorch value as the Python number ``value.item()`` returns.

    Raises:
        TypeError: ``value`` is not 0-d or has no ``.item()``; the message names its type.
    """
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        return value.item()
    kind = type(value)
    raise TypeError(f"a {kind.__module__}.{kind.__qualname__} is not a JSON value: {value!r:.80}")


def _too_large(source: str, size: int) -> str:
    return (f"{source}: the model card is {size / 1024:.0f} KB, more than a card's {MAX_CARD_BYTES // 1024} KB "
            "(its fields are a few names and numbers; per-epoch logs go in their own file)")


def _nesting(value: object) -> int:
    """How many JSON objects and arrays ``value`` nests (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest
