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
from ..functional import (
    WindowGeometry,
    coordinate_channels,
    pad_map,
    to_tokens,
    window_geometry,
    window_indices,
    window_kernel,
)
from ..recording import Recordable
from ..selection import SelectionOptions, check_window_neighbors, effective_selection, selection_rule
from ..validation import check_bool, check_choice, check_floating_input, check_int, check_positive, check_ratio

__all__ = ["ConvNN2d"]


class ConvNN2d(Recordable):
    """Each pixel aggregates its K selected neighbours with a Conv1D over rank slots (rank 0 = the pixel itself).

    Implements METHOD §2–3 on a 2-D map of N = H·W tokens. For query pixel ``i`` the layer scores candidate
    pixels ``j``, keeps the top K (the query itself forced to rank 0, ties to the lower index), weighs them by ρ,
    and applies ``Conv1d(C_in, C_out, kernel_size=K, stride=K)`` to the gathered ``(B, C_in, N·K)`` sequence, so tap
    ``t`` of the kernel weighs "the t-th nearest neighbour". With ``selection="window"`` and K = R² it equals
    ``Conv2d(kernel_size=R, padding=R // 2)`` (METHOD §4.1–4.2, see :meth:`load_conv2d_weight`).

    It takes ``nn.Conv2d``'s ``kernel_size``, ``stride``, ``padding``, ``dilation`` and ``padding_mode="zeros"``
    (METHOD §3a, :class:`~convnn.functional.WindowGeometry`): output cell ``o`` has the query ``s·o − p + d·(R −
    1)/2`` (the centre of the window a convolution would read there), so the output is (H_out, W_out) as
    ``nn.Conv2d``'s; the window rule reads that convolution's window, and with K = R² equals it whatever the
    geometry. The default ``padding="same"`` (p = d·(R − 1)/2, also with a stride) differs from ``nn.Conv2d``'s 0:
    it is this layer's behaviour from before strides.

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
        num_neighbors (int, optional): K, ≥ 1; K ≤ N at run time, K ≤ R² for ``"window"``, K ≤ r for ``"random"``.
            Default: None (R², 9 for the default window: the whole window, as a convolution)
        selection (str): ``"all"``, ``"random"``, ``"window"`` or ``"blend"``. Default: ``"all"``
        similarity (str): ``"cosine"``, ``"dot"`` (q·k/√d) or ``"euclidean"`` (−‖q − k‖²). Default: ``"cosine"``
        weighting (str): ρ: ``"none"`` (pure gather), ``"softmax"`` (over the K selected scores) or ``"uniform"``
            (1/K). Default: ``"none"``
        num_candidates (int, optional): r for ``"random"``, ≥ K. Default: None
        window_size (int, optional): R, odd: the window of ``"window"`` and ``"blend"``, and the window whose
            centre is each output's query. Default: None (``kernel_size``, else 3)
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
        kernel_size (int or tuple[int, int], optional): ``nn.Conv2d``'s name for R (a pair must be equal); if both
            are given they must agree. Default: None
        stride (int or tuple[int, int]): s: queries on the strided grid, one per output cell. Default: 1
        padding (int, tuple[int, int] or str): p, zero cells on every side: where the queries sit and the zero
            tokens ``"window"`` reads (and the candidates of ``candidate_padding``); ``"same"`` (p = d·(R − 1)/2,
            with any stride) or ``"valid"`` (0). Default: ``"same"``
        dilation (int or tuple[int, int]): d: spacing of the window's cells (``"window"``; ``"blend"`` needs 1),
            and with R, s, p where the queries sit. Default: 1
        padding_mode (str): ``"zeros"`` only (padding cells are zero tokens). Default: ``"zeros"``
        candidate_padding (bool): the p zero cells on every side are candidates of ``"all"`` and ``"random"`` too,
            as in the authors' layer, which pads its input before selecting: a zero token scores 0 under cosine and
            −‖q‖² under euclidean, so it changes the selections of queries whose features score lower (METHOD
            §3a). Needs p ≥ 1 and a rule without a grid. Default: False (the map's own tokens only)
        conv_shortcut (bool): run ``"window"`` with ρ = ``"none"`` as the ``F.conv2d`` it equals (METHOD §4.1–4.2:
            one call, no (B, C_in, N·K) gather); False runs it as every other rule, select → gather → Conv1D over
            rank slots, which is how the equivalence demo shows the theorem rather than the shortcut. The output is
            the same either way (up to rounding). Default: True

    Shape:
        Input (B, C_in, H, W), float32, bfloat16 or float16 (float64 on the reference) → output (B, C_out, H_out,
        W_out) (H, W with the defaults), same dtype; inside ``torch.autocast`` the autocast dtype, computed from
        inputs and weights in that dtype with fp32 scores and sums, as ``nn.Conv2d`` (:mod:`kernels.autocast`).
        Internally scores are (B, N, N) or (B, N, r + 1) on the reference (never materialised by the fused kernel)
        and neighbour indices (B, 1, N_out, K) int64; indices carry no gradient. ``"all"``, ``"random"`` and
        ``"blend"`` select for every cell of the map (with ``candidate_padding``, of the padded map) and keep the
        queries' outputs: with a stride s their selection costs s² times what the queries alone would (the fused
        kernel selects for every token of one map).

    Attributes:
        weight (Tensor): (C_out, C_in / groups, K), initialised like ``nn.Conv1d`` (Kaiming-uniform, a = √5).
        bias (Tensor): (C_out,) or None.

    Raises:
        ValueError: an argument outside its range (the message names it and the value received), ``qk_dim``
            without softmax weighting, ``kernel_size`` and ``window_size`` that differ, a padding that puts queries
            in the zero padding for a rule that selects by features (unless ``candidate_padding``), a non-4-D input or
            one with the wrong channel count, a window that does not fit the padded input, or K larger than the
            number of candidates of the input.

    Example:
        >>> ConvNN2d(16, 32, selection="window")(torch.randn(2, 16, 8, 8)).shape
        torch.Size([2, 32, 8, 8])
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        num_neighbors: int | None = None,
        selection: str = "all",
        similarity: str = "cosine",
        weighting: str = "none",
        num_candidates: int | None = None,
        window_size: int | None = None,
        blend_alpha: float = 0.5,
        temperature: float = 1.0,
        coord_channels: bool = False,
        qk_dim: int | None = None,
        candidate_sampling: str = "batch",
        groups: int = 1,
        bias: bool = True,
        seed: int = 0,
        backend: str = "auto",
        *,
        kernel_size: int | tuple[int, int] | None = None,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = "same",
        dilation: int | tuple[int, int] = 1,
        padding_mode: str = "zeros",
        candidate_padding: bool = False,
        conv_shortcut: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        rule = selection_rule(selection)  # one of convnn.selection.SELECTION_RULES
        check_choice("similarity", similarity, SIMILARITIES)
        check_choice("weighting", weighting, WEIGHTINGS)
        check_choice("backend", backend, BACKENDS)
        check_int("in_channels", in_channels, 1)
        for flag, value in (("coord_channels", coord_channels), ("bias", bias),
                            ("candidate_padding", candidate_padding), ("conv_shortcut", conv_shortcut)):
            check_bool(flag, value)
        check_int("out_channels", out_channels, 1)
        if window_size is not None:
            check_int("window_size", window_size, 1)
            if window_size % 2 == 0:
                raise ValueError(f"window_size must be an odd integer ≥ 1, got {window_size}")
        geometry = window_geometry(kernel_size if kernel_size is not None else window_size or 3, stride, padding,
                                   dilation, padding_mode)
        if window_size is not None and window_size != geometry.window_size:
            raise ValueError(f"kernel_size and window_size both name R: got {kernel_size!r} and {window_size}")
        window_size = geometry.window_size
        num_neighbors = window_size**2 if num_neighbors is None else num_neighbors
        check_int("num_neighbors", num_neighbors, 1)
        check_ratio("blend_alpha", blend_alpha)
        effective = selection_rule(effective_selection(selection, blend_alpha))
        check_window_neighbors(effective.name, num_neighbors, window_size)
        _check_geometry(effective, geometry, candidate_padding)
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
        self.backend, self.geometry, self.candidate_padding = backend, geometry, candidate_padding
        self.conv_shortcut = conv_shortcut
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

        Together with ``selection="window"``, K = R², the same ``groups`` and the same stride, padding and dilation
        (:attr:`geometry`), the layer then computes exactly ``conv`` (METHOD §4.1–4.2, §3a).

        Raises:
            ValueError: ``conv``'s kernel, channels, groups, bias, stride, padding or dilation do not match this
                layer.
        """
        expected = (self.out_channels, self.in_channels // self.groups, self.window_size, self.window_size)
        if tuple(conv.weight.shape) != expected or conv.groups != self.groups:
            raise ValueError(f"conv weight must be {expected} with groups={self.groups}, "
                             f"got {tuple(conv.weight.shape)} with groups={conv.groups}")
        geometry = window_geometry(conv.kernel_size, conv.stride, conv.padding, conv.dilation, conv.padding_mode)
        if geometry != self.geometry:
            raise ValueError(f"conv's stride, padding and dilation must be this layer's {self.geometry}, got "
                             f"{geometry}")
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

    @property
    def stride(self) -> int:
        """s (:attr:`geometry`)."""
        return self.geometry.stride

    @property
    def padding(self) -> int:
        """p, zero cells on every side (:attr:`geometry`)."""
        return self.geometry.padding

    @property
    def dilation(self) -> int:
        """d (:attr:`geometry`)."""
        return self.geometry.dilation

    def candidate_grid(self, height: int, width: int) -> tuple[int, int]:
        """The map ``"all"``, ``"random"`` and ``"blend"`` select on for an H×W input: the input itself, or with
        ``candidate_padding`` the input zero-padded by p."""
        pad = self.padding if self.candidate_padding else 0
        return height + 2 * pad, width + 2 * pad

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"input must be (B, C_in={self.in_channels}, H, W), got {tuple(x.shape)}")
        check_floating_input(x)
        B, _, H, W = x.shape
        out_h, out_w = self.geometry.output_size(H, W)
        q_map, k_map = self.query_key_features(x)
        rule = selection_rule(effective_selection(self.selection, self.blend_alpha))  # blend's ends: window, all
        options = SelectionOptions(self.num_neighbors, self.similarity, self.window_size, self.blend_alpha,
                                   geometry=self.geometry)
        queries = None if self.geometry.every_cell else torch.stack(torch.meshgrid(
            self.geometry.query_positions(H), self.geometry.query_positions(W), indexing="ij"), -1).view(-1, 2)
        if rule.fused:  # selection and aggregation in one call: the fused kernel on CUDA
            out, idx, weights, padding, candidates = self._fused(x, q_map, k_map, rule, options)
            self._record(idx, weights, H, W, padding=padding, candidates=candidates, queries=queries)
            return out.view(B, self.out_channels, out_h, out_w)
        if rule.needs_grid:
            pad = self.window_size // 2
            num_keys = (H + 2 * pad) * (W + 2 * pad)
            if self.num_neighbors > num_keys:
                raise ValueError(f"num_neighbors must be ≤ the {num_keys} cells of the padded {H}×{W} map, "
                                 f"got {self.num_neighbors}")
        out, idx, weights, padding = self._select_aggregate(to_tokens(q_map), to_tokens(k_map), x, self.weight,
                                                            self.bias, rule, options)
        self._record(idx, weights, H, W, padding=padding, queries=queries)
        return out.view(B, self.out_channels, out_h, out_w)

    def _fused(self, x: Tensor, q_map: Tensor, k_map: Tensor, rule, options: SelectionOptions
               ) -> tuple[Tensor, Tensor, Tensor, int, Tensor | None]:
        """A rule :func:`kernels.knn_aggregate` runs, on every cell of the candidate map (:meth:`candidate_grid`),
        then the queries' rows. Returns (out (B, C_out, N_out), idx, weights, padding of idx, candidates)."""
        pad = self.padding if self.candidate_padding else 0
        if pad:  # the padding's zero tokens are candidates (and queries of outputs that are dropped)
            shared = q_map is x
            x = pad_map(x, pad)
            q_map, k_map = (x, x) if shared else (pad_map(q_map, pad), pad_map(k_map, pad))
        H, W = x.shape[2:]
        candidates = self._sampler(x, H * W, self.training)
        extra, padding = rule.fused_call((H, W), options)
        tokens = to_tokens(x)
        q_tokens, k_tokens = (tokens, tokens) if q_map is x else (to_tokens(q_map), to_tokens(k_map))
        result = knn_aggregate(  # the same tensor for q, k and v when they are: cast once under autocast
            q_tokens, k_tokens, tokens, self.weight, self.bias,
            num_neighbors=self.num_neighbors, similarity=self.similarity, weighting=self.weighting,
            temperature=self.temperature, groups=self.groups, candidates=candidates, self_first=True,
            backend=self.backend, **extra)
        out, idx, weights = result
        if pad or not self.geometry.every_cell:  # the queries' rows (METHOD §3a)
            rows = self.geometry.query_indices(H - 2 * pad, W - 2 * pad, pad, x.device)
            out, idx, weights = out[:, :, rows], idx[:, :, rows], weights[:, :, rows]
        return out, idx, weights, padding + pad, candidates

    @autocast_aware
    def _select_aggregate(self, q: Tensor, k: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None,
                          rule, options: SelectionOptions) -> tuple[Tensor, Tensor, Tensor, int]:
        """The rules the kernels do not run (window): select, weigh, gather, Conv1D; in the autocast dtype under
        autocast, like :func:`kernels.knn_aggregate`. Returns (out (B, C_out, N_out), idx, weights, padding)."""
        H, W = x.shape[2:]
        if self.runs_as_conv2d(rule):  # a convolution: every window cell counts once (METHOD §4.1)
            geometry = self.geometry
            idx = window_indices(H, W, self.window_size, self.num_neighbors, x.device, geometry)
            idx = idx.expand(x.shape[0], 1, -1, -1)
            note_backend("reference")  # PyTorch, not the fused kernel
            out = F.conv2d(x, window_kernel(weight, self.window_size), bias, stride=geometry.stride,
                           padding=geometry.padding, dilation=geometry.dilation, groups=self.groups).flatten(2)
            return out, idx, torch.ones(idx.shape, dtype=x.dtype, device=x.device), geometry.padding
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.weighting == "softmax"):
            neighbors = rule.select(q, k, (H, W), options)
            weights = neighbor_weights(neighbors.topk_scores, self.weighting, self.temperature)
        values = to_tokens(pad_map(x, neighbors.padding))
        out = aggregate_neighbors(values, neighbors.topk_idx, weights, weight, bias, self.groups)
        return out, neighbors.topk_idx, weights, neighbors.padding

    def runs_as_conv2d(self, rule=None) -> bool:
        """Whether the forward computes this layer as ``F.conv2d`` with :func:`~convnn.functional.window_kernel`
        (``rule``, default the rule it runs, gathers whatever the scores, ρ = ``"none"`` and :attr:`conv_shortcut`)
        rather than selecting, gathering and applying the Conv1D over rank slots."""
        rule = rule or selection_rule(effective_selection(self.selection, self.blend_alpha))
        return rule.gathers and self.weighting == "none" and self.conv_shortcut

    def describe(self, name: str) -> dict:
        """What this layer is, for :func:`convnn.introspect.convnn_layers` (``name``: its qualified name)."""
        return {"kind": "convnn2d", "mixer": "convnn", "record_name": name, "num_neighbors": self.num_neighbors,
                "selection": self.selection, "similarity": self.similarity, "window_size": self.window_size,
                "num_candidates": self.num_candidates, "seed": self.seed,
                "blend_alpha": self.blend_alpha if self.selection == "blend" else None, "stride": self.stride,
                "dilation": self.dilation, "padding": self.padding}

    @property
    def seed(self) -> int:
        """The layer's candidate seed (:class:`~convnn.candidates.CandidateSampler`)."""
        return self._sampler.seed

    def extra_repr(self) -> str:
        defaults = {"num_neighbors": 9, "selection": "all", "similarity": "cosine", "weighting": "none",
                    "num_candidates": None, "window_size": 3, "blend_alpha": 0.5, "temperature": 1.0,
                    "coord_channels": False, "qk_dim": None, "candidate_sampling": "batch", "groups": 1, "seed": 0,
                    "backend": "auto", "stride": 1, "dilation": 1, "candidate_padding": False,
                    "conv_shortcut": True}
        changed = [f"{name}={getattr(self, name)!r}" for name, default in defaults.items()
                   if getattr(self, name) != default]
        if not self.geometry.every_cell or self.dilation != 1:
            changed.append(f"padding={self.padding}")
        return ", ".join([f"{self.in_channels}, {self.out_channels}", *changed] + (
            ["bias=False"] if self.bias is None else []))


def _check_geometry(rule, geometry: WindowGeometry, candidate_padding: bool) -> None:
    """Raise ``ValueError`` for a geometry ``rule`` (the rule a layer runs) cannot use (METHOD §3a): a rule that
    selects by features needs its queries on its candidate map, ``"blend"`` an undilated window, and
    ``candidate_padding`` a rule without a grid and some padding."""
    if candidate_padding and (rule.needs_grid or geometry.padding == 0):
        raise ValueError(f"candidate_padding makes the zero padding candidates of 'all' and 'random' (padding ≥ 1); "
                         f"got selection {rule.name!r} with padding={geometry.padding}")
    if rule.name == "blend" and geometry.dilation != 1:
        raise ValueError(f"selection='blend' needs dilation=1 (its spatial score is the undilated window's), got "
                         f"{geometry.dilation}")
    if not rule.gathers and not candidate_padding and geometry.first_query < 0:
        raise ValueError(f"padding={geometry.padding} puts queries {-geometry.first_query} cells into the zero "
                         f"padding, which has no features to select by for selection={rule.name!r}: use padding ≤ "
                         f"{geometry.padding + geometry.first_query} or candidate_padding=True")
