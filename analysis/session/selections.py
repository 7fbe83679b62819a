"""Which neighbours a query selects in a layer, under each selection rule, on the same features (METHOD §2–3).

For a layer and an image, the rules act on the features the layer itself scores
(:func:`analysis.session.traces.layer_query_key`, computed once per (model, image, layer)):

* ``"window"``: the R×R window around the query (zero-padded, raster order): a convolution;
* ``"all"``: the top K by feature similarity over every token: attention-style selection;
* ``"random"``: the top K among r candidates (plus the query), drawn as the layer draws in eval mode: from the
  image's key and the seed (by default the layer's own, so the rule reproduces a random layer exactly;
  :mod:`convnn.candidates`);
* ``"blend"``: the top K of ``(1 − α)·spatial + α·feature`` (:func:`convnn.selection.select_blend`); α = 0 is the
  window rule and α = 1 the all rule exactly (:func:`convnn.selection.effective_selection`);
* ``"layer"``: what the layer really selected in the forward pass (:func:`convnn.record_neighbors`); a conv-only
  hybrid or a plain convolution uses its kernel's window (with its stride and padding), and MHSA (which selects
  nothing) is shown by its K largest attention weights.

Selections are computed for every query of the layer at once and cached per (model, image, layer, rule) and the
resolved options that rule reads (α only for blend, the seed only for random), so each further click, and each knob
another rule ignores, is a lookup. Cells are ``(row, col)`` of the layer's grid; window and blend keys may be
padding cells outside the grid (e.g. row −1); a ViT's CLS token has no cell and is flagged by ``is_prefix``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from convnn.adapters import conv_window
from convnn.candidates import keyed_candidates
from convnn.functional import padded_to_cells, window_size_for
from convnn.selection import (
    SelectionOptions,
    effective_selection,
    neighbor_similarity,
    rule_names,
    selection_rule,
)
from convnn.validation import number_range

from .caching import bounded_cache
from .image_decode import InputImage
from .inputs import KNOB_NAMES, MAX_SEED, whole_number
from .models import LoadedModel
from .renamed import renamed_keywords
from .traces import LayerInfo, effective_draw, layer_module, layer_query_key, trace_image

__all__ = [
    "LAYER_RULE",
    "RuleOptions",
    "Selection",
    "distance_stats",
    "jaccard",
    "max_window_size",
    "resolve_options",
    "rule_selection",
    "rule_title",
]

LAYER_RULE = "layer"  # what the layer itself selected (beside the registered rules of convnn.selection)
LAYER_RULE_TITLE = "what the layer used"
DEFAULT_NUM_NEIGHBORS = 9  # K for layers that have none of their own (MHSA, conv-only hybrids)
DEFAULT_NUM_CANDIDATES = 32  # r of the random rule, the paper's ResNet setting (METHOD §6)
_SELECTION_CACHE_SIZE = 128  # selections kept (a K = 9 selection of a 32×32 map is 0.2 MB, a K = 1024 one 21 MB)
_QUERY_KEY_CACHE_SIZE = 32  # (model, image, layer) q, k features kept; each ≤ 2 × N × C floats (≈0.5 MB on CIFAR)


@dataclass(frozen=True)
class RuleOptions:
    """Knobs of the selection rules; ``None`` means "the layer's own value" (see :func:`resolve_options`).

    Attributes:
        num_neighbors (int, optional): K.
        window_size (int, optional): R, odd; also the window of the "inside the R×R window" share.
        num_candidates (int, optional): r of the random rule.
        seed (int, optional): seed of the random candidates; None: the layer's own (0 for a layer without one).
            Default: None
        blend_alpha (float): α of the blend rule, 0 = window, 1 = feature similarity. Default: 0.5
        head (int): attention head whose q, k are used (0 for maps). Default: 0
    """

    num_neighbors: int | None = None
    window_size: int | None = None
    num_candidates: int | None = None
    seed: int | None = None
    blend_alpha: float = 0.5
    head: int = 0

    @classmethod
    def from_ui(cls, k: float, window: float, candidates: float, seed: float | None, alpha: float, head: float
                ) -> RuleOptions:
        """Options from the app's number boxes, where 0 (or an empty box) means "the layer's own" for K, R, r and the
        seed.

        Raises:
            ValueError: K not a whole finite number (``inf``, ``NaN``, ``2.7``), R or r not one ≥ 0 (``−1`` too); the
                message names the field. The other fields, and the ranges that depend on the layer (K's, from 1 to
                the layer's H·W: a negative K is named with it), are checked by :func:`resolve_options`.
        """
        k = 0 if k is None else whole_number(k, KNOB_NAMES["num_neighbors"])
        window, candidates = (0 if v is None else whole_number(v, name, minimum=0) for v, name in (
            (window, KNOB_NAMES["window_size"]), (candidates, KNOB_NAMES["num_candidates"])))
        return cls(k or None, window or None, candidates or None, seed or None, alpha, head)


@renamed_keywords(probe="layer_info")
def max_window_size(layer_info: LayerInfo) -> int:
    """The largest window side R the rules accept on ``layer_info``: the smallest odd side ≥ the grid's longer side (a
    window as large as the grid, enough for K = H·W), or the layer's own R if that is larger.

    A larger window would only add padding cells, while the blend rule scores H·W × (H + R − 1)·(W + R − 1) pairs.
    """
    return max(layer_info.window_size, max(layer_info.height, layer_info.width) | 1)


@renamed_keywords(probe="layer_info")
def resolve_options(layer_info: LayerInfo, options: RuleOptions) -> RuleOptions:
    """Fill ``None`` fields from the layer and check every value against the layer's grid.

    K defaults to the layer's K (else 9, or H·W on a smaller grid); R to the layer's R (made odd) when R² ≥ K, else
    the smallest odd R with R² ≥ K; r to the layer's r (else 32), raised to K; the seed to the layer's (else 0). As in
    the layers (METHOD §3), r ≥ N (every token) makes the random rule the "all" rule, so r is capped at N
    (:attr:`QueryNeighbors.random_uses_all_tokens`). Whole floats (``9.0``) are accepted for the integer fields and
    returned as ``int``.

    Returns:
        RuleOptions: every field set, K, R, r, seed and head as ``int`` and α as ``float``.

    Raises:
        ValueError: a field that is not a whole number (K, R, r, seed, head) or not a finite real (α); K outside
            [1, H·W], an even R, R² < K or R > :func:`max_window_size`, r < K, α outside [0, 1], a seed outside
            [0, 2⁶⁴ − 1] or a head out of range; the message names the value and the allowed range.
    """
    grid = layer_info.height * layer_info.width
    k = options.num_neighbors if options.num_neighbors is not None else layer_info.num_neighbors or min(
        DEFAULT_NUM_NEIGHBORS, grid)
    k = whole_number(k, KNOB_NAMES["num_neighbors"])
    if not 1 <= k <= grid:
        raise ValueError(f"{KNOB_NAMES['num_neighbors']} must be {number_range(1, grid)} for the "
                         f"{layer_info.height}×{layer_info.width} grid of {layer_info.name}, got {k}")
    window = options.window_size
    if window is None:
        window = layer_info.window_size | 1  # an even kernel (a patch embedding's) → the next odd side
        window = window if window**2 >= k else window_size_for(k)
    window, largest = whole_number(window, KNOB_NAMES["window_size"]), max_window_size(layer_info)
    if window < 1 or window % 2 == 0 or window**2 < k or window > largest:
        raise ValueError(f"{KNOB_NAMES['window_size']} must be odd with R² ≥ K = {k} and at most {largest} (as wide "
                         f"as the {layer_info.height}×{layer_info.width} grid of {layer_info.name}), got R = {window}")
    candidates = options.num_candidates
    if candidates is None:
        candidates = max(layer_info.num_candidates or DEFAULT_NUM_CANDIDATES, k)
    candidates = whole_number(candidates, KNOB_NAMES["num_candidates"])
    if candidates < k:
        raise ValueError(f"{KNOB_NAMES['num_candidates']} must be at least K = {k} (r ≥ N = {layer_info.num_tokens} "
                         f"uses every token of {layer_info.name}, as the all rule), got {candidates}")
    alpha = options.blend_alpha
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"{KNOB_NAMES['blend_alpha']} must be {number_range(0, 1)}, got {alpha!r}")
    seed = whole_number(layer_info.seed or 0 if options.seed is None else options.seed, "seed", 0, MAX_SEED)
    return RuleOptions(k, window, min(candidates, layer_info.num_tokens), seed, float(alpha),
                       layer_info.check_head(options.head, KNOB_NAMES["head"]))


@dataclass(frozen=True, eq=False)
class Selection:
    """Every query's neighbours in one layer under one rule.

    Attributes:
        cells (np.ndarray): (H·W, K, 2) int64 ``(row, col)`` per query (raster order) and rank; padding cells lie
            outside the grid; prefix tokens hold (−1, −1).
        is_prefix (np.ndarray): (H·W, K) bool, True where the neighbour is a prefix token (CLS).
        scores (np.ndarray): (H·W, K) float32 feature similarity of the query to each neighbour (the layer's
            similarity; 0 for a zero padding token under cosine).
        candidates (np.ndarray or None): (r, 2) int64 cells of the random rule's candidates (shared by all queries).
        candidate_is_prefix (np.ndarray or None): (r,) bool.
    """

    cells: np.ndarray
    is_prefix: np.ndarray
    scores: np.ndarray
    candidates: np.ndarray | None = None
    candidate_is_prefix: np.ndarray | None = None


def _tokens_to_cells(tokens: Tensor, layer_info: LayerInfo) -> tuple[np.ndarray, np.ndarray]:
    """Token indices (prefix first, then the grid in raster order) → ``(cells, is_prefix)``, prefix cells (−1, −1)."""
    grid = tokens - layer_info.num_prefix_tokens
    is_prefix = grid < 0
    cells = padded_to_cells(grid, layer_info.width, 0)
    cells[is_prefix] = -1
    return cells.cpu().numpy(), is_prefix.cpu().numpy()


def _rule_selection(layer_info: LayerInfo, q: Tensor, k: Tensor, rule_name: str, options: RuleOptions,
                    keys: np.ndarray) -> Selection:
    """Every query's neighbours under the registered rule ``rule_name`` (:mod:`convnn.selection`) on single-head
    tokens (1, 1, N, D): a rule that needs a grid runs on the grid's tokens, any other on every token (the queries
    of the grid are kept); a rule that draws candidates draws them as the layers do in eval mode."""
    rule = selection_rule(effective_selection(rule_name, options.blend_alpha))
    prefix, grid, num_tokens = layer_info.num_prefix_tokens, (layer_info.height, layer_info.width), q.shape[2]
    select = SelectionOptions(options.num_neighbors, layer_info.similarity, options.window_size, options.blend_alpha,
                              self_first=not layer_info.is_attention)
    if rule.needs_grid:
        q, k = q[:, :, prefix:], k[:, :, prefix:]
        neighbors = rule.select(q, k, grid, select)
        idx = neighbors.topk_idx[0, 0]
        scores = neighbor_similarity(q, k, idx[None, None], layer_info.similarity, grid, neighbors.padding)
        cells = padded_to_cells(idx, layer_info.width, neighbors.padding).cpu().numpy()
        return Selection(cells, np.zeros(cells.shape[:2], dtype=bool), scores[0, 0].cpu().numpy())
    candidates = candidate_cells = candidate_is_prefix = None
    if "num_candidates" in rule.reads and options.num_candidates < num_tokens:  # r ≥ N: every token (METHOD §3)
        candidates = keyed_candidates(keys, options.seed, num_tokens, options.num_candidates)
        candidate_cells, candidate_is_prefix = _tokens_to_cells(candidates[0], layer_info)
    neighbors = rule.select(q, k, grid, replace(select, candidates=candidates))
    idx = neighbors.topk_idx[0, 0, prefix:]  # the grid's queries
    scores = neighbor_similarity(q[:, :, prefix:], k, idx[None, None], layer_info.similarity)
    cells, is_prefix = _tokens_to_cells(idx, layer_info)
    return Selection(cells, is_prefix, scores[0, 0].cpu().numpy(), candidate_cells, candidate_is_prefix)


def _recorded(layer_info: LayerInfo, record, q: Tensor, k: Tensor, head: int) -> Selection:
    """What the layer selected in the forward pass (:func:`convnn.record_neighbors`), with feature similarities; a
    map layer's cell shows its output's selection (:meth:`~convnn.introspect.LayerInfo.cell_outputs`), whose
    scores are the cell's own similarities to those neighbours."""
    idx = record.topk_idx[0, head]  # (Nq, K), Nq = tokens of the layer
    if layer_info.is_attention:
        idx = idx[layer_info.num_prefix_tokens:]
        cells, is_prefix = _tokens_to_cells(idx, layer_info)
        scores = neighbor_similarity(q[:, :, layer_info.num_prefix_tokens:], k, idx[None, None], layer_info.similarity)
    else:  # each cell shows the selection of its output (a strided layer's queries are some of its cells)
        idx = idx[layer_info.cell_outputs().to(idx.device)]
        cells = padded_to_cells(idx, record.width, record.padding).cpu().numpy()
        is_prefix = np.zeros(cells.shape[:2], dtype=bool)
        scores = neighbor_similarity(q, k, idx[None, None], layer_info.similarity,
                                     (layer_info.height, layer_info.width), record.padding)
    return Selection(cells, is_prefix, scores[0, 0].cpu().numpy())


