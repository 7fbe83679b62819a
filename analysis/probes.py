"""Probe layers (the layers the explorer opens) and one recorded forward pass per (model, image).

A *probe layer* is a layer whose input is a grid of tokens a ConvNN selection can act on:

* each :class:`~convnn.HybridConvNN2d` and each standalone :class:`~convnn.ConvNN2d` (a (C, H, W) feature map);
* each ViT token mixer, :class:`~convnn.MultiheadSelfAttention` and its k-NN subclasses ``ConvNNAttention`` /
  ``KVTAttention`` (tokens ``[CLS, patch 0, …, patch H·W−1]`` over an H×W patch grid).

``run_trace`` runs the model once on an image with forward pre-hooks on the probe layers and the neighbour
recorder open, and keeps the logits, each probe layer's input and what each ConvNN layer selected. ``query_cell`` and
``cell_rect_px`` map between model-input pixels and a probe layer's cells.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from convnn import ConvNN2d, HybridConvNN2d, MultiheadSelfAttention, NeighborRecord, record_neighbors
from convnn.candidates import sample_keys
from convnn.functional import to_tokens
from convnn.layers import ConvNNAttention, KVTAttention

from .values import whole_number

__all__ = [
    "ProbeLayer",
    "Trace",
    "cell_rect_px",
    "find_probe_layers",
    "knn_branch",
    "layer_query_key",
    "probe_module",
    "query_cell",
    "run_trace",
]

DEFAULT_WINDOW = 3  # R of layers that have none of their own (attention, conv-only hybrids)


@dataclass(frozen=True)
class ProbeLayer:
    """One layer the explorer can open.

    Attributes:
        name (str): qualified module name (``model.get_submodule(name)``).
        kind (str): ``"hybrid"``, ``"convnn2d"`` or ``"attention"``.
        mixer (str): for attention ``"mhsa"``, ``"kvt"`` or ``"convnn"``; else ``"convnn"`` or ``"conv"`` (a hybrid
            whose ConvNN branch is empty, λ·C_out rounding to 0).
        height, width (int): the token grid (feature-map cells, or patches), H×W.
        num_prefix_tokens (int): tokens before the grid (1 for a ViT's CLS, else 0).
        input_size (int): side of the model input in pixels; a cell covers ``input_size / height`` pixels.
        record_name (str or None): key of this layer's selections in :func:`convnn.record_neighbors`, None when the
            layer selects nothing (MHSA, conv-only hybrid).
        num_neighbors (int or None): the layer's K (None for MHSA and conv-only hybrids).
        selection (str): the layer's rule: ``"all"``, ``"random"``, ``"window"``, ``"blend"``; ``"dense"`` for MHSA
            and ``"conv"`` for a conv-only hybrid.
        similarity (str): the similarity its selection uses (``"dot"`` for attention).
        window_size (int): the layer's R (:data:`DEFAULT_WINDOW` when it has none).
        num_candidates (int or None): the layer's r for random selection.
        num_heads (int): attention heads (1 for maps).
        branch_ratio (float or None): λ of a hybrid layer.
        seed (int or None): the seed of the layer's candidate draws (:mod:`convnn.candidates`), None for layers
            that draw none (MHSA, conv-only hybrid).
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

    @property
    def num_tokens(self) -> int:
        """Keys a feature selection can pick from: H·W plus the prefix tokens."""
        return self.height * self.width + self.num_prefix_tokens

    def check_head(self, head: int) -> int:
        """``head`` as an ``int`` (a whole float such as ``1.0`` is accepted), checked against the layer.

        Raises:
            ValueError: not a whole number, or outside [0, num_heads − 1] (maps have one "head", 0).
        """
        head = whole_number(head, "head")
        if not 0 <= head < self.num_heads:
            raise ValueError(f"head must be in [0, {self.num_heads - 1}] for {self.name} ({self.num_heads} "
                             f"head{'s' if self.num_heads > 1 else ''}), got {head}")
        return head

    @property
    def label(self) -> str:
        """Human label, e.g. ``"stages.0.0.conv1 · hybrid λ=0.5 · 32×32"``."""
        if self.kind == "attention":
            what = {"mhsa": "MHSA", "kvt": f"KVT K={self.num_neighbors}",
                    "convnn": f"ConvNN-attention K={self.num_neighbors}"}[self.mixer]
        elif self.kind == "hybrid":
            what = f"hybrid λ={self.branch_ratio}" + ("" if self.mixer == "conv" else f" K={self.num_neighbors}")
        else:
            what = f"ConvNN2d K={self.num_neighbors}"
        grid = f"{self.height}×{self.width}" + (" patches + CLS" if self.num_prefix_tokens else "")
        return f"{self.name} · {what} · {self.selection} · {grid}"


def _describe(name: str, module: nn.Module, grid: tuple[int, int], prefix: int, input_size: int) -> ProbeLayer:
    height, width = grid
    if isinstance(module, MultiheadSelfAttention):
        is_knn = isinstance(module, ConvNNAttention)
        mixer = "kvt" if isinstance(module, KVTAttention) else "convnn" if is_knn else "mhsa"
        return ProbeLayer(name, "attention", mixer, height, width, prefix, input_size, name if is_knn else None,
                          module.num_neighbors if is_knn else None, module.selection if is_knn else "dense", "dot",
                          num_candidates=module.num_candidates if is_knn else None, num_heads=module.num_heads,
                          seed=module.seed if is_knn else None)
    hybrid = isinstance(module, HybridConvNN2d)
    knn = module.knn if hybrid else module
    if knn is None:
        return ProbeLayer(name, "hybrid", "conv", height, width, 0, input_size, None, None, "conv", "cosine",
                          window_size=module.conv.kernel_size[0], branch_ratio=module.branch_ratio)
    return ProbeLayer(name, "hybrid" if hybrid else "convnn2d", "convnn", height, width, 0, input_size,
                      f"{name}.knn" if hybrid else name, knn.num_neighbors, knn.selection, knn.similarity,
                      knn.window_size, knn.num_candidates, branch_ratio=module.branch_ratio if hybrid else None,
                      seed=knn.seed)


def _is_probe(module: nn.Module, parent_is_hybrid: bool) -> bool:
    if isinstance(module, HybridConvNN2d | MultiheadSelfAttention):
        return True
    return isinstance(module, ConvNN2d) and not parent_is_hybrid


def find_probe_layers(model: nn.Module, input_size: int, device: torch.device | None = None
                      ) -> tuple[ProbeLayer, ...]:
    """The probe layers of ``model`` in forward order, with their grids at an ``input_size`` square input.

    Runs one forward pass on a zero image to see the order and the input shape of each probe layer.

    Args:
        model (nn.Module): any model built from ConvNN layers (eval mode is not required; nothing is trained).
        input_size (int): side of the model input in pixels.
        device (torch.device, optional): the model's device. Default: CPU

    Returns:
        tuple[ProbeLayer, ...]: one entry per probe layer, in the order the forward pass calls them.
    """
    hybrid_children = {f"{name}.knn" for name, m in model.named_modules() if isinstance(m, HybridConvNN2d)}
    modules = {name: m for name, m in model.named_modules() if _is_probe(m, name in hybrid_children)}
    found: list[ProbeLayer] = []

    def hook(name: str):
        def capture(module: nn.Module, args: tuple) -> None:
            x = args[0]
            if x.dim() == 4:
                found.append(_describe(name, module, (x.shape[2], x.shape[3]), 0, input_size))
            else:
                prefix = 1 if hasattr(model, "cls_token") else 0
                side = math.isqrt(x.shape[1] - prefix)
                found.append(_describe(name, module, (side, (x.shape[1] - prefix) // side), prefix, input_size))
        return capture

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in modules.items()]
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, input_size, input_size, device=device))
    finally:
        for handle in handles:
            handle.remove()
    return tuple(found)


def probe_module(model: nn.Module, probe: ProbeLayer) -> nn.Module:
    """The module of ``probe`` in ``model``."""
    return model.get_submodule(probe.name)


def query_cell(probe: ProbeLayer, row_px: int, col_px: int) -> tuple[int, int]:
    """Model-input pixel → the ``(row, col)`` cell of the layer's grid that covers it.

    Raises:
        ValueError: the pixel lies outside the ``input_size`` square.
    """
    size = probe.input_size
    if not (0 <= row_px < size and 0 <= col_px < size):
        raise ValueError(f"query pixel (row={row_px}, col={col_px}) is outside the {size}×{size} model input")
    return row_px * probe.height // size, col_px * probe.width // size


def cell_rect_px(probe: ProbeLayer, row: int, col: int) -> tuple[int, int, int, int]:
    """The pixels a cell covers in the model input: ``(top, left, bottom, right)``, bottom/right exclusive.

    Cells outside the grid (padding) map to the same-size square outside the image. A 16×16 layer on a 32×32
    input maps cell (r, c) to rows [2r, 2r + 2) and columns [2c, 2c + 2).
    """
    size = probe.input_size
    return (math.floor(row * size / probe.height), math.floor(col * size / probe.width),
            math.floor((row + 1) * size / probe.height), math.floor((col + 1) * size / probe.width))


def knn_branch(module: nn.Module, probe: ProbeLayer) -> ConvNN2d | None:
    """The ConvNN2d that selects in a map probe layer: a hybrid's ConvNN branch, or the standalone layer itself.

    None for a conv-only hybrid (λ·C_out rounds to 0 channels).
    """
    return module.knn if probe.kind == "hybrid" else module


@dataclass(frozen=True, eq=False)
class Trace:
    """One forward pass of a model on one image (hashed by identity).

    Attributes:
        logits (Tensor): (num_classes,) float32.
        inputs (dict[str, Tensor]): probe name → its input, (1, C, H, W) for maps, (1, N, dim) for tokens.
        records (dict[str, NeighborRecord]): probe name → what the layer selected (absent for layers that select
            nothing).
        sample_keys (np.ndarray): (1,) uint64 key of the model input, from which the model's random layers drew
            their candidates in eval mode (:mod:`convnn.candidates`).
    """

    logits: Tensor
    inputs: dict[str, Tensor]
    records: dict[str, NeighborRecord]
    sample_keys: np.ndarray


def run_trace(model: nn.Module, probes: tuple[ProbeLayer, ...], x: Tensor) -> Trace:
    """Run ``model`` on ``x`` once, capturing each probe layer's input and what each ConvNN layer selected.

    Uncached; :func:`analysis.tracing.trace_image` caches it per (model, image).

    Args:
        model (nn.Module): the model, eval mode.
        probes (tuple[ProbeLayer, ...]): its probe layers (:func:`find_probe_layers`).
        x (Tensor): (1, 3, S, S) float32 model input on the model's device.

    Returns:
        Trace: logits, probe inputs and recorded selections.
    """
    inputs: dict[str, Tensor] = {}

    def hook(name: str):
        def capture(module: nn.Module, args: tuple) -> None:
            inputs[name] = args[0].detach()
        return capture

    handles = [probe_module(model, p).register_forward_pre_hook(hook(p.name)) for p in probes]
    try:
        with torch.no_grad(), record_neighbors(model) as records:
            logits = model(x)[0].float()
    finally:
        for handle in handles:
            handle.remove()
    selected = {p.name: records[p.record_name][0] for p in probes if p.record_name and records.get(p.record_name)}
    return Trace(logits, inputs, selected, sample_keys(x))


def layer_query_key(module: nn.Module, probe: ProbeLayer, x: Tensor) -> tuple[Tensor, Tensor]:
    """The query and key features the layer's own selection scores, as tokens, every head at once.

    For a ConvNN branch: its input (+ coordinate channels) or its learned q/k projections; for a conv-only hybrid:
    the input itself; for attention: the q, k projections of every head.

    Args:
        module (nn.Module): the probe layer's module.
        probe (ProbeLayer): its description.
        x (Tensor): its captured input, (1, C, H, W) or (1, N, dim).

    Returns:
        tuple[Tensor, Tensor]: ``q`` and ``k``, each (1, h, N, D) float32, h = :attr:`ProbeLayer.num_heads` (1 for
        maps), N = :attr:`ProbeLayer.num_tokens` (prefix tokens first, then the grid in raster order).
    """
    with torch.no_grad():
        if probe.kind == "attention":
            q, k, _ = module.project_qkv(x)  # (B, h, N, d) each
            return q.float(), k.float()
        knn = knn_branch(module, probe)
        q_map, k_map = (x, x) if knn is None else knn.query_key_features(x)
        return to_tokens(q_map).float(), to_tokens(k_map).float()
