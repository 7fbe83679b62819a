"""Selection rules (METHOD §3): which K neighbours each query of a map keeps, one function per rule, and the one
registry of rules that the layers, the analysis views and the app read.

A rule is a function ``select(q, k, grid, options) -> Neighbors`` over a whole map, from plain tensors: ``q`` and
``k`` are the query and key features of the map's tokens, (B, h, N, D), and ``grid`` its (H, W) when the rule needs
one. Each rule is registered once with its title and the options it reads (:class:`SelectionRule`); registering a
new one (:func:`register_rule`) makes it a ``selection`` of :class:`~convnn.ConvNN2d` (and of
:class:`~convnn.ConvNNAttention` if it needs no grid), a rule of every analysis view and an entry of the app's rule
list. The four built-in rules:

* ``"window"``: the K nearest offsets in each query's R×R window of the zero-padded map, raster order — a
  convolution;
* ``"all"``: the top K of every token by feature similarity — attention-style;
* ``"random"``: the top K of r sampled candidates plus the query (the caller draws the candidates:
  :mod:`convnn.candidates`);
* ``"blend"``: the top K of ``(1 − α)·spatial + α·feature`` over the zero-padded map; α = 0 is ``"window"`` and
  α = 1 is ``"all"`` exactly (:func:`effective_selection`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from kernels.reference import (
    BlendGrid,
    neighbor_scores,
    padded_tokens,
    select_neighbors,
    select_topk,
    similarity_scores,
)

from .functional import WindowGeometry, window_indices

__all__ = [
    "SELECTION_RULES",
    "Neighbors",
    "SelectionOptions",
    "SelectionRule",
    "check_window_neighbors",
    "effective_selection",
    "neighbor_similarity",
    "register_rule",
    "rule_names",
    "select_all",
    "select_blend",
    "select_random",
    "select_window",
    "selection_rule",
    "top_keys",
]


@dataclass(frozen=True)
class SelectionOptions:
    """What a rule may read (each rule reads only the fields its registry entry names, plus ``similarity``).

    Attributes:
        num_neighbors (int): K.
        similarity (str): ``"cosine"``, ``"dot"`` or ``"euclidean"`` (:func:`kernels.reference.similarity_scores`).
            Default: ``"cosine"``
        window_size (int): R, odd. Default: 3
        blend_alpha (float): α ∈ [0, 1]. Default: 0.5
        candidates (Tensor, optional): (B or 1, r) int64 sampled keys for ``"random"``. Default: None
        self_first (bool): the query is rank 0 whatever its score (the 2-D layer). Default: True
        geometry (WindowGeometry, optional): where ``"window"``'s queries and windows sit on the map (a layer's
            stride, padding and dilation, METHOD §3a); its ``window_size`` is R. Default: None (every cell a query,
            padding R // 2)
    """

    num_neighbors: int
    similarity: str = "cosine"
    window_size: int = 3
    blend_alpha: float = 0.5
    candidates: Tensor | None = None
    self_first: bool = True
    geometry: WindowGeometry | None = None


@dataclass(frozen=True)
class Neighbors:
    """Every query's K neighbours under one rule.

    Attributes:
        topk_idx (Tensor): (B, h, N, K) int64 key indices, rank 0 first: into the map's tokens, or into the map
            zero-padded by ``padding`` cells on every side.
        topk_scores (Tensor): (B, h, N, K) the scores the weights ρ are computed from (feature similarity, or the
            blended score for ``"blend"``), differentiable w.r.t. q and k where grad is enabled.
        padding (int): zero padding of the key grid (0: the map's own tokens).
    """

    topk_idx: Tensor
    topk_scores: Tensor
    padding: int = 0


Select = Callable[[Tensor, Tensor, tuple[int, int] | None, SelectionOptions], Neighbors]


@dataclass(frozen=True)
class SelectionRule:
    """One registered selection rule.

    Attributes:
        name (str): what ``selection=`` and the analysis views call it.
        title (str): how figures and the app name it, e.g. ``"window (convolution)"``.
        select (Callable): ``select(q, k, grid, options) -> Neighbors`` (module docstring).
        reads (tuple[str, ...]): the options it reads, of ``num_neighbors``, ``window_size``, ``blend_alpha``,
            ``num_candidates`` (then the caller draws ``options.candidates``) and ``seed``.
        needs_grid (bool): it reads the tokens' (row, col) positions, so it runs on maps (not on a ViT's tokens).
        fused (bool): the layers run it through :func:`kernels.knn_aggregate`, which selects and aggregates in one
            fused kernel on CUDA (its reference path is ``select``).
        exhaustive (bool): it scores every query against every key (N² scores per map on the reference path): the
            token budgets of checkpoints and of the explorer apply to it.
        gathers (bool): with ρ = ``"none"`` every selected value counts once whatever its score: the rule is a
            convolution (``"window"``: its neighbours are chosen by position, not by score), and the layers run it
            as one (``F.conv2d`` with :func:`convnn.functional.window_kernel`).
        kernel_options (Callable, optional): for a fused rule, ``kernel_options(grid, options) -> (kwargs,
            padding)``: the extra keyword arguments of :func:`kernels.knn_aggregate` (``"blend"``: its map) and the
            padding of the key indices it returns. None: no extra arguments, unpadded indices.
    """

    name: str
    title: str
    select: Select
    reads: tuple[str, ...] = ("num_neighbors",)
    needs_grid: bool = False
    fused: bool = False
    exhaustive: bool = False
    gathers: bool = False
    kernel_options: Callable[[tuple[int, int], SelectionOptions], tuple[dict, int]] | None = None

    def fused_call(self, grid: tuple[int, int], options: SelectionOptions) -> tuple[dict, int]:
        """(extra :func:`kernels.knn_aggregate` arguments, padding of its indices) for this fused rule."""
        return ({}, 0) if self.kernel_options is None else self.kernel_options(grid, options)


SELECTION_RULES: dict[str, SelectionRule] = {}  # name → rule, in registration (display) order


def register_rule(rule: SelectionRule) -> SelectionRule:
    """Add ``rule`` to :data:`SELECTION_RULES`.

    Raises:
        ValueError: a rule of that name is registered already.
    """
    if rule.name in SELECTION_RULES:
        raise ValueError(f"selection rule {rule.name!r} is already registered")
    SELECTION_RULES[rule.name] = rule
    return rule


def rule_names(needs_grid: bool | None = None) -> tuple[str, ...]:
    """The registered rule names in order; ``needs_grid=False`` only those that run on tokens without a grid."""
    return tuple(name for name, rule in SELECTION_RULES.items() if needs_grid is None or rule.needs_grid == needs_grid)


def selection_rule(name: str) -> SelectionRule:
    """The rule called ``name``.

    Raises:
        ValueError: no such rule (the message lists the registered ones).
    """
    if name not in SELECTION_RULES:
        raise ValueError(f"selection must be one of {rule_names()}, got {name!r}")
    return SELECTION_RULES[name]


def effective_selection(selection: str, blend_alpha: float) -> str:
    """The rule a layer runs: ``"blend"`` at its ends is exactly the two operations (METHOD §3).

    α = 0 is the ``"window"`` rule (a convolution: the window's K cells in raster order, zero padding) and α = 1 the
    ``"all"`` rule (attention-style: every token of the unpadded map, the query first, ranked by feature score).
    The blended score itself only tends to them: near α = 0 it ranks the query's own cell first, near α = 1 it
    still scores the padding cells. Any other selection, or 0 < α < 1, is returned unchanged.
    """
    if selection == "blend" and blend_alpha in (0, 1):
        return "window" if blend_alpha == 0 else "all"
    return selection


def check_window_neighbors(selection: str, num_neighbors: int, window_size: int) -> None:
    """Raise ``ValueError`` when the ``"window"`` rule (also blend at α = 0) is asked for more than R² neighbours."""
    if selection == "window" and num_neighbors > window_size**2:
        raise ValueError(f"selection='window' (and 'blend' at blend_alpha=0) needs num_neighbors ≤ "
                         f"window_size**2 = {window_size**2}, got {num_neighbors}")


def neighbor_similarity(q: Tensor, k: Tensor, topk_idx: Tensor, similarity: str = "cosine",
                        grid: tuple[int, int] | None = None, padding: int = 0) -> Tensor:
    """The feature similarity of each query to each of its selected keys, without the (Nq, Nk) matrix.

    Args:
        q (Tensor): (B, h, Nq, D) queries.
        k (Tensor): (B, h, Nk, D) keys: the map's tokens (``grid`` = (H, W) when ``padding`` > 0).
        topk_idx (Tensor): (B, h, Nq, K) int64 key indices, into the keys zero-padded by ``padding`` if > 0
            (padding cells are zero vectors: they score 0 under cosine).
        similarity (str): as in :func:`kernels.reference.similarity_scores`. Default: ``"cosine"``

    Returns:
        Tensor: (B, h, Nq, K), what :func:`kernels.reference.similarity_scores` gives for those pairs.
    """
    keys = padded_tokens(k, grid, padding) if padding else k
    return neighbor_scores(q, keys, topk_idx, similarity)


def select_window(q: Tensor, k: Tensor, grid: tuple[int, int] | None, options: SelectionOptions) -> Neighbors:
    """``"window"``: the K offsets nearest each query in its R×R window, raster order, keys zero-padded by R // 2, or
    as ``options.geometry`` places queries and windows (stride, padding, dilation: METHOD §3a).

    The scores are the feature similarities of the query cells to their window cells (for ρ), computed for those
    pairs only; ``topk_idx`` is (B, h, H_out·W_out, K).
    """
    check_window_neighbors("window", options.num_neighbors, options.window_size)
    B, h = q.shape[:2]
    geometry = options.geometry or WindowGeometry(options.window_size, padding=options.window_size // 2)
    pad = geometry.padding
    idx = window_indices(*grid, options.window_size, options.num_neighbors, q.device, geometry)
    if not geometry.every_cell:  # the queries: the windows' centre cells, maybe zero padding cells
        q = padded_tokens(q, grid, pad)[:, :, geometry.query_indices(*grid, pad, q.device)]
    idx = idx.expand(B, h, -1, -1)
    return Neighbors(idx, neighbor_scores(q, padded_tokens(k, grid, pad), idx, options.similarity), pad)


def select_all(q: Tensor, k: Tensor, grid: tuple[int, int] | None, options: SelectionOptions) -> Neighbors:
    """``"all"``: the top K of every key by feature similarity (the query first with ``self_first``)."""
    scores, idx = select_neighbors(q, k, num_neighbors=options.num_neighbors, similarity=options.similarity,
                                   self_first=options.self_first)
    return Neighbors(idx, scores)


def top_keys(q: Tensor, k: Tensor, num_neighbors: int, similarity: str = "cosine",
             self_index: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The ``"all"`` rule for some queries only: each query's top K keys by feature similarity (ties to the lower
    index), without scoring the keys against each other.

    Args:
        q (Tensor): (..., Nq, D) the queries.
        k (Tensor): (..., Nk, D) every key.
        num_neighbors (int): K ≤ Nk.
        similarity (str): as in :func:`kernels.reference.similarity_scores`. Default: ``"cosine"``
        self_index (Tensor, optional): (Nq,) int64 key index of each query itself, ranked first. Default: None

    Returns:
        tuple[Tensor, Tensor]: ``topk_scores`` and ``topk_idx``, (..., Nq, K).
    """
    return select_topk(similarity_scores(q, k, similarity), num_neighbors, self_index)


def select_random(q: Tensor, k: Tensor, grid: tuple[int, int] | None, options: SelectionOptions) -> Neighbors:
    """``"random"``: the top K of the query and ``options.candidates`` (every key when there are none: r ≥ N)."""
    scores, idx = select_neighbors(q, k, num_neighbors=options.num_neighbors, similarity=options.similarity,
                                   candidates=options.candidates, self_first=options.self_first)
    return Neighbors(idx, scores)


def select_blend(q: Tensor, k: Tensor, grid: tuple[int, int] | None, options: SelectionOptions) -> Neighbors:
    """``"blend"``: the top K of the blended spatial/feature score over the zero-padded map, the query first; its
    ends are :func:`select_window` and :func:`select_all` (:func:`effective_selection`)."""
    end = effective_selection("blend", options.blend_alpha)
    if end != "blend":
        return SELECTION_RULES[end].select(q, k, grid, options)
    blend = _blend_grid(grid, options)
    topk_scores, topk_idx = select_neighbors(q, k, num_neighbors=options.num_neighbors,
                                             similarity=options.similarity, blend=blend)
    return Neighbors(topk_idx, topk_scores, blend.pad)


def _blend_grid(grid: tuple[int, int], options: SelectionOptions) -> BlendGrid:
    return BlendGrid(*grid, options.window_size, options.blend_alpha)


def _blend_kernel_options(grid: tuple[int, int], options: SelectionOptions) -> tuple[dict, int]:
    blend = _blend_grid(grid, options)
    return {"blend": blend}, blend.pad


for _rule in (
    SelectionRule("window", "window (convolution)", select_window, ("num_neighbors", "window_size"), needs_grid=True,
                  gathers=True),
    SelectionRule("all", "all tokens (attention)", select_all, fused=True, exhaustive=True),
    SelectionRule("random", "random candidates", select_random, ("num_neighbors", "num_candidates", "seed"),
                  fused=True),
    SelectionRule("blend", "blend (α)", select_blend, ("num_neighbors", "window_size", "blend_alpha"),
                  needs_grid=True, fused=True, exhaustive=True, kernel_options=_blend_kernel_options),
):
    register_rule(_rule)
del _rule