def _conv_selection(layer_info: LayerInfo, q: Tensor, k: Tensor) -> Selection:
    """A convolution's window at every query cell (:func:`convnn.adapters.conv_window`: its stride, dilation and
    padding), taps in raster order, with their feature similarities."""
    padding = layer_info.padding
    cells = conv_window(layer_info.height, layer_info.width, layer_info.window_size, layer_info.stride,
                        layer_info.dilation, padding, q.device)
    idx = (cells[..., 0] + padding) * (layer_info.width + 2 * padding) + cells[..., 1] + padding
    scores = neighbor_similarity(q, k, idx[None, None], layer_info.similarity, (layer_info.height, layer_info.width),
                                 padding)
    return Selection(cells.cpu().numpy(), np.zeros(cells.shape[:2], dtype=bool), scores[0, 0].cpu().numpy())


@bounded_cache(_QUERY_KEY_CACHE_SIZE)
def _query_key(loaded: LoadedModel, image: InputImage, layer: str, draw: int) -> tuple[Tensor, Tensor]:
    """The layer's q, k tokens of every head, (1, h, N, D) each: one projection per (model, image, layer, draw)."""
    layer_info = loaded.layer_info(layer)
    inputs = trace_image(loaded, image, draw).inputs[layer_info.name]
    return layer_query_key(layer_module(loaded.model, layer_info), layer_info, inputs)


