"""``ConvNN2d``: every pixel aggregates its K selected neighbours with a Conv1D over rank slots (METHOD §2–3, §5)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels import SIMILARITIES, WEIGHTINGS, knn_aggregate
from kernels.autocast import autocast_aware
from kernels.dispatch import BACKENDS
from kernels.reference import aggregate_neighbors, neighbor_weights
from kernels.usage import note_backend

from ..candidates import CandidateSampler
from ..functional import coordinate_channels, pad_map, to_tokens, window_indices, window_kernel
from ..recording import Recordable
from ..selection import SelectionOptions, check_window_neighbors, effective_selection, selection_rule
from ..validation import check_choice, check_floating_input, check_int, check_positive, check_ratio

__all__ = ["ConvNN2d"]


class ConvNN2d(Recordable):
    """Each pixel aggregates its K selected neighbours with a Conv1D over rank slots (rank 0 = the pixel itself).

    Implements METHOD §2–3 on a 2-D map of N = H·W tokens. For query pixel ``i`` the layer scores candidate
    pixels ``j``, keeps the top K (the query itself forced to rank 0, ties to the lower index), weighs them by ρ,
    and applies ``Conv1d(C_in, C_out, kernel_size=K, stride=K)`` to the gathered ``(B, C_in, N·K)`` sequence, so tap
    ``t`` of the kernel weighs "the t-th nearest neighbour". With ``selection="window"`` and K = R² it equals
    ``Conv2d(kernel_size=R, padding=R // 2)`` (METHOD §4.1–4.2, see :meth:`load_conv2d_weight`).

    Selection rules (METHOD §3):

    * ``"all"``: every pixel is a candidate; features scored by ``similarity``; O(N²) scores.
    * ``"random"``: ``num_candidates`` pixels drawn without replacement plus the query; O(N·r). In training mode
      each call draws anew from the layer's stream (seeded with ``seed``); in eval mode each sample draws from a key
      of its own input, so an image gets the same output alone or in any batch (:mod:`convnn.candidates`; a model
      gives each of its random layers its own seed). ``r ≥ N`` falls back to ``"all"``.
    * ``"window"``: the K offsets nearest the query in its R×R window (all of it when K = R²), zero-padded, in raster
      order: a convolution. Scores are only computed when ``weighting`` needs them.
    * ``"blend"``: top K of ``(1 − α)·spatial + α·feature`` on normalised scores over the zero-padded map
      (:func:`kernels.reference.blend_scores`), the query first; on CUDA in the fused kernel (weighting
      ``"none"``/``"uniform"``). Its ends are the two operations exactly
      (:func:`convnn.selection.effective_selection`): α = 0 is ``"window"`` (raster order, needs K ≤ R²), α = 1
      is ``"all"``.

    Args:
        in_channels (int): C_in.
        out_channels (int): C_out.
        num_neighbors (int): K, ≥ 1; K ≤ N at run time, K ≤ R² for ``"window"``, K ≤ r for ``"random"``.
            Default: 9
        selection (str): ``"all"``, ``"random"``, ``"window"`` or ``"blend"``. Default: ``"all"``
        similarity (str): ``"cosine"``, ``"dot"`` (q·k/√d) or ``"euclidean"`` (−‖q − k‖²). Default: ``"cosine"``
        weighting (str): ρ: ``"none"`` (pure gather), ``"softmax"`` (over the K selected scores) or ``"uniform"``
            (1/K). Default: ``"none"``
        num_candidates (int, optional): r for ``"random"``, ≥ K. Default: None
        window_size (int): R, odd, for ``"window"`` and ``"blend"``. Default: 3
        blend_alpha (float): α ∈ [0, 1] for ``"blend"``. Default: 0.5
        temperature (float): softmax temperature, > 0. Default: 1.0
        coord_channels (bool): append normalised (row, col) ∈ [−1, 1] to the features used for similarity (not to
            the values). Default: False
        qk_dim (int, optional): learned 1×1 query/key projections to this many channels; without it the similarity
            uses the input features themselves. Needs ``weighting="softmax"``: top-K indices carry no gradient, so
            only softmax weights let the projections learn. Default: None
        candidate_sampling (str): ``"batch"`` (one draw shared by the batch, as the paper) or ``"sample"`` (one per
            sample). Default: ``"batch"``
        groups (int): Conv1D groups; ``groups=in_channels`` is depthwise aggregation. Default: 1
        bias (bool): Conv1D bias. Default: True
        seed (int): seed of the candidate draws (``"random"``), in [0, 2**63 − 1]; a model overrides it with one
            derived from its ``candidate_seed`` and the layer's name (:mod:`convnn.candidates`). Default: 0
        backend (str): ``"auto"`` (fused kernel on CUDA, reference elsewhere), ``"reference"`` or ``"triton"``.
            Default: ``"auto"``

    Shape:
        Input (B, C_in, H, W), float32, bfloat16 or float16 (float64 on the reference) → output (B, C_out, H, W),
        same dtype; inside ``torch.autocast`` the autocast dtype, computed from inputs and weights in that dtype
        with fp32 scores and sums, as ``nn.Conv2d`` (:mod:`kernels.autocast`). Internally scores are (B, N, N) or
        (B, N, r + 1) on the reference (never materialised by the fused kernel) and neighbour indices (B, 1, N, K)
        int64; indices carry no gradient.

    Attributes:
        weight (Tensor): (C_out, C_in / groups, K), initialised like ``nn.Conv1d`` (Kaiming-uniform, a = √5).
        bias (Tensor): (C_out,) or None.

    Raises:
        ValueError: an argument outside its range (the message names it and the value received), ``qk_dim``
            without softmax weighting, a non-4-D input or one with the wrong channel count, or K larger than the
            number of candidates of the input.

    Example:
        >>> ConvNN2d(16, 32, selection="window")(torch.randn(2, 16, 8, 8)).shape
        torch.Size([2, 32, 8, 8])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        num_neighbors: int = 9,
        selection: str = "all",
        similarity: str = "cosine",
        weighting: str = "none",
        num_candidates: int | None = None,
        window_size: int = 3,
        blend_alpha: float = 0.5,
        temperature: float = 1.0,
        coord_channels: bool = False,
        qk_dim: int | None = None,
        candidate_sampling: str = "batch",
        groups: int = 1,
        bias: bool = True,
        seed: int = 0,
        backend: str = "auto",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        rule = selection_rule(selection)  # one of convnn.selection.SELECTION_RULES
        check_choice("similarity", similarity, SIMILARITIES)
        check_choice("weighting", weighting, WEIGHTINGS)
        check_choice("backend", backend, BACKENDS)
        check_int("in_channels", in_channels, 1)
        check_int("out_channels", out_channels, 1)
        check_int("num_neighbors", num_neighbors, 1)
        check_int("window_size", window_size, 1)
        if window_size % 2 == 0:
            raise ValueError(f"window_size must be an odd integer ≥ 1, got {window_size}")
        check_ratio("blend_alpha", blend_alpha)
        check_window_neighbors(effective_selection(selection, blend_alpha), num_neighbors, window_size)
        check_positive("temperature", temperature)
        check_int("groups", groups, 1)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"groups must divide in_channels={in_channels} and out_channels={out_channels}, "
                             f"got {groups}")
        if qk_dim is not None:
            check_int("qk_dim", qk_dim, 1)
            if weighting != "softmax":
                raise ValueError(f"qk_dim needs weighting='softmax': top-K indices carry no gradient, so with "
                                 f"weighting={weighting!r} the q/k projections could never learn")
        factory = {"device": device, "dtype": dtype}
        self.in_channels, self.out_channels = in_channels, out_channels
        self.num_neighbors, self.selection, self.similarity = num_neighbors, selection, similarity
        self.weighting, self.num_candidates, self.window_size = weighting, num_candidates, window_size
        self.blend_alpha, self.temperature, self.coord_channels = blend_alpha, temperature, coord_channels
        self.qk_dim, self.candidate_sampling, self.groups = qk_dim, candidate_sampling, groups
        self.backend = backend
        feature_dim = in_channels + (2 if coord_channels else 0)
        self.q_proj = nn.Conv2d(feature_dim, qk_dim, 1, bias=False, **factory) if qk_dim else None
        self.k_proj = nn.Conv2d(feature_dim, qk_dim, 1, bias=False, **factory) if qk_dim else None
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, num_neighbors, **factory))
        self.bias = nn.Parameter(torch.empty(out_channels, **factory)) if bias else None
        self._sampler = CandidateSampler.for_rule(rule, num_candidates, num_neighbors, candidate_sampling, seed)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Conv1d``'s initialisation: Kaiming-uniform weight (a = √5), bias ~ U(±1/√fan_in)."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.weight.shape[1] * self.weight.shape[2])
            nn.init.uniform_(self.bias, -bound, bound)

    @torch.no_grad()
    def load_conv2d_weight(self, conv: nn.Conv2d) -> None:
        """Copy a square ``Conv2d``'s kernel into the rank slots: ``W1[o, c, t] = W2[o, c, t // R, t % R]``.

        Together with ``selection="window"``, K = R² and the same ``groups``, the layer then computes exactly
        ``conv`` with ``padding = R // 2`` (METHOD §4.1–4.2).

        Raises:
            ValueError: ``conv``'s kernel, channels, groups or bias do not match this layer.
        """
        expected = (self.out_channels, self.in_channels // self.groups, self.window_size, self.window_size)
        if tuple(conv.weight.shape) != expected or conv.groups != self.groups:
            raise ValueError(f"conv weight must be {expected} with groups={self.groups}, "
                             f"got {tuple(conv.weight.shape)} with groups={conv.groups}")
        if self.num_neighbors != self.window_size**2:
            raise ValueError(f"num_neighbors must be window_size**2 = {self.window_size**2}, got {self.num_neighbors}")
        if (conv.bias is None) != (self.bias is None):
            raise ValueError("conv and this layer must both have a bias or both have none")
        self.weight.copy_(conv.weight.flatten(2))
        if self.bias is not None:
            self.bias.copy_(conv.bias)

    def query_key_features(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The features the similarity compares: (B, C_in, H, W) input → query and key maps (B, C_f, H, W) each.

        ``C_f`` is C_in (+ 2 with ``coord_channels``), or ``qk_dim`` with learned projections.
        """
        if self.coord_channels:
            coords = coordinate_channels(x.shape[2], x.shape[3], x.device, x.dtype).expand(x.shape[0], -1, -1, -1)
            x = torch.cat([x, coords], dim=1)
        if self.q_proj is None:
            return x, x
        return self.q_proj(x), self.k_proj(x)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"input must be (B, C_in={self.in_channels}, H, W), got {tuple(x.shape)}")
        check_floating_input(x)
        B, _, H, W = x.shape
        N = H * W
        q_map, k_map = self.query_key_features(x)
        rule = selection_rule(effective_selection(self.selection, self.blend_alpha))  # blend's ends: window, all
        options = SelectionOptions(self.num_neighbors, self.similarity, self.window_size, self.blend_alpha)
        if rule.fused:  # selection and aggregation in one call: the fused kernel on CUDA
            candidates = self._sampler(x, N, self.training)
            extra, padding = rule.fused_call((H, W), options)
            tokens = to_tokens(x)
            q_tokens, k_tokens = (tokens, tokens) if q_map is x else (to_tokens(q_map), to_tokens(k_map))
            result = knn_aggregate(  # the same tensor for q, k and v when they are: cast once under autocast
                q_tokens, k_tokens, tokens, self.weight, self.bias,
                num_neighbors=self.num_neighbors, similarity=self.similarity, weighting=self.weighting,
                temperature=self.temperature, groups=self.groups, candidates=candidates, self_first=True,
                backend=self.backend, **extra)
            self._record(result.topk_idx, result.topk_weights, H, W, padding=padding, candidates=candidates)
            return result.out.view(B, self.out_channels, H, W)
        if rule.needs_grid:
            pad = self.window_size // 2
            num_keys = (H + 2 * pad) * (W + 2 * pad)
            if self.num_neighbors > num_keys:
                raise ValueError(f"num_neighbors must be ≤ the {num_keys} cells of the padded {H}×{W} map, "
                                 f"got {self.num_neighbors}")
        out, idx, weights, padding = self._select_aggregate(to_tokens(q_map), to_tokens(k_map), x, self.weight,
                                                            self.bias, rule, options)
        self._record(idx, weights, H, W, padding=padding)
        return out.view(B, self.out_channels, H, W)

    @autocast_aware
    def _select_aggregate(self, q: Tensor, k: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None,
                          rule, options: SelectionOptions) -> tuple[Tensor, Tensor, Tensor, int]:
        """The rules the kernels do not run (window): select, weigh, gather, Conv1D; in the autocast dtype under
        autocast, like :func:`kernels.knn_aggregate`. Returns (out (B, C_out, N), idx, weights, padding)."""
        H, W = x.shape[2:]
        if rule.gathers and self.weighting == "none":  # a convolution: every window cell counts once (METHOD §4.1)
            R, pad = options.window_size, options.window_size // 2
            idx = window_indices(H, W, R, self.num_neighbors, x.device).expand(x.shape[0], 1, H * W, -1)
            note_backend("reference")  # PyTorch, not the fused kernel
            out = F.conv2d(x, window_kernel(weight, R), bias, padding=pad, groups=self.groups).flatten(2)
            return out, idx, torch.ones(idx.shape, dtype=x.dtype, device=x.device), pad
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.weighting == "softmax"):
            neighbors = rule.select(q, k, (H, W), options)
            weights = neighbor_weights(neighbors.topk_scores, self.weighting, self.temperature)
        values = to_tokens(pad_map(x, neighbors.padding))
        out = aggregate_neighbors(values, neighbors.topk_idx, weights, weight, bias, self.groups)
        return out, neighbors.topk_idx, weights, neighbors.padding

    def describe(self, name: str) -> dict:
        """What this layer is, for :func:`convnn.introspect.convnn_layers` (``name``: its qualified name)."""
        return {"kind": "convnn2d", "mixer": "convnn", "record_name": name, "num_neighbors": self.num_neighbors,
                "selection": self.selection, "similarity": self.similarity, "window_size": self.window_size,
                "num_candidates": self.num_candidates, "seed": self.seed,
                "blend_alpha": self.blend_alpha if self.selection == "blend" else None}

    @property
    def seed(self) -> int:
        """The layer's candidate seed (:class:`~convnn.candidates.CandidateSampler`)."""
        return self._sampler.seed

    def extra_repr(self) -> str:
        defaults = {"num_neighbors": 9, "selection": "all", "similarity": "cosine", "weighting": "none",
                    "num_candidates": None, "window_size": 3, "blend_alpha": 0.5, "temperature": 1.0,
                    "coord_channels": False, "qk_dim": None, "candidate_sampling": "batch", "groups": 1, "seed": 0,
                    "backend": "auto"}
        changed = [f"{name}={getattr(self, name)!r}" for name, default in defaults.items()
                   if getattr(self, name) != default]
        return ", ".join([f"{self.in_channels}, {self.out_channels}", *changed] + (
            ["bias=False"] if self.bias is None else []))
