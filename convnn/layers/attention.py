"""Token-mixing layers for transformers: ConvNN-attention and its baselines, KVT and multi-head self-attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels import WEIGHTINGS, knn_aggregate
from kernels.autocast import autocast_aware
from kernels.dispatch import BACKENDS
from kernels.reference import aggregate_neighbors, neighbor_weights

from ..candidates import CandidateSampler
from ..recording import Recordable
from ..selection import SelectionOptions, rule_names, selection_rule
from ..validation import check_choice, check_floating_input, check_int, check_positive

__all__ = ["ATTENTIONS", "ConvNNAttention", "KVTAttention", "MultiheadSelfAttention", "create_attention"]



class MultiheadSelfAttention(nn.Module):
    """Multi-head self-attention through ``F.scaled_dot_product_attention`` (the MHSA baseline, METHOD §5).

    Args:
        dim (int): token width; a multiple of ``num_heads``.
        num_heads (int): h; head dim d = dim / h. Default: 8
        qkv_bias (bool): bias of the fused q, k, v projection. Default: True
        proj_bias (bool): bias of the output projection. Default: True

    Shape:
        Input (B, N, dim) and an optional bool ``attn_mask`` broadcastable to (B, h, N, N), True = allowed →
        output (B, N, dim).

    Raises:
        ValueError: ``dim`` not a multiple of ``num_heads``.
    """

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True, proj_bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        check_int("dim", dim, 1)
        check_int("num_heads", num_heads, 1)
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be a multiple of num_heads, got num_heads={num_heads}")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias, device=device, dtype=dtype)
        self.proj = nn.Linear(dim, dim, bias=proj_bias, device=device, dtype=dtype)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B, N, dim) tokens → queries, keys and values, (B, h, N, d) each (one fused linear projection)."""
        B, N, _ = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.num_heads, self.head_dim)  # b n (three h d)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)  # three × (B, h, N, d)

    def check_input(self, x: Tensor, attn_mask: Tensor | None) -> None:
        """Raise ``ValueError`` unless ``x`` is float (B, N, dim) and ``attn_mask`` bool, broadcast to (B, h, N, N)."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"input must be (B, N, dim={self.dim}), got {tuple(x.shape)}")
        check_floating_input(x)
        if attn_mask is None:
            return
        shape = (x.shape[0], self.num_heads, x.shape[1], x.shape[1])
        try:
            torch.broadcast_shapes(attn_mask.shape, shape)
        except RuntimeError as err:
            raise ValueError(f"attn_mask must broadcast to (B, h, N, N) = {shape}, "
                             f"got {tuple(attn_mask.shape)}") from err
        if attn_mask.dtype != torch.bool:
            raise ValueError(f"attn_mask must be bool (True = allowed), got {attn_mask.dtype}")

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        self.check_input(x, attn_mask)
        q, k, v = self.project_qkv(x)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, h, N, d)
        return self.proj(out.transpose(1, 2).flatten(2))

    def describe(self, name: str) -> dict:
        """What this layer is, for :func:`convnn.introspect.convnn_layers`: attention over every token."""
        return {"kind": "attention", "mixer": "mhsa", "record_name": None, "num_neighbors": None,
                "selection": "dense", "similarity": "dot", "num_heads": self.num_heads}

    def extra_repr(self) -> str:
        return f"{self.dim}, num_heads={self.num_heads}"


class ConvNNAttention(Recordable, MultiheadSelfAttention):
    """ConvNN-attention: per head, top-K keys by scaled dot product, softmax over the K, depthwise Conv1D over ranks.

    Implements METHOD §5: replaces multi-head self-attention in a ViT. For each head the query picks its K
    highest-scoring keys (``q·k/√d``, ties to the lower index; among ``num_candidates`` random keys plus itself
    with ``selection="random"``), weighs them by ρ (softmax by default), and a depthwise Conv1D with kernel K over
    rank slots (weight (dim, 1, K), no bias) aggregates them; an output projection follows. The Conv1D starts at
    all ones, so at initialisation the layer equals :class:`KVTAttention` (METHOD §4.4); with K = N it equals
    MHSA (METHOD §4.3).

    Args:
        dim (int): token width; a multiple of ``num_heads``.
        num_heads (int): h. Default: 8
        num_neighbors (int): K, 1 ≤ K ≤ N (≤ r + 1 with random candidates). Default: 16
        selection (str): ``"all"`` or ``"random"``. Default: ``"all"``
        num_candidates (int, optional): r for ``"random"``, ≥ K. Default: None
        weighting (str): ρ: ``"softmax"``, ``"uniform"`` or ``"none"``. Default: ``"softmax"``
        temperature (float): softmax temperature, > 0. Default: 1.0
        qkv_bias (bool): bias of the q, k, v projection. Default: True
        proj_bias (bool): bias of the output projection. Default: True
        candidate_sampling (str): ``"batch"`` or ``"sample"`` draws. Default: ``"batch"``
        seed (int): seed of the candidate draws, in [0, 2**63 − 1]; a model overrides it with one derived from its
            ``candidate_seed`` and the layer's name (:mod:`convnn.candidates`: a training stream, per-sample draws
            keyed on the input in eval mode). Default: 0
        backend (str): ``"auto"``, ``"reference"`` or ``"triton"``. Default: ``"auto"``

    Shape:
        Input (B, N, dim), optional bool ``attn_mask`` broadcastable to (B, h, N, N) (reference path) → (B, N, dim);
        inside ``torch.autocast`` in the autocast dtype with fp32 scores and sums (:mod:`kernels.autocast`).

    Attributes:
        weight (Tensor): (dim, 1, K) depthwise aggregation kernel over rank slots, initialised to ones.

    Raises:
        ValueError: an argument outside its range, or K larger than the number of candidates at run time.
    """

    learnable_kernel = True
    mixer = "convnn"  # how convnn.introspect names it

    def __init__(self, dim: int, num_heads: int = 8, num_neighbors: int = 16, selection: str = "all",
                 num_candidates: int | None = None, weighting: str = "softmax", temperature: float = 1.0,
                 qkv_bias: bool = True, proj_bias: bool = True, candidate_sampling: str = "batch", seed: int = 0,
                 backend: str = "auto", device=None, dtype=None) -> None:
        super().__init__(dim, num_heads, qkv_bias, proj_bias, device=device, dtype=dtype)
        rule = selection_rule(selection)
        if rule.needs_grid:
            raise ValueError(f"selection must be one of {rule_names(needs_grid=False)} for attention (tokens have no "
                             f"grid), got {selection!r}")
        check_choice("weighting", weighting, WEIGHTINGS)
        check_choice("backend", backend, BACKENDS)
        check_int("num_neighbors", num_neighbors, 1)
        check_positive("temperature", temperature)
        self.num_neighbors, self.selection, self.num_candidates = num_neighbors, selection, num_candidates
        self.weighting, self.temperature, self.backend = weighting, temperature, backend
        self._sampler = CandidateSampler.for_rule(rule, num_candidates, num_neighbors, candidate_sampling, seed)
        kernel = torch.ones(dim, 1, num_neighbors, device=device, dtype=dtype)
        if self.learnable_kernel:
            self.weight = nn.Parameter(kernel)
        else:
            self.register_buffer("weight", kernel)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        self.check_input(x, attn_mask)
        N = x.shape[1]
        q, k, v = self.project_qkv(x)
        rule = selection_rule(self.selection)
        if rule.fused:  # selection and aggregation in one call: the fused kernel on CUDA
            candidates = self._sampler(x, N, self.training)
            result = knn_aggregate(q, k, v, self.weight, num_neighbors=self.num_neighbors, similarity="dot",
                                   weighting=self.weighting, temperature=self.temperature, groups=self.dim,
                                   candidates=candidates, attn_mask=attn_mask, backend=self.backend)
            self._record(result.topk_idx, result.topk_weights, 1, N, candidates=candidates)
            return self.proj(result.out.transpose(1, 2))  # (B, dim, N) → (B, N, dim)
        if attn_mask is not None:
            raise ValueError(f"attn_mask needs a selection the kernels run (one of "
                             f"{tuple(n for n in rule_names(needs_grid=False) if selection_rule(n).fused)}), "
                             f"got {self.selection!r}")
        out, idx, weights = self._select_aggregate(q, k, v, self.weight, rule)  # (B, dim, N)
        self._record(idx, weights, 1, N)
        return self.proj(out.transpose(1, 2))

    @autocast_aware
    def _select_aggregate(self, q: Tensor, k: Tensor, v: Tensor, weight: Tensor, rule) -> tuple[Tensor, ...]:
        """A rule the kernels do not run: select, weigh, gather, Conv1D (in the autocast dtype under autocast, like
        :func:`kernels.knn_aggregate`). Returns (out (B, dim, N), idx, weights)."""
        options = SelectionOptions(self.num_neighbors, "dot", self_first=False)
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.weighting == "softmax"):
            neighbors = rule.select(q, k, None, options)
            weights = neighbor_weights(neighbors.topk_scores, self.weighting, self.temperature)
        out = aggregate_neighbors(v, neighbors.topk_idx, weights, weight, None, self.dim)
        return out, neighbors.topk_idx, weights

    def describe(self, name: str) -> dict:
        """What this layer is, for :func:`convnn.introspect.convnn_layers` (``name``: its qualified name)."""
        return {"kind": "attention", "mixer": self.mixer, "record_name": name, "num_neighbors": self.num_neighbors,
                "selection": self.selection, "similarity": "dot", "num_candidates": self.num_candidates,
                "num_heads": self.num_heads, "seed": self.seed}

    @property
    def seed(self) -> int:
        """The layer's candidate seed (:class:`~convnn.candidates.CandidateSampler`)."""
        return self._sampler.seed

    def extra_repr(self) -> str:
        extra = f", selection={self.selection!r}, num_candidates={self.num_candidates}" if self.num_candidates else ""
        return f"{super().extra_repr()}, num_neighbors={self.num_neighbors}, weighting={self.weighting!r}{extra}"


class KVTAttention(ConvNNAttention):
    """k-NN attention (KVT): softmax over the top-K scores, the rest masked, then ``@ V`` (METHOD §4.4, §5).

    :class:`ConvNNAttention` with its rank-slot kernel frozen at ones (a buffer, not a parameter): the plain sum
    of the K weighted values. Same arguments, shapes and errors.
    """

    learnable_kernel = False
    mixer = "kvt"


ATTENTIONS = {"mhsa": MultiheadSelfAttention, "kvt": KVTAttention, "convnn": ConvNNAttention}


def create_attention(kind: str, dim: int, num_heads: int, qkv_bias: bool = True, **knn_options) -> nn.Module:
    """Build the token mixer ``kind`` (``"mhsa"``, ``"kvt"`` or ``"convnn"``); ``knn_options`` go to the k-NN ones.

    Raises:
        ValueError: unknown ``kind``, or ``knn_options`` given for ``"mhsa"``.
    """
    check_choice("attention", kind, tuple(ATTENTIONS))
    if kind == "mhsa" and knn_options:
        raise ValueError(f"attention='mhsa' takes no k-NN options, got {sorted(knn_options)}")
    return ATTENTIONS[kind](dim, num_heads, qkv_bias=qkv_bias, **knn_options)