def _options_read(layer_info: LayerInfo, rule: str, options: RuleOptions) -> RuleOptions:
    """Resolved ``options`` with only the fields ``rule`` reads on ``layer_info`` kept, the others at their defaults.

    The cache key of :func:`_selection`, so that a knob a rule ignores (α for every rule but blend, the seed once
    r ≥ N, K for a layer's own recorded selection) never recomputes it.
    """
    if rule == LAYER_RULE:  # the layer's own K and R; only MHSA (no K) shows the options' K largest weights
        fields = ("num_neighbors",) if layer_info.num_neighbors is None and not layer_info.conv_only else ()
    else:
        fields = selection_rule(rule).reads
        if "num_candidates" in fields and options.num_candidates >= layer_info.num_tokens:  # every token: no draw
            fields = tuple(name for name in fields if name != "seed")
    return RuleOptions(head=options.head, **{name: getattr(options, name) for name in fields})


def rule_selection(loaded: LoadedModel, image: InputImage, layer: str, rule: str, options: RuleOptions,
                   draw: int = 0) -> Selection:
    """Every query's neighbours in ``layer`` under ``rule`` (cached on the resolved options the rule reads).

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        layer (str): layer name.
        rule (str): a registered rule (:func:`convnn.selection.rule_names`), or ``"layer"`` for what the layer really
            selected (its own K, and for
            attention the options' head).
        options (RuleOptions): resolved or not (:func:`resolve_options` is applied).
        draw (int): the eval draw of a model with random candidates (METHOD §3b): the forward pass the layer's input
            and own selection come from, and the key the random rule draws with. Default: 0

    Returns:
        Selection: cells, prefix flags and scores for all H·W queries.

    Raises:
        ValueError: unknown layer or rule, options outside their ranges, or a ``draw`` that is not an integer ≥ 0.
    """
    layer_info = loaded.layer_info(layer)
    if rule not in (*rule_names(), LAYER_RULE):
        raise ValueError(f"rule must be one of {(*rule_names(), LAYER_RULE)}, got {rule!r}")
    read = _options_read(layer_info, rule, resolve_options(layer_info, options))
    return _selection(loaded, image, layer_info.name, rule, read, effective_draw(loaded, draw))


