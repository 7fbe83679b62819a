"""ConvNN k-nearest-neighbour aggregation in plain PyTorch: the specification, the CPU path and the test oracle.

For every query token ``i`` (METHOD §2):

1. **Similarity** ``S[i, j]`` against each candidate key ``j``: ``"cosine"`` (``q̂_i·k̂_j``), ``"dot"`` (scaled dot
   product ``q_i·k_j/√d``) or ``"euclidean"`` (``−‖q_i − k_j‖²``); a boolean ``attn_mask`` (``True`` = allowed, the
   convention of :func:`torch.nn.functional.scaled_dot_product_attention`) sets forbidden pairs to ``−∞``.
2. **Select** the top-K candidates, most similar first, ties broken by the lower key index (a stable sort, so the
   result is deterministic); optionally the query itself is forced to rank 0. **Modulate** with ``ρ``: ``"none"``
   (weights 1, a pure gather), ``"softmax"`` over the K selected scores divided by ``temperature``, or ``"uniform"``
   (1/K). Selected slots that were masked (score ``−∞``) get weight 0 under every ``ρ``.

**Non-finite scores** (one rule, the same in the fused kernel): a NaN score counts as ``−∞`` (it ranks after every
number, ties to the lower index, and weighs 0 under every ``ρ``, like a masked pair), and ``+∞`` counts as the
largest finite value of the score dtype. With ``self_first`` the query is rank 0 whatever its score; its weight
follows its score (0 if that is NaN; a NaN value still reaches its own output, as 0·NaN = NaN). Softmax is
``exp((s − s_max) / τ)`` normalised over the valid slots, so saturated scores give equal shares instead of NaN.
:func:`similarity_scores` applies the rule where scores are made.
3. **Aggregate**: gather ``V[idx] → (B, C, N·K)`` (token-major, each query's K neighbours contiguous, the t-th slot
   holding the t-th nearest neighbour) and apply ``F.conv1d(kernel_size=K, stride=K, groups=groups)``.

Indices carry no gradient; with ``ρ = "softmax"`` gradients reach the scores and through them ``q`` and ``k``.
Everything here materialises the (B, H, Nq, Nk) score matrix: that is what the fused kernel avoids.

Tensor layout (shared with the fused kernel): ``q`` (B, H, Nq, D), ``k`` (B, H, Nk, D), ``v`` (B, H, Nk, Dv), the
layout of ``scaled_dot_product_attention``; the output is channel-first (B, C_out, Nq) like ``F.conv1d``, with the
heads' value channels concatenated head-major (``C_in = H·Dv``). These functions assume valid arguments: the checked
entry point is :func:`kernels.knn_aggregate`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .usage import note_backend

__all__ = [
    "SIMILARITIES",
    "WEIGHTINGS",
    "BlendGrid",
    "KnnOptions",
    "KnnResult",
    "aggregate_neighbors",
    "blend_scores",
    "candidates_on",
    "canonical_scores",
    "knn_aggregate_reference",
    "neighbor_scores",
    "neighbor_weights",
    "padded_tokens",
    "query_positions_in_padded",
    "select_neighbors",
    "select_topk",
    "similarity_scores",
    "spatial_profile",
    "spatial_scores",
    "takes_options",
]

SIMILARITIES = ("cosine", "dot", "euclidean")
WEIGHTINGS = ("none", "softmax", "uniform")
Entry = TypeVar("Entry", bound=Callable)


class KnnResult(NamedTuple):
    """What one ConvNN aggregation computed.

    Attributes:
        out (Tensor): (B, C_out, Nq), the aggregated output, dtype of the inputs.
        topk_idx (Tensor): (B, H, Nq, K) int64 key indices of the selected neighbours, rank 0 first.
        topk_weights (Tensor): (B, H, Nq, K) the weights ρ applied to each selected value (fp32, or fp64 for fp64
            inputs); all ones for ``weighting="none"`` without masks.
    """

    out: Tensor
    topk_idx: Tensor
    topk_weights: Tensor


class BlendGrid(NamedTuple):
    """The map of the ``blend`` rule (METHOD §3; docs/method.md §3): the Nq = Nk = ``height·width`` tokens of one
    map, raster order. Each query's candidates are the cells of the map zero-padded by ``pad = window_size // 2``
    (padding cells have zero features and zero values), scored ``(1 − α)·spatial + α·feature~``
    (:func:`blend_scores`), the query itself forced to rank 0; indices count padded cells."""

    height: int
    width: int
    window_size: int
    alpha: float

    @property
    def pad(self) -> int:
        return self.window_size // 2

    @property
    def num_cells(self) -> int:
        """M = (H + 2p)·(W + 2p), the candidates of every query."""
        return (self.height + 2 * self.pad) * (self.width + 2 * self.pad)


class KnnOptions(NamedTuple):
    """The keyword options of a ConvNN aggregation, written once for its entries (:func:`kernels.knn_aggregate`,
    which documents each, :func:`knn_aggregate_reference`, :func:`kernels.knn_triton.knn_aggregate_triton`): each
    takes them as ``**options`` and binds them by calling this class, which supplies the defaults and raises
    ``TypeError`` for a missing ``num_neighbors`` or a name it does not know. ``attn_mask`` (no fused kernel) and
    ``backend`` (the dispatch's) are keywords of the entries that take them."""

    num_neighbors: int
    similarity: str = "cosine"
    weighting: str = "none"
    temperature: float = 1.0
    groups: int = 1
    self_first: bool = False
    candidates: Tensor | None = None
    blend: BlendGrid | None = None


def bind_options(entry: str, options: dict) -> KnnOptions:
    """``options`` (an entry's ``**options``) as :class:`KnnOptions`, defaults filled in.

    Raises:
        TypeError: an option missing (``num_neighbors``) or unknown, named with the entry ``entry`` as Python names
            a call's own keyword-only arguments.
    """
    try:
        return KnnOptions(**options)
    except TypeError as err:
        message = str(err).replace("KnnOptions.__new__()", f"{entry}()").replace("positional", "keyword-only")
        raise TypeError(message) from None


def takes_options(fn: Entry) -> Entry:
    """``fn(..., **options)`` with the signature :func:`inspect.signature` and ``help()`` show: the fields of
    :class:`KnnOptions` as keyword-only parameters in place of ``**options``, after ``fn``'s positional ones (their
    annotations as written, not the ``ForwardRef`` a NamedTuple makes of them)."""
    signature = inspect.signature(fn)
    own = signature.parameters.values()
    annotations = {name: getattr(hint, "__forward_arg__", hint) for name, hint in KnnOptions.__annotations__.items()}
    options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotations[name],
                                 default=KnnOptions._field_defaults.get(name, inspect.Parameter.empty))
               for name in KnnOptions._fields]
    positional = [p for p in own if p.kind is p.POSITIONAL_OR_KEYWORD]
    keywords = [p for p in own if p.kind is p.KEYWORD_ONLY]
    fn.__signature__ = signature.replace(parameters=[*positional, *options, *keywords])
    return fn


