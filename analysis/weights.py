"""The aggregation: a layer's learned Conv1D kernel over rank slots, and each neighbour's share of a query's output.

METHOD §2 step 3: ``out[:, i] = bias + Σ_t W[:, :, t] · ρ_t · v[idx_t]``, tap ``t`` weighing "the t-th nearest
neighbour". :func:`neighbor_contributions` splits a query's output into those K terms, using the neighbours the layer
really selected (:func:`convnn.record_neighbors`), so the terms plus the bias equal the layer's own output. The
values and the output of a layer are computed once per (model, image, layer); a click only gathers its K terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from convnn.candidates import keyed_draws
from convnn.functional import pad_map, to_tokens

from .caching import bounded_cache
from .checkpoints import LoadedModel
from .images import InputImage
from .neighbors import LAYER_RULE, RuleOptions, rule_selection
from .probes import ProbeLayer, knn_branch, probe_module, query_cell
from .tracing import trace_image

__all__ = ["AggregationKernel", "Contributions", "aggregation_kernel", "neighbor_contributions"]

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


def _kernel_tensor(loaded: LoadedModel, probe: ProbeLayer) -> tuple[Tensor, str]:
    module = probe_module(loaded.model, probe)
    if probe.kind == "attention":
        if probe.mixer == "mhsa":
            raise ValueError(f"{probe.name} is plain multi-head attention: it has no rank-slot kernel (a KVT or "
                             "ConvNN-attention layer has one)")
        kind = "KVT (fixed ones)" if probe.mixer == "kvt" else "ConvNN-attention depthwise Conv1D"
        return module.weight.detach(), kind
    if probe.mixer == "conv":
        weight = module.conv.weight.detach().flatten(2)  # taps in raster order = window rank slots (METHOD §4.1)
        return weight, "3×3 conv branch, taps in raster order (= window selection's rank slots)"
    return knn_branch(module, probe).weight.detach(), "ConvNN branch Conv1D"


def aggregation_kernel(loaded: LoadedModel, layer: str) -> AggregationKernel:
    """The learned kernel of ``layer`` over rank slots.

    Raises:
        ValueError: unknown layer, or an MHSA layer (no kernel).
    """
    probe = loaded.probe(layer)
    weight, kind = _kernel_tensor(loaded, probe)
    weight = weight.float().cpu()  # (C_out, C_in / groups, K)
    signed = weight.shape[1] == 1
    kernel = weight[:, 0] if signed else weight.norm(dim=1)
    shape = " × ".join(str(s) for s in weight.shape)
    return AggregationKernel(kernel.numpy(), weight.norm(dim=(0, 1)).numpy(), signed, f"{kind}, {shape}")


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
def _values_and_output(loaded: LoadedModel, image: InputImage, layer: str) -> tuple[Tensor, Tensor]:
    """What ``layer`` gathers and what it outputs on ``image``: one layer call per (model, image, layer).

    Attention: values (1, h, N, d) and the output before the projection (1, N, dim). Maps: the zero-padded input
    tokens (1, 1, N_padded, C_in) and the ConvNN branch's output (1, C_out, H, W).
    """
    probe = loaded.probe(layer)
    trace = trace_image(loaded, image)
    x, module = trace.inputs[probe.name], probe_module(loaded.model, probe)
    with torch.no_grad(), loaded.lock, keyed_draws(trace.sample_keys):  # the candidates it drew in the model
        if probe.kind == "attention":
            _, _, v = module.project_qkv(x)
            return v, _attention_output(module, x)
        return to_tokens(pad_map(x, trace.records[probe.name].padding)), knn_branch(module, probe)(x)


def neighbor_contributions(loaded: LoadedModel, image: InputImage, layer: str, query_px: tuple[int, int],
                           head: int = 0) -> Contributions:
    """Each selected neighbour's contribution to the query's output in ``layer`` (the layer's own selection).

    Args:
        loaded (LoadedModel): the model.
        image (InputImage): the image.
        layer (str): probe layer with a ConvNN branch or k-NN attention.
        query_px (tuple[int, int]): ``(row_px, col_px)`` in model-input pixels.
        head (int): attention head, in [0, num_heads − 1] (0 for maps). Default: 0

    Returns:
        Contributions: per neighbour vectors and norms, the bias and the layer's output at the query.

    Raises:
        ValueError: a layer without ConvNN selection (MHSA, conv-only hybrid), a head out of range, or a pixel
            outside the image.
    """
    probe = loaded.probe(layer)
    if probe.record_name is None:
        raise ValueError(f"{probe.name} selects no neighbours ({probe.selection}): open a layer with a ConvNN branch "
                         "or k-NN attention")
    head = probe.check_head(head)
    row, col = query_cell(probe, *query_px)
    index = row * probe.width + col
    record = trace_image(loaded, image).records[probe.name]
    values, layer_output = _values_and_output(loaded, image, probe.name)
    module = probe_module(loaded.model, probe)
    with torch.no_grad():
        if probe.kind == "attention":
            token = index + probe.num_prefix_tokens
            idx, rho = record.topk_idx[0, head, token], record.topk_weights[0, head, token]
            d = module.head_dim
            taps = module.weight[head * d:(head + 1) * d, 0].T  # (K, d)
            vectors = taps * rho[:, None] * values[0, head, idx]  # (K, d)
            bias = torch.zeros(d)
            output = layer_output[0, token, head * d:(head + 1) * d]
        else:
            knn = knn_branch(module, probe)
            idx, rho = record.topk_idx[0, 0, index], record.topk_weights[0, 0, index]
            neighbors = (rho[:, None] * values[0, 0, idx]).T.unsqueeze(0)  # (1, C_in, K)
            vectors = torch.stack([F.conv1d(neighbors[:, :, t:t + 1], knn.weight[:, :, t:t + 1], groups=knn.groups)
                                   [0, :, 0] for t in range(idx.numel())])  # (K, C_out)
            bias = knn.bias if knn.bias is not None else torch.zeros(knn.out_channels)
            output = layer_output[0, :, row, col]
    selection = rule_selection(loaded, image, layer, LAYER_RULE, RuleOptions(head=head))
    return Contributions(selection.cells[index], selection.is_prefix[index], vectors.float().cpu().numpy(),
                         vectors.norm(dim=1).float().cpu().numpy(), bias.float().cpu().numpy(),
                         output.float().cpu().numpy())