@bounded_cache(_SELECTION_CACHE_SIZE)
def _selection(loaded: LoadedModel, image: InputImage, layer: str, rule: str, options: RuleOptions, draw: int
               ) -> Selection:
    """:func:`rule_selection` for checked ``rule``, :func:`_options_read` ``options`` and an effective ``draw``."""
    layer_info = loaded.layer_info(layer)
    q, k = _query_key(loaded, image, layer, draw)
    q, k = q[:, options.head:options.head + 1], k[:, options.head:options.head + 1]  # (1, 1, N, D)
    trace = trace_image(loaded, image, draw)
    keys = trace.sample_keys
    with torch.no_grad():
        if rule != LAYER_RULE:
            return _rule_selection(layer_info, q, k, rule, options, keys)
        record = trace.records.get(layer_info.name)
        if record is not None:
            return _recorded(layer_info, record, q, k, options.head)
        if layer_info.conv_only:  # a convolution uses its whole kernel window
            return _conv_selection(layer_info, q, k)
        layer_k = layer_info.num_neighbors or options.num_neighbors  # MHSA: its K largest attention weights
        return _rule_selection(layer_info, q, k, "all", replace(options, num_neighbors=layer_k), keys)


def rule_title(rule: str) -> str:
    """How figures and exports name a rule: its registered title, or :data:`LAYER_RULE_TITLE` for ``"layer"``.

    Raises:
        ValueError: neither a registered rule nor ``"layer"``.
    """
    return LAYER_RULE_TITLE if rule == LAYER_RULE else selection_rule(rule).title