def spatial_profile(window_size: int, max_distance: int, device=None) -> Tensor:
    """``exp(−d² / (2h²))`` for Chebyshev distances d = 0 … ``max_distance`` cells, h = max(R // 2, 1): fp32,
    (max_distance + 1,). 1 at the query, ``e^{−1/2}`` on the R×R window's border: the window is exactly the R²
    highest-scoring cells, for every odd R. The one table both :func:`spatial_scores` and the fused kernel read."""
    half = max(window_size // 2, 1)
    d = torch.arange(max_distance + 1, device=device, dtype=torch.float32)
    return torch.exp(-d.square() / (2 * half**2))


def spatial_scores(height: int, width: int, window_size: int, device=None) -> Tensor:
    """Spatial similarity of every query of an H×W map to every cell of the map padded by p = R // 2.

    Returns:
        Tensor: (H·W, (H + 2p)·(W + 2p)) float32 in (0, 1]: :func:`spatial_profile` at the Chebyshev distance.
    """
    pad = window_size // 2
    q_rows = torch.arange(height, device=device).view(-1, 1, 1, 1)
    q_cols = torch.arange(width, device=device).view(1, -1, 1, 1)
    k_rows = torch.arange(-pad, height + pad, device=device).view(1, 1, -1, 1)
    k_cols = torch.arange(-pad, width + pad, device=device).view(1, 1, 1, -1)
    chebyshev = torch.maximum((q_rows - k_rows).abs(), (q_cols - k_cols).abs())  # (H, W, Hp, Wp)
    profile = spatial_profile(window_size, max(height, width) + pad, device)
    return profile[chebyshev].reshape(height * width, -1)


def blend_scores(feature_scores: Tensor, spatial: Tensor, blend_alpha: float) -> Tensor:
    """``(1 − α)·spatial + α·feature~`` with the feature scores min–max normalised to [0, 1] per query (METHOD §3).

    The normalisation spans the finite feature scores of each query; a −∞ score (a NaN one, by the rule of
    :func:`similarity_scores`) stays −∞, so it ranks last and weighs 0 for every α > 0.

    Args:
        feature_scores (Tensor): (B, H, Nq, M) feature similarities to the padded grid, as
            :func:`similarity_scores` returns them (no NaN, no +∞).
        spatial (Tensor): (Nq, M) output of :func:`spatial_scores`.
        blend_alpha (float): α ∈ (0, 1]; α = 0 is the window rule itself (``convnn.selection.effective_selection``).

    Returns:
        Tensor: (B, H, Nq, M) blended scores in [0, 1], or −∞.
    """
    # Canonical scores are finite or −∞: the highest finite score is the row maximum (−∞ for a row of −∞ only).
    low = feature_scores.masked_fill(feature_scores == -math.inf, math.inf).amin(-1, keepdim=True)
    high = feature_scores.amax(-1, keepdim=True)
    feature = (feature_scores - low) / (high - low).clamp_min(torch.finfo(feature_scores.dtype).tiny)
    return (1 - blend_alpha) * spatial.to(feature.dtype) + blend_alpha * feature


def query_positions_in_padded(height: int, width: int, pad: int, device=None) -> Tensor:
    """(H·W,) int64 index of each unpadded token in the grid padded by ``pad``."""
    rows = torch.arange(height, device=device).view(height, 1) + pad
    cols = torch.arange(width, device=device).view(1, width) + pad
    return (rows * (width + 2 * pad) + cols).reshape(-1)


def padded_tokens(x: Tensor, grid: tuple[int, int], pad: int) -> Tensor:
    """Tokens (B, h, H·W, D) of an H×W map → the tokens of the map zero-padded by ``pad``, (B, h, M, D)."""
    B, h, _, D = x.shape
    maps = x.transpose(-1, -2).reshape(B * h, D, *grid)  # (B·h, D, H, W)
    padded = F.pad(maps, (pad, pad, pad, pad))
    return padded.flatten(2).transpose(1, 2).reshape(B, h, -1, D)


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 accumulation for half inputs; fp64 inputs stay fp64 (gradcheck)."""
    return torch.promote_types(dtype, torch.float32)


def similarity_scores(q: Tensor, k: Tensor, similarity: str = "cosine") -> Tensor:
    """Pairwise query–key similarity (METHOD §2 step 1).

    Args:
        q (Tensor): (B, H, Nq, D) queries.
        k (Tensor): (B, H, Nk, D) keys.
        similarity (str): ``"cosine"`` (zero vectors score 0), ``"dot"`` (``q·k/√D``) or ``"euclidean"``
            (``−‖q − k‖²``). Default: ``"cosine"``.

    Returns:
        Tensor: (B, H, Nq, Nk) scores in fp32 (fp64 for fp64 inputs); larger means more similar. Non-finite
        scores follow the module's rule: NaN → −∞, +∞ → the dtype's largest finite value.
    """
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
    dtype = _accumulate_dtype(q.dtype)
    q, k = q.to(dtype), k.to(dtype)
    with torch.autocast(q.device.type, enabled=False):  # scores decide the selection: keep them in fp32
        if similarity == "cosine":
            scores = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)
        elif similarity == "dot":
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        else:
            sq_q = q.square().sum(-1, keepdim=True)  # (B, H, Nq, 1)
            sq_k = k.square().sum(-1).unsqueeze(-2)  # (B, H, 1, Nk)
            scores = 2 * (q @ k.transpose(-1, -2)) - sq_q - sq_k
    return canonical_scores(scores)


def canonical_scores(scores: Tensor) -> Tensor:
    """The module's rule for non-finite scores: NaN → −∞, +∞ → the largest finite value of ``scores.dtype``."""
    return torch.where(torch.isnan(scores), -math.inf, scores.clamp(max=torch.finfo(scores.dtype).max))


def neighbor_scores(q: Tensor, k: Tensor, topk_idx: Tensor, similarity: str = "cosine") -> Tensor:
    """Similarity of each query to its selected keys only, without the (Nq, Nk) matrix.

    Args:
        q (Tensor): (B, H, Nq, D) queries.
        k (Tensor): (B, H, Nk, D) keys.
        topk_idx (Tensor): (B, H, Nq, K) int64 key indices per query.
        similarity (str): as in :func:`similarity_scores`. Default: ``"cosine"``

    Returns:
        Tensor: (B, H, Nq, K) scores, fp32 (fp64 for fp64 inputs), equal to
        ``similarity_scores(q, k).gather(-1, topk_idx)``.
    """
    B, H, Nq, K = topk_idx.shape
    keys = torch.gather(k, 2, topk_idx.reshape(B, H, Nq * K, 1).expand(-1, -1, -1, k.shape[-1]))
    return similarity_scores(q.unsqueeze(-2), keys.view(B, H, Nq, K, -1), similarity).squeeze(-2)


def select_topk(scores: Tensor, num_neighbors: int, self_index: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The K best candidates per query, most similar first, ties to the lower index (METHOD §2 step 2).

    The result is what a stable descending sort gives, computed without a data-dependent branch or a stable sort
    (so it traces into one graph: ``torch.compile(fullgraph=True)``, ``torch.export``, ONNX; docs/method.md §9):
    ``torch.topk`` finds the K-th best score ``v``; the keys scoring above ``v`` are all among its K (put in
    (score, index) order), and the rest of the K are the lowest-index keys scoring exactly ``v`` (a second top-K,
    over the tied keys' negated indices).

    Args:
        scores (Tensor): (..., Nq, M) candidate scores, without NaN (:func:`canonical_scores`); ``−∞`` marks a
            forbidden candidate. M < 2**24 (the tied keys' indices are ranked as fp32).
        num_neighbors (int): K, 1 ≤ K ≤ M.
        self_index (Tensor, optional): (Nq,) int64 column of each query's own token; that column is ranked first
            whatever its score (its real score is still returned). Default: None (rank by score alone).

    Returns:
        tuple[Tensor, Tensor]: ``topk_scores`` (..., Nq, K) and ``topk_idx`` (..., Nq, K) int64 column indices.
    """
    ranking = scores.detach()
    if self_index is not None:
        forced = torch.zeros_like(ranking, dtype=torch.bool)
        forced[..., torch.arange(scores.shape[-2], device=scores.device), self_index] = True
        ranking = ranking.masked_fill(forced, math.inf)
    # torch.topk is much faster than a sort but leaves ties unordered: its K are re-ordered by (score, index), which
    # is exact for every key above the K-th score; the slots of keys tied with the K-th score are refilled with the
    # lowest-index tied keys, in index order. Branch-free: every row takes the same ops. topk gives its K in
    # descending order, so equal scores are runs: the re-ordering sorts the distinct integers (the score's run
    # number, a cumulative sum)·M + index, so no stable sort is needed (ONNX has none), in O(K) memory per query.
    topk_vals, topk_idx = torch.topk(ranking, num_neighbors, dim=-1)
    new_run = torch.cat([torch.ones_like(topk_vals[..., :1], dtype=torch.bool),
                         topk_vals[..., 1:] != topk_vals[..., :-1]], dim=-1)
    run = new_run.cumsum(-1)  # (..., Nq, K): the rank of each of the K's score among the K's distinct scores
    num_keys = ranking.shape[-1]
    topk_idx = torch.remainder((run * num_keys + topk_idx).sort(dim=-1).values, num_keys)
    kth = topk_vals[..., -1:]
    above = (topk_vals > kth).sum(-1, keepdim=True)  # (..., Nq, 1) keys strictly above the K-th score, < K
    negated = -torch.arange(ranking.shape[-1], device=scores.device, dtype=torch.float32)
    tied = torch.where(ranking == kth, negated, -math.inf).topk(num_neighbors, dim=-1).indices  # lowest first
    slots = torch.arange(num_neighbors, device=scores.device)
    topk_idx = torch.where(slots < above, topk_idx, tied.gather(-1, (slots - above).clamp_min(0)))
    return scores.gather(-1, topk_idx), topk_idx


def neighbor_weights(topk_scores: Tensor, weighting: str = "none", temperature: float = 1.0) -> Tensor:
    """The modulation ρ of the selected values (METHOD §2 step 2).

    Args:
        topk_scores (Tensor): (..., K) scores of the selected neighbours as :func:`similarity_scores` gives them;
            ``−∞`` marks a masked slot (or a NaN score).
        weighting (str): ``"none"`` (1), ``"softmax"`` (``exp((s − s_max) / temperature)`` normalised over the K
            slots) or ``"uniform"`` (1 / the number of valid slots). ``−∞`` slots get 0. Default: ``"none"``.
        temperature (float): softmax temperature, > 0. Default: 1.0

    Returns:
        Tensor: (..., K) weights, dtype of ``topk_scores``; a row without a valid slot weighs 0 everywhere.
    """
    valid = topk_scores > -math.inf
    if weighting == "softmax":
        top = topk_scores.masked_fill(~valid, -math.inf).amax(-1, keepdim=True)
        top = torch.where(top > -math.inf, top, 0.0).detach()  # a row of −∞ only: no NaN, in value or gradient
        e = torch.where(valid, torch.exp((topk_scores - top) / temperature), 0.0)
        total = e.sum(-1, keepdim=True)  # ≥ 1 with a valid slot (its maximum contributes exp(0) = 1), else 0
        return e / torch.where(total > 0, total, 1.0)
    ones = valid.to(topk_scores.dtype)
    if weighting == "none":
        return ones
    if weighting == "uniform":
        return ones / ones.sum(-1, keepdim=True).clamp_min(1)
    raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")


def aggregate_neighbors(
    v: Tensor, topk_idx: Tensor, topk_weights: Tensor | None, weight: Tensor, bias: Tensor | None, groups: int = 1
) -> Tensor:
    """Gather, weigh and aggregate the selected values with a Conv1D over rank slots (METHOD §2 step 3).

    Args:
        v (Tensor): (B, H, Nk, Dv) values.
        topk_idx (Tensor): (B, H, Nq, K) int64 key indices, rank 0 first.
        topk_weights (Tensor, optional): (B, H, Nq, K) weights ρ; None multiplies by nothing.
        weight (Tensor): (C_out, H·Dv / groups, K) Conv1D weight; tap ``t`` weighs the rank-``t`` neighbour.
        bias (Tensor, optional): (C_out,) Conv1D bias.
        groups (int): Conv1D groups; ``H·Dv`` is depthwise aggregation. Default: 1

    Returns:
        Tensor: (B, C_out, Nq), ``F.conv1d(neighbors, weight, bias, stride=K, groups=groups)`` where
        ``neighbors[b, h·Dv + c, i·K + t] = ρ[b, h, i, t] · v[b, h, idx[b, h, i, t], c]``.
    """
    note_backend("reference")
    B, H, Nk, Dv = v.shape
    Nq, K = topk_idx.shape[-2:]
    C_in, C_out = H * Dv, weight.shape[0]
    # Row gather through F.embedding: its backward accumulates repeated rows without per-element atomics.
    row_offset = torch.arange(B * H, device=v.device).view(B, H, 1, 1) * Nk
    neighbors = F.embedding(topk_idx + row_offset, v.reshape(B * H * Nk, Dv))  # (B, H, Nq, K, Dv)
    if topk_weights is not None:
        neighbors = neighbors * topk_weights.unsqueeze(-1).to(neighbors.dtype)
    weight = weight.to(neighbors.dtype)
    if groups == 1:  # the Conv1D as one GEMM: (B·Nq, K·C_in) @ (K·C_in, C_out)
        rows = neighbors.permute(0, 2, 3, 1, 4).reshape(B, Nq, K * C_in)  # tap-major, channel h·Dv + c
        out = (rows @ weight.permute(2, 1, 0).reshape(K * C_in, C_out)).transpose(1, 2)
    elif groups == C_in == C_out:  # depthwise: out[b, h·Dv + c, i] = Σ_t W[h·Dv + c, 0, t] · neighbor
        out = torch.einsum("bhitc,hct->bhci", neighbors, weight.view(H, Dv, K)).reshape(B, C_out, Nq)
    else:  # the definition itself: Conv1d over the (B, C_in, Nq·K) sequence
        sequence = neighbors.permute(0, 1, 4, 2, 3).reshape(B, C_in, Nq * K)
        return F.conv1d(sequence, weight, None if bias is None else bias.to(sequence.dtype), stride=K, groups=groups)
    return out if bias is None else out + bias.to(out.dtype).view(1, C_out, 1)


def candidates_on(candidates: Tensor | None, device: torch.device) -> Tensor | None:
    """``candidates`` on ``device``, where the scores are computed (METHOD §3, ``random``).

    The layers draw candidates on the CPU, where :func:`kernels.checks.check_knn_arguments` checks their range
    without a device sync; a CPU tensor bound for CUDA is copied through pinned memory without blocking (a pageable
    copy, like the sync, would make the host wait for every queued kernel at each call of a random layer).

    Args:
        candidates (Tensor, optional): (B or 1, r) int64 key indices, on any device.
        device (torch.device): where q and k are.

    Returns:
        Tensor or None: the same indices on ``device`` (``candidates`` itself when already there; in a traced graph
        a plain copy, which the compiler schedules).
    """
    if candidates is None or candidates.device == device:
        return candidates
    if candidates.device.type == "cpu" and device.type == "cuda" and not torch.compiler.is_compiling():
        return candidates.pin_memory().to(device, non_blocking=True)
    return candidates.to(device)


def _candidate_scores(
    q: Tensor, k: Tensor, candidates: Tensor, similarity: str, attn_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Scores against the query itself (column 0) and the r sampled keys (columns 1..r), METHOD §3.

    A sampled key that is the query itself is masked, so the query is a candidate exactly once.
    Returns ``scores`` (B, H, Nq, r + 1) and the key index of each column, ``key_idx`` (B, 1, Nq, r + 1).
    """
    B, H, Nq, D = q.shape
    r = candidates.shape[-1]
    cand = candidates.expand(B, r)
    k_cand = torch.gather(k, 2, cand.view(B, 1, r, 1).expand(B, H, r, D))  # (B, H, r, D)
    scores = torch.cat([similarity_scores(q.unsqueeze(-2), k.unsqueeze(-2), similarity).squeeze(-1),
                        similarity_scores(q, k_cand, similarity)], dim=-1)  # (B, H, Nq, r + 1)
    query_idx = torch.arange(Nq, device=q.device).view(1, 1, Nq, 1).expand(B, 1, Nq, 1)
    key_idx = torch.cat([query_idx, cand.view(B, 1, 1, r).expand(B, 1, Nq, r)], dim=-1)  # (B, 1, Nq, r + 1)
    allowed = torch.ones_like(key_idx, dtype=torch.bool)
    allowed[..., 1:] = key_idx[..., 1:] != query_idx
    if attn_mask is not None:
        allowed = allowed & torch.gather(attn_mask.expand(B, H, Nq, k.shape[2]), -1, key_idx.expand(B, H, Nq, r + 1))
    return scores.masked_fill(~allowed, -math.inf), key_idx


def select_neighbors(
    q: Tensor,
    k: Tensor,
    *,
    num_neighbors: int,
    similarity: str = "cosine",
    candidates: Tensor | None = None,
    attn_mask: Tensor | None = None,
    self_first: bool = False,
    blend: BlendGrid | None = None,
) -> tuple[Tensor, Tensor]:
    """Score the candidates of every query and keep the top K (METHOD §2 steps 1–2, §3 candidate sets).

    Args:
        q (Tensor): (B, H, Nq, D) queries.
        k (Tensor): (B, H, Nk, D) keys.
        num_neighbors (int): K.
        similarity (str): ``"cosine"``, ``"dot"`` or ``"euclidean"``. Default: ``"cosine"``
        candidates (Tensor, optional): (B, r) or (1, r) int64 sampled keys, on the CPU or q's device
            (:func:`candidates_on`); the query itself is always a candidate too, ranked first among equal scores.
            None: all Nk keys. Default: None
        attn_mask (Tensor, optional): bool, broadcastable to (B, H, Nq, Nk), True = allowed.
        self_first (bool): force each query's own token (key index = query index) to rank 0. Default: False
        blend (BlendGrid, optional): the ``blend`` rule's map: candidates are its padded cells, scored by
            :func:`blend_scores`, the query first (``candidates``, ``attn_mask`` and ``self_first`` unused).
            Default: None

    Returns:
        tuple[Tensor, Tensor]: ``topk_scores`` (B, H, Nq, K), differentiable w.r.t. ``q`` and ``k`` where grad is
        enabled, and ``topk_idx`` (B, H, Nq, K) int64 key indices (padded cells with ``blend``), rank 0 first.
    """
    Nq = q.shape[2]
    candidates = candidates_on(candidates, q.device)
    if blend is not None:
        grid = (blend.height, blend.width)
        feature = similarity_scores(q, padded_tokens(k, grid, blend.pad), similarity)  # (B, H, Nq, M)
        scores = blend_scores(feature, spatial_scores(*grid, blend.window_size, q.device), blend.alpha)
        return select_topk(scores, num_neighbors, query_positions_in_padded(*grid, blend.pad, q.device))
    if candidates is None:
        scores = similarity_scores(q, k, similarity)  # (B, H, Nq, Nk)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, -math.inf)
        self_column = torch.arange(Nq, device=q.device) if self_first else None
        return select_topk(scores, num_neighbors, self_column)
    scores, key_idx = _candidate_scores(q, k, candidates, similarity, attn_mask)  # (B, H, Nq, r + 1)
    self_column = torch.zeros(Nq, dtype=torch.long, device=q.device) if self_first else None
    topk_scores, columns = select_topk(scores, num_neighbors, self_column)
    return topk_scores, torch.gather(key_idx.expand(*columns.shape[:-1], key_idx.shape[-1]), -1, columns)


@takes_options
def knn_aggregate_reference(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, bias: Tensor | None = None, *,
                            attn_mask: Tensor | None = None, **options) -> KnnResult:
    """ConvNN aggregation, unfused (METHOD §2–3): dense scores → stable top-K → ρ → gather → Conv1D.

    Args:
        q (Tensor): (B, H, Nq, D) queries.
        k (Tensor): (B, H, Nk, D) keys.
        v (Tensor): (B, H, Nk, Dv) values.
        weight (Tensor): (C_out, H·Dv / groups, K) Conv1D weight over rank slots.
        bias (Tensor, optional): (C_out,) Conv1D bias. Default: None
        num_neighbors (int): K neighbours per query.
        similarity (str): ``"cosine"``, ``"dot"`` or ``"euclidean"``. Default: ``"cosine"``
        weighting (str): ρ, ``"none"``, ``"softmax"`` or ``"uniform"``. Default: ``"none"``
        temperature (float): softmax temperature. Default: 1.0
        groups (int): Conv1D groups (``H·Dv`` = depthwise). Default: 1
        candidates (Tensor, optional): (B, r) or (1, r) int64 sampled key indices shared by every query of a sample;
            the query itself is always a candidate too (METHOD §3, ``random``). None: all Nk keys. Default: None
        attn_mask (Tensor, optional): bool, broadcastable to (B, H, Nq, Nk), True where a pair is allowed.
        self_first (bool): force each query's own token (key index = query index; needs Nq = Nk) to rank 0.
            Default: False
        blend (BlendGrid, optional): the ``blend`` rule (:func:`select_neighbors`); values are zero-padded like
            the keys and ``topk_idx`` counts padded cells. Default: None

    Returns:
        KnnResult: ``out`` (B, C_out, Nq), ``topk_idx`` (B, H, Nq, K) int64, ``topk_weights`` (B, H, Nq, K).
    """
    num_neighbors, similarity, weighting, temperature, groups, self_first, candidates, blend = bind_options(
        "knn_aggregate_reference", options)
    with torch.set_grad_enabled(torch.is_grad_enabled() and weighting == "softmax"):
        topk_scores, topk_idx = select_neighbors(q, k, num_neighbors=num_neighbors, similarity=similarity,
                                                 candidates=candidates, attn_mask=attn_mask, self_first=self_first,
                                                 blend=blend)
        topk_weights = neighbor_weights(topk_scores, weighting, temperature)
    if blend is not None:
        v = padded_tokens(v, (blend.height, blend.width), blend.pad)
    # The weights are applied under every ρ: a masked or NaN-scored slot weighs 0 even for "none".
    out = aggregate_neighbors(v, topk_idx, topk_weights, weight, bias, groups)
    return KnnResult(out, topk_idx, topk_weights)
