"""The input-level view: ConvNN selection on raw pixels, no trained model needed.

Each pixel of the (downsampled) upload is a token whose features are its RGB colour in [0, 1], optionally with its
position (:func:`convnn.functional.coordinate_channels`, scaled by ``position_weight``). For a clicked pixel:

* "pixels like this one": the top K by feature similarity over all pixels (negative squared Euclidean distance,
  the query first), i.e. attention-style selection;
* "pixels near this one": the K nearest offsets in the R×R window (R the smallest odd side with R² ≥ K), i.e. a
  convolution's receptive field.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from convnn.functional import coordinate_channels, padded_to_cells, to_tokens, window_indices, window_size_for
from convnn.selection import top_keys

from ..session.caching import bounded_cache
from ..session.image_decode import InputImage
from ..session.inputs import real_number, whole_number
from ..session.selections import distance_stats, jaccard

__all__ = ["MAX_POSITION_WEIGHT", "PIXEL_VIEW_SIDE_PX", "PixelNeighbors", "pixel_neighbors", "pixel_view"]

PIXEL_VIEW_SIDE_PX = 192  # the upload is downsampled to at most this side for the input-level view
_MAX_NEIGHBORS = 4096
MAX_POSITION_WEIGHT = 100.0  # position channels up to 100× the colour range; larger only overflows the scores


@bounded_cache(16)
def pixel_view(image: InputImage, max_side: int = PIXEL_VIEW_SIDE_PX) -> np.ndarray:
    """The upload downsampled (Lanczos) to at most ``max_side`` a side, aspect kept: (h, w, 3) uint8."""
    pil = image.pil
    pil.thumbnail((max_side, max_side))
    return np.asarray(pil, dtype=np.uint8)


@dataclass(frozen=True)
class PixelNeighbors:
    """A clicked pixel's feature and spatial neighbours in the input-level view.

    Attributes:
        like (np.ndarray): (h, w) bool, the K most similar pixels.
        near (np.ndarray): (h, w) bool, the K pixels of the window.
        like_distance (float): mean distance of ``like`` to the query, pixels.
        near_distance (float): mean distance of ``near`` to the query, pixels.
        overlap (float): Jaccard overlap of the two sets.
        window_size (int): R.
    """

    like: np.ndarray
    near: np.ndarray
    like_distance: float
    near_distance: float
    overlap: float
    window_size: int


def pixel_neighbors(image: InputImage, query_px: tuple[int, int], num_neighbors: int = 64,
                    position_weight: float = 0.0, max_side: int = PIXEL_VIEW_SIDE_PX) -> PixelNeighbors:
    """Feature vs spatial neighbours of the pixel ``query_px`` of :func:`pixel_view`.

    Args:
        image (InputImage): the upload.
        query_px (tuple[int, int]): ``(row_px, col_px)`` in the downsampled view.
        num_neighbors (int): K, in [1, 4096]; above the view's h·w pixels, all of them (a tiny image: the view's
            default K = 64 was refused on a 1×1 photo, the message naming no view). Default: 64
        position_weight (float): weight of the two position channels (each in [−1, 1]) next to RGB in [0, 1];
            0 = colour only, at most :data:`MAX_POSITION_WEIGHT`. Default: 0.0
        max_side (int): side of the view. Default: 192

    Raises:
        ValueError: a pixel outside the view, K not a whole number in range, or a ``position_weight`` that is not
            a finite number in [0, 100] (a bool, a string, a list are refused too).
    """
    view = pixel_view(image, max_side)
    height, width = view.shape[:2]
    row, col = query_px
    if not (0 <= row < height and 0 <= col < width):
        raise ValueError(f"pixel (row={row}, col={col}) is outside the {width}×{height} view")
    num_neighbors = min(whole_number(num_neighbors, "K", 1, _MAX_NEIGHBORS), height * width)
    position_weight = real_number(position_weight, "position_weight", 0, MAX_POSITION_WEIGHT)
    features = torch.from_numpy(view.copy()).permute(2, 0, 1).unsqueeze(0).float() / 255  # (1, 3, h, w)
    if position_weight:
        features = torch.cat([features, position_weight * coordinate_channels(height, width)], dim=1)
    tokens = to_tokens(features)  # (1, 1, N, C)
    index = row * width + col
    _, like_idx = top_keys(tokens[:, :, index:index + 1], tokens, num_neighbors, "euclidean", torch.tensor([index]))
    like_cells = padded_to_cells(like_idx[0, 0, 0], width, 0).numpy()
    size = window_size_for(num_neighbors)
    near_cells = padded_to_cells(window_indices(height, width, size, num_neighbors)[index], width, size // 2).numpy()
    near_cells = near_cells[(near_cells >= 0).all(1) & (near_cells[:, 0] < height) & (near_cells[:, 1] < width)]
    masks, distances = [], []
    for cells in (like_cells, near_cells):
        mask = np.zeros((height, width), dtype=bool)
        mask[cells[:, 0], cells[:, 1]] = True
        masks.append(mask)
        mean, _ = distance_stats(cells[None], np.zeros((1, len(cells)), bool), np.array([[row, col]]), size)
        distances.append(float(mean[0]))
    overlap = jaccard({tuple(c) for c in like_cells.tolist()}, {tuple(c) for c in near_cells.tolist()})
    return PixelNeighbors(masks[0], masks[1], distances[0], distances[1], overlap, size)