def distance_stats(cells: np.ndarray, is_prefix: np.ndarray, query_cells: np.ndarray, window_size: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Mean spatial distance to the query and share inside the query's R×R window, per query.

    Args:
        cells (np.ndarray): (Q, K, 2) neighbour cells.
        is_prefix (np.ndarray): (Q, K) bool; prefix tokens have no position: they are left out of the distance
            and count as outside the window.
        query_cells (np.ndarray): (Q, 2) the queries' cells.
        window_size (int): R.

    Returns:
        tuple[np.ndarray, np.ndarray]: mean Euclidean distance in cells over the K neighbours (rank 0, the query
        itself, counts as 0; NaN when all are prefix tokens), and the share in [0, 1] of the K inside the window
        (Chebyshev distance ≤ R // 2). Both (Q,) float64.
    """
    offsets = (cells - query_cells[:, None, :]).astype(np.float64)
    distance = np.where(is_prefix, np.nan, np.hypot(offsets[..., 0], offsets[..., 1]))
    inside = (np.abs(offsets).max(-1) <= window_size // 2) & ~is_prefix
    counted = (~is_prefix).sum(-1)
    mean = np.where(counted > 0, np.nansum(distance, -1) / np.maximum(counted, 1), np.nan)
    return mean, inside.mean(-1)


def jaccard(a: set, b: set) -> float:
    """``|a ∩ b| / |a ∪ b|`` in [0, 1]; 1.0 for two empty sets."""
    union = a | b
    return len(a & b) / len(union) if union else 1.0
