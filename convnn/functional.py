"""Candidate sets, spatial scores and masks for ConvNN on 2-D maps (METHOD §1–3). Stateless.

Index conventions: a map of H×W tokens is flattened in raster order, token ``i`` at ``(row, col) = divmod(i, W)``.
Window and blend selection work on the map zero-padded by ``p`` cells on every side (``window_size // 2`` unless a
layer's :class:`WindowGeometry` says otherwise; METHOD §3, the padded zero tokens are candidates exactly as in a
zero-padded convolution); their key indices address the padded grid of ``(H + 2p)·(W + 2p)`` tokens.
:func:`padded_to_cells` maps them back to cells of the unpadded map.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .validation import check_choice, check_int

__all__ = [
    "PADDING_MODES",
    "WindowGeometry",
    "block_sparse_mask",
    "causal_mask",
    "coordinate_channels",
    "pad_map",
    "padded_to_cells",
    "sample_candidates",
    "to_tokens",
    "window_geometry",
    "window_indices",
    "window_kernel",
    "window_size_for",
    "window_taps",
]

PADDING_MODES = ("zeros",)  # a k-NN layer's padding cells are zero tokens (nn.Conv2d's other modes copy cells)


@dataclass(frozen=True)
class WindowGeometry:
    """Where a 2-D ConvNN layer's queries and windows sit on its H×W input map, in ``nn.Conv2d``'s terms (METHOD §3a).

    Per axis, output cell ``o`` reads the window of input cells ``s·o − p + d·t``, t = 0 … R − 1, exactly as a
    convolution with kernel R, stride s, zero padding p and dilation d; its **query** is the window's centre cell
    ``s·o − p + d·(R − 1)/2`` (R is odd). With s = 1 and p = d·(R − 1)/2 ("same", the default) every cell is a
    query of its own output, as before strides existed.

    Attributes:
        window_size (int): R, odd.
        stride (int): s ≥ 1. Default: 1
        padding (int): p ≥ 0, zero cells on every side. Default: 0
        dilation (int): d ≥ 1. Default: 1
    """

    window_size: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1

    @property
    def first_query(self) -> int:
        """The cell of output 0's query, per axis: ``d·(R − 1)/2 − p`` (negative: in the zero padding)."""
        return self.dilation * (self.window_size // 2) - self.padding

    @property
    def every_cell(self) -> bool:
        """Whether every cell of the map is the query of its own output (s = 1, p = d·(R − 1)/2)."""
        return self.stride == 1 and self.first_query == 0

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """(H_out, W_out) = ``(size + 2p − d·(R − 1) − 1) // s + 1`` per axis, as ``nn.Conv2d``.

        Raises:
            ValueError: the dilated window does not fit the padded map (no output).
        """
        reach = self.dilation * (self.window_size - 1)
        out = tuple((size + 2 * self.padding - reach - 1) // self.stride + 1 for size in (height, width))
        if min(out) < 1:
            raise ValueError(f"a {self.window_size}×{self.window_size} window (dilation {self.dilation}, padding "
                             f"{self.padding}) does not fit the {height}×{width} map: no output")
        return out

    def query_positions(self, size: int, device=None) -> Tensor:
        """(size_out,) int64 cells of the queries along one axis of a map ``size`` cells long (padding cells < 0 or
        ≥ size)."""
        count = self.output_size(size, size)[0]
        return torch.arange(count, device=device) * self.stride + self.first_query

    def query_indices(self, height: int, width: int, pad: int, device=None) -> Tensor:
        """(H_out·W_out,) int64 index of each query, raster order, among the tokens of the H×W map zero-padded by
        ``pad`` cells on every side.

        Raises:
            ValueError: a query outside that padded map (``pad`` smaller than the padding it lies in).
        """
        if self.first_query + pad < 0:  # the first query per axis (from the sizes alone: no tensor read to trace)
            raise ValueError(f"queries lie {-self.first_query} cells into the zero padding, outside the map padded "
                             f"by {pad}")
        rows, cols = self.query_positions(height, device) + pad, self.query_positions(width, device) + pad
        return (rows[:, None] * (width + 2 * pad) + cols[None, :]).reshape(-1)

    def covering_query(self, size: int, device=None) -> Tensor:
        """(size,) int64: for each cell along one axis, the output whose query is the last at or before it, clamped
        to ``[0, size_out)``: how a view shows each cell of a strided layer's map (METHOD §8)."""
        count = self.output_size(size, size)[0]
        cells = torch.arange(size, device=device) - self.first_query
        return torch.div(cells, self.stride, rounding_mode="floor").clamp(0, count - 1)


def _pair_value(name: str, value) -> int:
    """The common value of an ``nn.Conv2d`` size (an int, or a pair of equal ints)."""
    values = tuple(value) if isinstance(value, tuple | list) else (value,)
    if len(values) not in (1, 2) or len(set(values)) != 1:
        raise ValueError(f"{name} must be an integer or a pair of equal integers (ConvNN windows are square), "
                         f"got {value!r}")
    return values[0]


def window_geometry(kernel_size, stride=1, padding="same", dilation=1, padding_mode: str = "zeros"
                    ) -> WindowGeometry:
    """``nn.Conv2d``'s ``kernel_size``, ``stride``, ``padding``, ``dilation`` and ``padding_mode`` as the
    :class:`WindowGeometry` of a ConvNN layer (METHOD §3a).

    Args:
        kernel_size (int or tuple[int, int]): R, odd (the window's centre cell is its query); a pair must be equal.
        stride (int or tuple[int, int]): s ≥ 1. Default: 1
        padding (int, tuple[int, int] or str): p ≥ 0, ``"same"`` (p = d·(R − 1)/2, with any stride: the queries
            are the cells 0, s, 2s, …) or ``"valid"`` (p = 0). Default: ``"same"``
        dilation (int or tuple[int, int]): d ≥ 1. Default: 1
        padding_mode (str): ``"zeros"`` only. Default: ``"zeros"``

    Returns:
        WindowGeometry: with ``padding`` resolved to cells.

    Raises:
        ValueError: a value outside its range, an even kernel, a pair of different values, another padding mode or
            padding string; the message names the argument.
    """
    check_choice("padding_mode", padding_mode, PADDING_MODES)
    size, step, spread = (_pair_value(name, value) for name, value in
                          (("kernel_size", kernel_size), ("stride", stride), ("dilation", dilation)))
    check_int("kernel_size", size, 1)
    if size % 2 == 0:
        raise ValueError(f"kernel_size must be odd (a window's centre cell is its query), got {size}")
    check_int("stride", step, 1)
    check_int("dilation", spread, 1)
    if isinstance(padding, str):
        check_choice("padding", padding, ("same", "valid"))
        cells = spread * (size // 2) if padding == "same" else 0
    else:
        cells = _pair_value("padding", padding)
        check_int("padding", cells, 0)
    return WindowGeometry(size, step, cells, spread)


def to_tokens(x: Tensor) -> Tensor:
    """(B, C, H, W) feature map → (B, 1, N, C) single-head tokens, a view (no copy)."""
    return x.flatten(2).transpose(1, 2).unsqueeze(1)


def window_taps(window_size: int, num_neighbors: int) -> tuple[int, ...]:
    """The window rule's K taps as raster positions ``t = (dr + p)·R + (dc + p)`` of the R×R window, ascending.

    The K offsets nearest the centre (Euclidean distance, ties to raster order), then back in raster order
    (METHOD §2): rank slot ``k`` of the window rule is window position ``taps[k]``.
    """
    pad = window_size // 2
    distance = [(t // window_size - pad) ** 2 + (t % window_size - pad) ** 2 for t in range(window_size**2)]
    return tuple(sorted(sorted(range(window_size**2), key=lambda t: (distance[t], t))[:num_neighbors]))


@functools.lru_cache(maxsize=64)
def _window_indices_cpu(height: int, width: int, num_neighbors: int, geometry: WindowGeometry) -> Tensor:
    size, step, spread = geometry.window_size, geometry.stride, geometry.dilation
    taps = torch.tensor(window_taps(size, num_neighbors))
    out_h, out_w = geometry.output_size(height, width)
    padded_width = width + 2 * geometry.padding
    rows = (torch.arange(out_h) * step).view(out_h, 1, 1)  # window origins in the padded grid
    cols = (torch.arange(out_w) * step).view(1, out_w, 1)
    tap_rows = (taps // size * spread).view(1, 1, -1)
    tap_cols = (taps % size * spread).view(1, 1, -1)
    return ((rows + tap_rows) * padded_width + cols + tap_cols).reshape(out_h * out_w, num_neighbors)


def window_indices(height: int, width: int, window_size: int, num_neighbors: int, device=None,
                   geometry: WindowGeometry | None = None) -> Tensor:
    """Spatial selection: each query's K nearest offsets in its R×R window, in raster order (METHOD §2–3, §3a).

    With K = R² this is the whole window, so Conv1D tap ``t`` is kernel position ``(t // R, t % R)``. Output ``o``'s
    window is the input cells ``s·o − p + d·(t // R, t % R)`` (:class:`WindowGeometry`).

    Args:
        height (int): H of the unpadded map.
        width (int): W of the unpadded map.
        window_size (int): R, odd.
        num_neighbors (int): K, 1 ≤ K ≤ R².
        device (torch.device, optional): where to put the result.
        geometry (WindowGeometry, optional): stride, padding and dilation; its ``window_size`` must be R.
            Default: None (stride 1, padding R // 2, dilation 1: every cell a query)

    Returns:
        Tensor: (H_out·W_out, K) int64 indices into the padded grid ((H + 2p)·(W + 2p)), queries in raster order.

    Raises:
        ValueError: a geometry of another window size, or a window that does not fit the padded map.
    """
    geometry = geometry or WindowGeometry(window_size, padding=window_size // 2)
    if geometry.window_size != window_size:
        raise ValueError(f"geometry.window_size must be window_size = {window_size}, got {geometry.window_size}")
    if torch.compiler.is_compiling():  # traced as the integer ops it is (Dynamo does not trace a cache)
        return _window_indices_cpu.__wrapped__(height, width, num_neighbors, geometry).to(device)
    return _window_indices_cpu(height, width, num_neighbors, geometry).to(device)


def window_kernel(weight: Tensor, window_size: int) -> Tensor:
    """The window rule's Conv1D weight as the R×R ``Conv2d`` kernel it is (METHOD §4.1).

    With ρ = ``"none"`` the window rule (K ≤ R² taps, zero padding R // 2) computes ``F.conv2d(x, kernel,
    padding=R // 2, groups=groups)``: rank slot ``k`` weighs window position :func:`window_taps` ``[k]``, and the
    R² − K positions it leaves out weigh zero. Differentiable in ``weight``.

    Args:
        weight (Tensor): (C_out, C_in / groups, K) Conv1D weight, K ≤ R².
        window_size (int): R, odd.

    Returns:
        Tensor: (C_out, C_in / groups, R, R), ``weight``'s dtype and device.
    """
    c_out, c_group, num_neighbors = weight.shape
    taps = torch.tensor(window_taps(window_size, num_neighbors), device=weight.device)
    kernel = weight.new_zeros(c_out, c_group, window_size**2).index_copy(2, taps, weight)
    return kernel.view(c_out, c_group, window_size, window_size)


def window_size_for(num_neighbors: int) -> int:
    """The smallest odd window side R with R² ≥ K: the window that holds K spatial neighbours."""
    return 2 * math.ceil((math.sqrt(num_neighbors) - 1) / 2) + 1


def padded_to_cells(idx: Tensor, width: int, pad: int) -> Tensor:
    """Key indices in a grid padded by ``pad`` → ``(row, col)`` cells of the unpadded map.

    Args:
        idx (Tensor): (...,) int64 indices into the padded grid (``pad = 0``: the unpadded map itself).
        width (int): W of the unpadded map.
        pad (int): padding on each side.

    Returns:
        Tensor: (..., 2) int64 ``(row, col)``; padded cells lie outside ``[0, H) × [0, W)`` (e.g. row −1).
    """
    rows, cols = torch.div(idx, width + 2 * pad, rounding_mode="floor"), idx % (width + 2 * pad)
    return torch.stack([rows - pad, cols - pad], dim=-1)


def coordinate_channels(height: int, width: int, device=None, dtype=None) -> Tensor:
    """(1, 2, H, W) normalised (row, col) coordinates in [−1, 1] (0 for a side of length 1)."""
    rows = torch.linspace(-1, 1, height, device=device, dtype=dtype) if height > 1 else torch.zeros(
        1, device=device, dtype=dtype)
    cols = torch.linspace(-1, 1, width, device=device, dtype=dtype) if width > 1 else torch.zeros(
        1, device=device, dtype=dtype)
    grid = torch.stack(torch.meshgrid(rows, cols, indexing="ij"))  # (2, H, W)
    return grid.unsqueeze(0)


def sample_candidates(num_tokens: int, num_candidates: int, batch_size: int, generator: torch.Generator) -> Tensor:
    """Draw r candidate keys uniformly without replacement (METHOD §3, ``random``).

    Args:
        num_tokens (int): N.
        num_candidates (int): r, 1 ≤ r ≤ N.
        batch_size (int): 1 for one draw shared by the batch, B for one draw per sample.
        generator (torch.Generator): a CPU generator; the draw is reproducible from its state.

    Returns:
        Tensor: (batch_size, r) int64 key indices on the CPU, distinct within a row (the r smallest of N uniform
        draws). Pass them to :func:`kernels.knn_aggregate` as they are: it checks them on the CPU and copies them
        to the GPU without blocking (``kernels.reference.candidates_on``).
    """
    keys = torch.rand(batch_size, num_tokens, generator=generator)
    return keys.topk(num_candidates, dim=1, largest=False).indices  # ascending: argsort's first r, O(N)


def causal_mask(num_tokens: int, device=None) -> Tensor:
    """(N, N) bool, True where key j ≤ query i (METHOD §2: structured masks; SDPA's ``is_causal``)."""
    return torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=device).tril()


def block_sparse_mask(
    num_tokens: int, block_size: int, num_global_blocks: int = 1, num_random_blocks: int = 1,
    window_blocks: int = 1, generator: torch.Generator | None = None, device=None,
) -> Tensor:
    """BigBird-style block-sparse mask: local, global and random blocks (METHOD §2 and §4.5).

    Tokens are grouped into ``ceil(N / block_size)`` blocks. Query block ``a`` may attend key block ``b`` when
    ``|a − b| ≤ window_blocks`` (local), when either is one of the first ``num_global_blocks`` blocks (global), or
    when ``b`` is one of ``num_random_blocks`` blocks drawn for ``a`` from ``generator`` (random).

    Returns:
        Tensor: (N, N) bool, True = allowed.

    Raises:
        ValueError: ``block_size`` < 1 or a negative count.
    """
    if block_size < 1 or min(num_global_blocks, num_random_blocks, window_blocks) < 0:
        raise ValueError(f"block_size must be ≥ 1 and counts ≥ 0, got block_size={block_size}, "
                         f"global={num_global_blocks}, random={num_random_blocks}, window={window_blocks}")
    num_blocks = math.ceil(num_tokens / block_size)
    blocks = torch.arange(num_blocks)
    allowed = (blocks.view(-1, 1) - blocks.view(1, -1)).abs() <= window_blocks
    allowed[:num_global_blocks, :] = True
    allowed[:, :num_global_blocks] = True
    if num_random_blocks:
        draws = torch.rand(num_blocks, num_blocks, generator=generator).argsort(dim=1)[:, :num_random_blocks]
        allowed[blocks.view(-1, 1), draws] = True
    token_block = torch.arange(num_tokens) // block_size
    return allowed[token_block][:, token_block].to(device)


def pad_map(x: Tensor, pad: int) -> Tensor:
    """Zero-pad a (B, C, H, W) map by ``pad`` cells on every side."""
    return F.pad(x, (pad, pad, pad, pad))
