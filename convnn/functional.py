"""Candidate sets, spatial scores and masks for ConvNN on 2-D maps (METHOD §1–3). Stateless.

Index conventions: a map of H×W tokens is flattened in raster order, token ``i`` at ``(row, col) = divmod(i, W)``.
Window and blend selection work on the map zero-padded by ``p = window_size // 2`` on every side (METHOD §3, the
padded zero tokens are candidates exactly as in a zero-padded convolution); their key indices address the padded
grid of ``(H + 2p)·(W + 2p)`` tokens. :func:`padded_to_cells` maps them back to cells of the unpadded map.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "block_sparse_mask",
    "causal_mask",
    "coordinate_channels",
    "pad_map",
    "padded_to_cells",
    "sample_candidates",
    "to_tokens",
    "window_indices",
    "window_kernel",
    "window_size_for",
    "window_taps",
]

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
def _window_indices_cpu(height: int, width: int, window_size: int, num_neighbors: int) -> Tensor:
    pad = window_size // 2
    taps = torch.tensor(window_taps(window_size, num_neighbors))
    padded_width = width + 2 * pad
    rows = torch.arange(height).view(height, 1, 1) + pad
    cols = torch.arange(width).view(1, width, 1) + pad
    d_row = (taps // window_size - pad).view(1, 1, -1)
    d_col = (taps % window_size - pad).view(1, 1, -1)
    return ((rows + d_row) * padded_width + cols + d_col).reshape(height * width, num_neighbors)


def window_indices(height: int, width: int, window_size: int, num_neighbors: int, device=None) -> Tensor:
    """Spatial selection: each query's K nearest offsets in its R×R window, in raster order (METHOD §2–3).

    With K = R² this is the whole window, so Conv1D tap ``t`` is kernel position ``(t // R, t % R)``.

    Args:
        height (int): H of the unpadded map.
        width (int): W of the unpadded map.
        window_size (int): R, odd.
        num_neighbors (int): K, 1 ≤ K ≤ R².
        device (torch.device, optional): where to put the result.

    Returns:
        Tensor: (H·W, K) int64 indices into the padded grid ((H + 2p)·(W + 2p), p = R // 2).
    """
    return _window_indices_cpu(height, width, window_size, num_neighbors).to(device)


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
