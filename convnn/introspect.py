"""What a model's ConvNN-family layers are, for any model built from this library's layers (a researcher's own too):
each layer describes itself (``describe()``: kind, λ and channel split, K, selection and its options, heads), and
:func:`convnn_layers` adds where it sits — the token grid it sees at a given input size, in forward order.

The layers described are the ones a selection acts on: each :class:`~convnn.HybridConvNN2d`, each
:class:`~convnn.ConvNN2d` that is not a hybrid's branch, and each attention layer
(:class:`~convnn.MultiheadSelfAttention` and its k-NN subclasses), whose tokens are ``[prefix tokens (a ViT's CLS),
then an H×W grid of patches in raster order]``. A model with none of these (a torchvision ResNet or ViT) is described
by its plain convolutions and attention layers instead (:mod:`convnn.adapters`, METHOD §8), those whose input has at
most :data:`convnn.budget.MAX_EXHAUSTIVE_TOKENS` tokens (the views score every pair of them).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import nn

from kernels import resolve_backend

from .adapters import describe_plain, layer_input, prefix_tokens
from .budget import MAX_EXHAUSTIVE_TOKENS
from .functional import WindowGeometry
from .layers import ConvNN2d, HybridConvNN2d, MultiheadSelfAttention
from .validation import number_range

__all__ = ["LayerInfo", "compute_path", "convnn_layers", "layer_facts", "model_family"]

DEFAULT_WINDOW = 3  # R of layers that have none of their own (attention)


@dataclass(frozen=True)
class LayerInfo:
    """One ConvNN-family layer of a model, as it describes itself, and the grid it sees.

    Attributes:
        name (str): qualified module name (``model.get_submodule(name)``).
        kind (str): ``"hybrid"``, ``"convnn2d"``, ``"attention"``, or ``"conv"`` for a plain ``nn.Conv2d``
            (:mod:`convnn.adapters`).
        mixer (str): for attention ``"mhsa"``, ``"kvt"`` or ``"convnn"``; for maps ``"convnn"``, or ``"conv"`` for a
            plain convolution or a hybrid whose ConvNN branch is empty (λ·C_out rounds to 0).
        height, width (int): the token grid (feature-map cells, or patches), H×W.
        num_prefix_tokens (int): tokens before the grid (1 for a ViT's CLS token, else 0).
        input_size (int): side of the model input in pixels at which the grid was found.
        record_name (str or None): the module whose selections :func:`convnn.record_neighbors` reports (a hybrid's
            ``<name>.knn``), None for layers that select nothing (MHSA, conv-only hybrid).
        num_neighbors (int or None): K (None for MHSA and conv-only hybrids).
        selection (str): the registered rule (:mod:`convnn.selection`); ``"dense"`` for MHSA, ``"conv"`` for a
            conv-only hybrid.
        similarity (str): the similarity its selection scores with (``"dot"`` for attention).
        window_size (int): R (a convolution's kernel size k; :data:`DEFAULT_WINDOW` for attention).
        num_candidates (int or None): r of random selection.
        num_heads (int): attention heads (1 for maps).
        branch_ratio (float or None): λ of a hybrid layer.
        seed (int or None): its candidate seed (:mod:`convnn.candidates`), None for layers that select nothing.
        blend_alpha (float or None): α of blend selection (None for other layers).
        stride, dilation (int): a map layer's stride s and dilation d (METHOD §3a; 1 for attention).
        padding (int or None): a map layer's zero padding p, cells (None for attention).
    """

    name: str
    kind: str
    mixer: str
    height: int
    width: int
    num_prefix_tokens: int
    input_size: int
    record_name: str | None
    num_neighbors: int | None
    selection: str
    similarity: str
    window_size: int = DEFAULT_WINDOW
    num_candidates: int | None = None
    num_heads: int = 1
    branch_ratio: float | None = None
    seed: int | None = None
    blend_alpha: float | None = None
    stride: int = 1
    dilation: int = 1
    padding: int | None = None

    @property
    def is_attention(self) -> bool:
        """A token mixer (its tokens are prefix + grid, its q, k per head), not a map layer."""
        return self.kind == "attention"

    @property
    def num_tokens(self) -> int:
        """Keys a feature selection can pick from: H·W plus the prefix tokens."""
        return self.height * self.width + self.num_prefix_tokens

    @property
    def is_hybrid(self) -> bool:
        """A hybrid branch layer (it has a λ mix)."""
        return self.kind == "hybrid"

    def check_head(self, head: int, name: str = "head") -> int:
        """``head`` as an ``int``, checked against the layer; ``name``: the head's, as the message names it (the
        explorer's: its control's label).

        Raises:
            ValueError: not a whole number (a whole float such as ``1.0`` is accepted), or outside
                [0, num_heads − 1] (maps have one "head", 0).
        """
        if isinstance(head, bool) or not isinstance(head, numbers.Real) or not (
                math.isfinite(float(head)) and float(head).is_integer()):
            raise ValueError(f"{name} must be a whole number, got {head!r}")
        head = int(head)
        if not 0 <= head < self.num_heads:
            raise ValueError(f"{name} must be {number_range(0, self.num_heads - 1)} for {self.name} ({self.num_heads} "
                             f"head{'s' if self.num_heads > 1 else ''}), got {head}")
        return head

    def cell_outputs(self) -> torch.Tensor:
        """(H·W,) int64: for each cell of the grid (raster order), the output (raster order of the layer's H_out×W_out
        output) a view shows it with: the output whose query is the last at or before the cell on each axis (METHOD
        §3a, :meth:`~convnn.functional.WindowGeometry.covering_query`); the cell's own when every cell is a query
        (stride 1, "same" padding; attention).

        Raises:
            ValueError: a window that does not fit the grid.
        """
        if self.is_attention or self.padding is None:
            return torch.arange(self.height * self.width)
        geometry = WindowGeometry(self.window_size, self.stride, self.padding, self.dilation)
        rows, cols = geometry.covering_query(self.height), geometry.covering_query(self.width)
        return (rows[:, None] * geometry.output_size(self.height, self.width)[1] + cols[None, :]).flatten()

    @property
    def conv_only(self) -> bool:
        """A plain convolution, or a hybrid without a ConvNN branch (λ·C_out rounds to 0): its neighbours are its
        convolution's window (:func:`convnn.adapters.conv_window`), and it has no rank-slot kernel."""
        return self.mixer == "conv"

    @property
    def dense(self) -> bool:
        """Plain multi-head self-attention: no K, no rank-slot kernel."""
        return self.mixer == "mhsa"


def _described(model: nn.Module) -> tuple[dict[str, dict], bool]:
    """The modules :func:`convnn_layers` describes, name → what each says it is: hybrids, standalone ConvNN2d,
    attention layers; for a model without any, its plain convolutions and attention layers (module docstring), and
    whether these are plain layers."""
    branches = {f"{name}.knn" for name, m in model.named_modules() if isinstance(m, HybridConvNN2d)}
    own = {name: m.describe(name) for name, m in model.named_modules()
           if isinstance(m, HybridConvNN2d | MultiheadSelfAttention)
           or (isinstance(m, ConvNN2d) and name not in branches)}
    if own:
        return own, False
    plain = {name: describe_plain(m) for name, m in model.named_modules()}
    return {name: facts for name, facts in plain.items() if facts is not None}, True


def layer_facts(model: nn.Module) -> tuple[dict, ...]:
    """What each ConvNN-family layer of ``model`` says it is (``describe()``), in module order, with its ``name``;
    no forward pass, so it works on a model built on the ``meta`` device (no grids: :func:`convnn_layers` has
    them)."""
    return tuple({"name": name, **facts} for name, facts in _described(model)[0].items())


def model_family(model: nn.Module) -> str:
    """The model's short architecture name: its ``family`` (``"ResNet"``, ``"ViT"``), else its class name."""
    return getattr(model, "family", type(model).__name__)


def convnn_layers(model: nn.Module, input_size: int, device: torch.device | None = None,
                  in_chans: int = 3) -> tuple[LayerInfo, ...]:
    """The ConvNN-family layers of ``model`` in forward order, each as it describes itself, with the grid it sees
    at an ``input_size``² input.

    Runs one forward pass on a zero image (no gradients) to see the order and each layer's input shape; a token
    layer's grid is the largest square that the tokens past the prefix fill (:func:`convnn.adapters.prefix_tokens`:
    one CLS token if the model has a ``cls_token`` or ``class_token``). A plain layer (a model without ConvNN layers)
    whose input has more than :data:`convnn.budget.MAX_EXHAUSTIVE_TOKENS` tokens, or tokens that are not the prefix
    and a square grid, is left out. A module called twice is one layer (its first call).

    Args:
        model (nn.Module): any model built from ConvNN layers.
        input_size (int): side of the model input in pixels.
        device (torch.device, optional): the model's device. Default: CPU
        in_chans (int): input channels. Default: 3

    Returns:
        tuple[LayerInfo, ...]: one per layer, in the order the forward pass calls them.
    """
    found: list[LayerInfo] = []
    seen: set[str] = set()
    prefix = prefix_tokens(model)
    described, plain = _described(model)

    def hook(name: str):
        def capture(module: nn.Module, args: tuple, kwargs: dict) -> None:
            x = layer_input(module, args, kwargs)
            if name in seen:  # a module called twice is one layer, as its first call saw it
                return
            seen.add(name)
            if x.dim() == 4:
                grid, tokens_prefix = (x.shape[2], x.shape[3]), 0
            else:
                side = math.isqrt(max(x.shape[1] - prefix, 0))
                grid, tokens_prefix = (side, side), prefix
            cells = grid[0] * grid[1]
            # A plain layer is left out when the views could not place its tokens (not the prefix and a square
            # grid) or would score too many of them.
            if plain and (cells == 0 or cells + tokens_prefix != (x.shape[1] if x.dim() == 3 else cells)
                          or cells + tokens_prefix > MAX_EXHAUSTIVE_TOKENS):
                return
            found.append(LayerInfo(name=name, height=grid[0], width=grid[1], num_prefix_tokens=tokens_prefix,
                                   input_size=input_size, **described[name]))
        return capture

    handles = [model.get_submodule(name).register_forward_pre_hook(hook(name), with_kwargs=True)
               for name in described]
    try:
        with torch.no_grad():
            model(torch.zeros(1, in_chans, input_size, input_size, device=device))
    finally:
        for handle in handles:
            handle.remove()
    return tuple(found)


def compute_path(device: str | torch.device) -> str:
    """Which path ConvNN aggregations with ``backend="auto"`` take on ``device`` (:func:`kernels.resolve_backend`).

    Returns:
        str: e.g. ``"fused Triton kernel on cuda:0"`` or ``"PyTorch reference on cpu"``.
    """
    device = torch.device(device)
    name = "fused Triton kernel" if resolve_backend("auto", device) == "triton" else "PyTorch reference"
    return f"{name} on {device}"
