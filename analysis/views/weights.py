"""The aggregation: a layer's learned Conv1D kernel over rank slots, and each neighbour's share of a query's output.

METHOD §2 step 3: ``out[:, i] = bias + Σ_t W[:, :, t] · ρ_t · v[idx_t]``, tap ``t`` weighing "the t-th nearest
neighbour". :func:`neighbor_contributions` splits a query's output into those K terms, using the neighbours the layer
really selected (:func:`convnn.record_neighbors`), so the terms plus the bias equal the layer's own output. The
values and the output of a layer are computed once per (model, image, layer); a click only gathers its K terms.

Also the λ mix of a hybrid layer (:func:`branch_mix`): how much of the 1×1 mix output comes from each branch, per
pixel (METHOD §5).

The hybrid layer concatenates ``z = [z_knn ; z_conv]`` (ConvNN channels first) and mixes with a 1×1 convolution
``y = M z + b``. Splitting ``M = [M_knn  M_conv]`` gives ``y − b = M_knn z_knn + M_conv z_conv``; the ConvNN share of a
pixel is ``‖M_knn z_knn‖ / (‖M_knn z_knn‖ + ‖M_conv z_conv‖)`` (L2 over output channels), in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from convnn.candidates import keyed_draws
from convnn.functional import pad_map, to_tokens

from ..session.caching import bounded_cache
from ..session.image_decode import InputImage
from ..session.inputs import KNOB_NAMES
from ..session.models import LoadedModel
from ..session.selections import LAYER_RULE, RuleOptions, rule_selection
from ..session.traces import (
    LayerInfo,
    check_finite,
    effective_draw,
    knn_branch,
    layer_conv,
    layer_module,
    query_cell,
    trace_image,
)

__all__ = [
    "AggregationKernel",
    "BranchMix",
    "Contributions",
    "aggregation_kernel",
    "branch_mix",
    "contribution_norms",
    "mix_summary",
    "neighbor_contributions",
]


_LAYER_OUTPUT_CACHE_SIZE = 32  # (model, image, layer) values + outputs kept; each ≈ 2 × N × C floats


@dataclass(frozen=True)
class AggregationKernel:
    """A layer's aggregation kernel summarised over rank slots.

    Attributes:
        kernel (np.ndarray): (C_out, K) float32: the L2 norm of ``W[o, :, t]`` over input channels for a full
            Conv1D (≥ 0), or the signed tap ``W[o, 0, t]`` for a depthwise one (attention).
        slot_norms (np.ndarray): (K,) float32 Frobenius norm of ``W[:, :, t]``: how much the t-th neighbour matters.
        signed (bool): whether ``kernel`` holds signed weights (depthwise) rather than norms.
        description (str): what the kernel is (e.g. "ConvNN branch Conv1D, 64 × 64 × 9").
    """

    kernel: np.ndarray
    slot_norms: np.ndarray
    signed: bool
    description: str


def _kernel_tensor(loaded: LoadedModel, layer_info: LayerInfo) -> tuple[Tensor, str]:
    module = layer_module(loaded.model, layer_info)
    if layer_info.is_attention:
        if layer_info.dense:
            raise ValueError(f"{layer_info.name} is plain multi-head attention: it has no rank-slot kernel (a KVT or "
                             "ConvNN-attention layer has one)")
        kind = "KVT (fixed ones)" if layer_info.mixer == "kvt" else "ConvNN-attention depthwise Conv1D"
        return module.weight.detach(), kind
    if layer_info.conv_only:
        weight = layer_conv(module, layer_info).weight.detach().flatten(2)  # taps in raster order = rank slots (§4.1)
        size = f"{layer_info.window_size}×{layer_info.window_size}"
        return weight, (f"{size} conv branch" if layer_info.is_hybrid else f"{size} convolution") + (
            ", taps in raster order (= window selection's rank slots)")
    return knn_branch(module, layer_info).weight.detach(), "ConvNN branch Conv1D"


def aggregation_kernel(loaded: LoadedModel, layer: str) -> AggregationKernel:
    """The learned kernel of ``layer`` over rank slots.

    Raises:
        ValueError: unknown layer, or an MHSA layer (no kernel); a kernel or norm that is not finite (weights whose
            norms overflow float32 pass the load's check), refused naming the model
            (:func:`~analysis.session.traces.check_finite`).
    """
    layer_info = loaded.layer_info(layer)
    weight, kind = _kernel_tensor(loaded, layer_info)
    weight = weight.float().cpu()  # (C_out, C_in / groups, K)
    signed = weight.shape[1] == 1
    kernel, slot_norms = weight[:, 0] if signed else weight.norm(dim=1), weight.norm(dim=(0, 1))
    check_finite(loaded, {f"the aggregation kernel of {layer}": kernel,
                          f"the rank slots' norms of {layer}": slot_norms}, on_image=False)
    shape = " × ".join(str(s) for s in weight.shape)
    return AggregationKernel(kernel.numpy(), slot_norms.numpy(), signed, f"{kind}, {shape}")


@dataclass(frozen=True)
class Contributions:
    """One query's output split over its K selected neighbours (before any output projection or 1×1 mix).

    Attributes:
        cells (np.ndarray): (K, 2) int64 neighbour cells, rank order; ``is_prefix`` (K,) bool marks CLS.
        vectors (np.ndarray): (K, C) float32, ``W[:, :, t] · ρ_t · v[idx_t]`` (C = the branch's output channels,
            or the head's d channels for attention).
        norms (np.ndarray): (K,) float32 L2 norm of each vector.
        bias (np.ndarray): (C,) float32 (zeros without a bias).
        output (np.ndarray): (C,) float32 the layer's own output at the query (recomputed by the layer), so that
            ``vectors.sum(0) + bias ≈ output``.
    """

    cells: np.ndarray
    is_prefix: np.ndarray
    vectors: np.ndarray
    norms: np.ndarray
    bias: np.ndarray
    output: np.ndarray

    @property
    def max_abs_residual(self) -> float:
        """``max |Σ_t vectors[t] + bias − output|`` over channels: ≈ 0 (float32 rounding) when the split is exact."""
        return float(np.abs(self.vectors.sum(0) + self.bias - self.output).max())


def _attention_output(module: torch.nn.Module, x: Tensor) -> Tensor:
    """The attention layer's own aggregated output before its projection, (1, N, dim): a fresh forward call."""
    captured: list[Tensor] = []
    handle = module.proj.register_forward_pre_hook(lambda _, args: captured.append(args[0]))
    try:
        module(x)
    finally:
        handle.remove()
    return captured[0]


@bounded_cache(_LAYER_OUTPUT_CACHE_SIZE)
def _values_and_output(loaded: LoadedModel, image: InputImage, layer: str, draw: int) -> tuple[Tensor, Tensor]:
    """What ``layer`` gathers and what it outputs on ``image`` in eval draw ``draw``: one layer call per (model,
    image, layer, draw)

    Attention: values (1, h, N, d) and the output before the projection (1, N, dim). Maps: the zero-padded input
    tokens (1, 1, N_padded, C_in) and the ConvNN branch's output (1, C_out, H_out, W_out).
    """
    layer_info = loaded.layer_info(layer)
    trace = trace_image(loaded, image, draw)
    x, module = trace.inputs[layer_info.name], layer_module(loaded.model, layer_info)
    with torch.no_grad(), loaded.lock, keyed_draws(trace.sample_keys):  # the candidates it drew in the model
        if layer_info.is_attention:
            _, _, v = module.project_qkv(x)
            return v, _attention_output(module, x)
        return to_tokens(pad_map(x, trace.records[layer_info.name].padding)), knn_branch(module, layer_info)(x)


_CONTRIBUTION_CHUNK = 256  # queries whose K contribution vectors are held at once (K·C floats each)


def _contribution_vectors(loaded: LoadedModel, image: InputImage, layer_info: LayerInfo, head: int, queries: np.ndarray,
                          draw: int) -> tuple[Tensor, Tensor, Tensor]:
    """``W[:, :, t] · ρ_t · v[idx_t]`` for each of ``queries`` (raster indices of the grid) and each of its K
    recorded neighbours: (Q, K, C) float32, with the bias (C,) and the layer's own output at the queries (Q, C); a
    map layer's cell has its output's (:meth:`~convnn.introspect.LayerInfo.cell_outputs`); in eval draw ``draw``."""
    record = trace_image(loaded, image, draw).records[layer_info.name]
    values, layer_output = _values_and_output(loaded, image, layer_info.name, draw)
    module = layer_module(loaded.model, layer_info)
    with torch.no_grad():
        if layer_info.is_attention:
            tokens = torch.as_tensor(queries) + layer_info.num_prefix_tokens
            idx, rho = record.topk_idx[0, head, tokens], record.topk_weights[0, head, tokens]  # (Q, K)
            d = module.head_dim
            taps = module.weight[head * d:(head + 1) * d, 0].T  # (K, d)
            vectors = taps * rho[..., None] * values[0, head, idx]  # (Q, K, d)
            return vectors.float(), torch.zeros(d), layer_output[0, tokens, head * d:(head + 1) * d].float()
        knn = knn_branch(module, layer_info)
        outputs = layer_info.cell_outputs()[queries].to(record.topk_idx.device)  # the queries' outputs
        idx, rho = record.topk_idx[0, 0, outputs], record.topk_weights[0, 0, outputs]  # (Q, K)
        groups, (c_out, c_in_group, k) = knn.groups, knn.weight.shape
        neighbors = (rho[..., None] * values[0, 0, idx]).unflatten(-1, (groups, c_in_group))  # (Q, K, G, C_in/G)
        weight = knn.weight.view(groups, c_out // groups, c_in_group, k)  # (G, C_out/G, C_in/G, K)
        vectors = torch.einsum("qkgc,gock->qkgo", neighbors, weight).flatten(2)  # (Q, K, C_out)
        bias = knn.bias if knn.bias is not None else torch.zeros(c_out)
        return vectors.float(), bias.float(), layer_output[0].flatten(1)[:, outputs].T.float()


def _check_selects(layer_info: LayerInfo) -> None:
    if layer_info.record_name is None:
        raise ValueError(f"{layer_info.name} selects no neighbours ({layer_info.selection}): open a layer with a "
                         "ConvNN branch or k-NN attention")


def neighbor_contributions(loaded: LoadedModel, image: InputImage, layer: str, query_px: tuple[int, int],
                           head: int = 0) -> Contributions:
    """Each selected neighbour's contribution to the query's output in ``layer`` (the layer's own selection).

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        layer (str): layer with a ConvNN branch or k-NN attention.
        query_px (tuple[int, int]): ``(row_px, col_px)`` in model-input pixels.
        head (int): attention head, in [0, num_heads − 1] (0 for maps). Default: 0

    Returns:
        Contributions: per neighbour vectors and norms, the bias and the layer's own output at the query.

    Raises:
        ValueError: a layer without ConvNN selection (MHSA, conv-only hybrid), a head out of range, or a pixel
            outside the image.
    """
    layer_info = loaded.layer_info(layer)
    _check_selects(layer_info)
    head = layer_info.check_head(head, KNOB_NAMES["head"])
    row, col = query_cell(layer_info, *query_px)
    index = row * layer_info.width + col
    vectors, bias, output = _contribution_vectors(loaded, image, layer_info, head, np.array([index]), 0)
    selection = rule_selection(loaded, image, layer, LAYER_RULE, RuleOptions(head=head))
    return Contributions(selection.cells[index], selection.is_prefix[index], vectors[0].cpu().numpy(),
                         vectors[0].norm(dim=1).cpu().numpy(), bias.cpu().numpy(), output[0].cpu().numpy())


def contribution_norms(loaded: LoadedModel, image: InputImage, layer: str, head: int = 0, draw: int = 0
                       ) -> np.ndarray:
    """The L2 norm of every query's K neighbour contributions in ``layer`` (the layer's own selection; cached).

    Row ``i`` is :attr:`Contributions.norms` of the query at raster cell ``i`` (:func:`neighbor_contributions`),
    computed for all H·W queries at once, :data:`_CONTRIBUTION_CHUNK` at a time; ``draw`` is the eval draw of a
    model with random candidates (METHOD §3b).

    Returns:
        np.ndarray: (H·W, K) float32, ≥ 0, rank order.

    Raises:
        ValueError: as :func:`neighbor_contributions`, or a ``draw`` that is not an integer ≥ 0.
    """
    return _contribution_norms(loaded, image, layer, head, effective_draw(loaded, draw))


@bounded_cache(_LAYER_OUTPUT_CACHE_SIZE)
def _contribution_norms(loaded: LoadedModel, image: InputImage, layer: str, head: int, draw: int) -> np.ndarray:
    """:func:`contribution_norms` for an effective ``draw``."""
    layer_info = loaded.layer_info(layer)
    _check_selects(layer_info)
    head = layer_info.check_head(head, KNOB_NAMES["head"])
    queries = np.arange(layer_info.height * layer_info.width)
    return np.concatenate([
        _contribution_vectors(loaded, image, layer_info, head, chunk, draw)[0].norm(dim=-1).cpu().numpy()
        for chunk in np.array_split(queries, max(1, -(-len(queries) // _CONTRIBUTION_CHUNK)))])


@dataclass(frozen=True)
class BranchMix:
    """Per-pixel branch shares of a hybrid layer's output.

    Attributes:
        branch_ratio (float): λ.
        knn_channels (int): channels of the ConvNN branch (``round(λ·C_out)``).
        conv_channels (int): channels of the convolution branch.
        knn_norm (np.ndarray): (H, W) float32 ``‖M_knn z_knn‖`` per cell of the layer's input grid (a strided
            layer's cell: its output's, :meth:`~convnn.introspect.LayerInfo.cell_outputs`).
        conv_norm (np.ndarray): (H, W) float32 ``‖M_conv z_conv‖`` per cell.
        share (np.ndarray): (H, W) float32 ConvNN share in [0, 1] (0.5 where both norms are 0).
    """

    branch_ratio: float
    knn_channels: int
    conv_channels: int
    knn_norm: np.ndarray
    conv_norm: np.ndarray
    share: np.ndarray


def branch_mix(loaded: LoadedModel, image: InputImage, layer: str, draw: int = 0) -> BranchMix:
    """The ConvNN vs convolution share of ``layer``'s 1×1 mix output at every pixel (cached), in eval draw ``draw``
    of a model with random candidates (METHOD §3b): the branches run on the candidates the layer drew in the model.

    Raises:
        ValueError: ``layer`` is not a hybrid layer, or a ``draw`` that is not an integer ≥ 0.
    """
    return _branch_mix(loaded, image, layer, effective_draw(loaded, draw))


@bounded_cache(32)
def _branch_mix(loaded: LoadedModel, image: InputImage, layer: str, draw: int) -> BranchMix:
    """:func:`branch_mix` for an effective ``draw``."""
    layer_info = loaded.layer_info(layer)
    if not layer_info.is_hybrid:
        raise ValueError(f"{layer_info.name} is not a hybrid layer: the λ mix exists only in HybridConvNN2d layers")
    module = layer_module(loaded.model, layer_info)
    trace = trace_image(loaded, image, draw)
    x = trace.inputs[layer_info.name]
    with torch.no_grad(), loaded.lock, keyed_draws(trace.sample_keys):  # the candidates it drew in the model
        z = module.branches(x)  # (1, C_out, H, W), ConvNN channels first
        split = module.knn_channels
        weight = module.mix.weight  # (C_out, C_out, 1, 1)
        knn_part = F.conv2d(z[:, :split], weight[:, :split]) if split else torch.zeros_like(z)
        conv_part = F.conv2d(z[:, split:], weight[:, split:]) if module.conv_channels else torch.zeros_like(z)
        knn_norm, conv_norm = knn_part.norm(dim=1)[0], conv_part.norm(dim=1)[0]
        total = knn_norm + conv_norm
        share = torch.where(total > 0, knn_norm / total.clamp_min(torch.finfo(total.dtype).tiny), 0.5)
        outputs = layer_info.cell_outputs().to(share.device)
        knn_norm, conv_norm, share = (t.flatten()[outputs].view(layer_info.height, layer_info.width).cpu().numpy()
                                      for t in (knn_norm, conv_norm, share))
    return BranchMix(module.branch_ratio, module.knn_channels, module.conv_channels, knn_norm, conv_norm, share)


def mix_summary(mix: BranchMix) -> str:
    """The channel split and the ConvNN share over the image (mean, range), as text."""
    return (f"λ = {mix.branch_ratio}: {mix.knn_channels} ConvNN channels + {mix.conv_channels} conv channels. "
            f"ConvNN share of the mix output over this image: mean {100 * mix.share.mean():.1f}%, "
            f"{100 * mix.share.min():.1f}–{100 * mix.share.max():.1f}% (the clicked cell's share is in the "
            "explorer).")
