"""Host side of the fused kernel: launch configuration, the forward and backward launchers, the registered operators
``convnn::knn_fused`` and ``convnn::knn_fused_backward`` (with their fake implementations and autograd, so that
``torch.compile(fullgraph=True)`` and ``torch.export`` call the kernel without a graph break; docs/method.md §9) and
the public entry :func:`knn_aggregate_triton`."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

from ..autocast import linked
from ..checks import check_knn_arguments, chosen, fused_unsupported_reason, triton_runs_on
from ..reference import BlendGrid, KnnResult, bind_options, candidates_on, spatial_profile, takes_options
from ..usage import note_backend
from . import backward, forward
from .forward import WEIGHTING_NONE, WEIGHTING_SOFTMAX, WEIGHTING_UNIFORM
from .launch import launch
from .select import NORM_EPS, PACKED_TILES

# ρ → the kernels' WEIGHTING (named in forward.py, where the kernels read them: function.py imports forward)
_WEIGHTINGS = {"none": WEIGHTING_NONE.value, "softmax": WEIGHTING_SOFTMAX.value, "uniform": WEIGHTING_UNIFORM.value}
_TARGET_PROGRAMS_PER_SM = 2  # a grid of fewer programs than SMs is split up to about this many programs per SM
_MIN_TILES_PER_SPLIT = 4  # never split a candidate range into pieces of fewer key tiles
_MAX_SPLITS = 16


SELECTIONS = ("auto", "unpacked", "lanes", "rounds")  # "auto": the default (fwd_config)
PACKED_MAX_COLS = 1024  # "auto" packs the lanes up to this many candidate columns (16 tiles of 64) and K ≤ 64
GATHER_MAX_TILES = 32  # the repair's gather scores ≤ this many columns of a failed row's lane (fwd_config's GATHER)
SMALL_MAP_COLS = 4096  # candidate ranges up to this many columns stream in 32-wide tiles with 4 warps (fwd_config)
_SELECTION: ContextVar[str] = ContextVar("convnn_selection", default="auto")  # set by use_selection


@contextmanager
def use_selection(selection: str) -> Iterator[None]:
    """Inside the block the forward selects with ``selection``: ``"auto"`` (the default: up to
    :data:`PACKED_MAX_COLS` candidate columns and K ≤ 64 the packed lanes — one int32 an entry, docs/kernel.md,
    "Packed lanes" — whose few failed rows are repaired in their own block; elsewhere as ``"unpacked"``),
    ``"unpacked"`` (the lanes — per-lane lists and a certificate, docs/kernel.md, "Lane selection" — whose failed
    rows are repaired together by a kernel of their own, ``forward.knn_fwd_repair``; on an H100 at K = 16, 32 and
    N = 16384 0.72×, 0.75× and 0.78× the time of the next, bench/RESULTS.md §1j), ``"lanes"`` (the lanes, a failed
    row repaired by its own block streaming the tiles again, with §1h's shapes) or ``"rounds"`` (the insertion
    rounds alone).
    All are exact; the switch exists to measure one beside the other (bench/kernel.py). Blocks nest; each thread
    and task sees its own.

    Raises:
        ValueError: an unknown selection.
    """
    with chosen(_SELECTION, selection, SELECTIONS, "selection"):
        yield


def _cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for ints. Plain Python: in Triton ≥ 3.5 ``triton.cdiv`` and ``triton.next_power_of_2`` are constexpr
    functions whose wrapper unwraps every argument, ≈ 8 µs a call on this project's CPU host (22 calls a layer's
    forward and backward)."""
    return -(-a // b)


def _next_pow2(n: int, floor: int = 1) -> int:
    """The smallest power of two ≥ n, at least ``floor`` (plain Python, as :func:`_cdiv`)."""
    return max(floor, 1 << max(n - 1, 0).bit_length())


def fwd_config(num_neighbors: int, D: int, Dv: int, C_out: int, num_cols: int, blend: bool = False) -> dict:
    """Block sizes of the forward for K = ``num_neighbors`` over ``num_cols`` candidate columns: 64 query rows a block;
    ``LANES``, the selection (:func:`use_selection`); ``LANE_DEPTH``, the entries a lane keeps; ``DEFER``, whether the
    rows the lanes cannot certify go to ``forward.knn_fwd_repair`` (``"unpacked"``) or are repaired in their own block
    (``"lanes"``); ``PACKED``, the packed lanes (``"auto"`` up to :data:`PACKED_MAX_COLS` columns and K ≤ 64, not the
    blend rule: three entries a lane for K ≤ 9, four above, over 64-wide tiles with 4 warps, a failed row repaired in
    its own block; one H100, CIFAR kernel configuration, bench/RESULTS.md §1p: K = 9, 16, 32, 64 in 0.34, 0.45, 0.86,
    3.13 ms against the unpacked lanes' 0.38, 0.56, 1.92, 5.33). With the deferred repair (one H100, random features,
    CIFAR kernel configuration, bench/RESULTS.md §1j): K ≤ 9 keeps two entries a lane over 64-wide tiles with 4 warps (N
    = 16384: 7.46 ms against 9.62; N = 1024 on an H200, §1l: 0.469 against 0.490 for three entries over 32-wide tiles;
    the blend rule's small maps keep the latter, unmeasured); on a small map (≤ :data:`SMALL_MAP_COLS` columns) the
    lanes stream 32-wide tiles with 4 warps for K ≤ 32 (K = 16: 0.69 ms against 0.96 for the lanes repaired in their own
    block), 64-wide with 8 warps above; on a larger map, K > 9 64-wide tiles with 8 warps. Without it (``"lanes"``,
    §1h): 32-wide tiles with 4 warps on small maps for K ≤ 9 or 17–32 only. 3 pipeline stages for the lanes. The
    insertion rounds use 4 warps up to K = 16, 8 above, 2 stages, and ``WARM``: the key tiles around each query block
    that set its rows' floors before the rounds (:func:`select.merge_tile`): 4 for the blend rule, none otherwise.
    ``REPAIR_BLOCK_M``, ``REPAIR_BLOCK_N``, ``REPAIR_WARPS``: the deferred repair's rows a program, tile width and warps
    — 16 rows over 128-wide tiles with 4 warps, since it gets a few rows a list (the CIFAR bench's random features: 17
    of 1,024 a sample with two entries a lane; §1n), and a program of 64 rows streamed 32-wide tiles for them;
    ``REPAIR_PROGRAMS_PER_SM``: its grid, about 3 programs an SM in all (216 registers, Triton 3.6: 2 fit at once), each
    taking its list's blocks in turn. ``GATHER`` (off until a GPU has timed it with that grid; bench/RESULTS.md §1n):
    the repair scores only a failed row's K keys and its one lane to rescan where it can (``forward.knn_fwd_repair``;
    the "all" rule unsplit, ≤ :data:`GATHER_MAX_TILES` tiles).
    Entries can be overridden through :func:`launch_forward`'s ``config``."""
    k_pad = _next_pow2(num_neighbors, 2)
    selection = _SELECTION.get()
    packed = selection == "auto" and k_pad <= 64 and num_cols <= PACKED_MAX_COLS and not blend
    lanes = selection != "rounds"
    defer = selection in ("auto", "unpacked") and not packed
    small = num_cols <= SMALL_MAP_COLS
    shallow = defer and num_neighbors <= 9 and not (small and blend)  # two entries a lane, 4 warps, 64-wide tiles
    narrow = lanes and small and not shallow and not packed and (
        num_neighbors <= 32 if defer else num_neighbors <= 9 or 16 < num_neighbors <= 32)
    depth = (3 if num_neighbors <= 9 else 4) if packed else 2 if shallow else 3
    return dict(BLOCK_M=64, BLOCK_N=32 if narrow else max(64, k_pad), D_PAD=_next_pow2(D, 16), K_PAD=k_pad,
                BLOCK_C=min(64, _next_pow2(Dv, 16)), BLOCK_O=min(128, _next_pow2(C_out, 16)),
                num_warps=4 if narrow or shallow or packed or (not lanes and k_pad <= 16) else 8,
                num_stages=3 if lanes else 2, LANES=lanes, LANE_DEPTH=depth, DEFER=defer,
                WARM=4 if blend and not lanes else 0, REPAIR_BLOCK_M=16, REPAIR_BLOCK_N=max(128, k_pad),
                REPAIR_WARPS=4, REPAIR_PROGRAMS_PER_SM=3, GATHER=False, PACKED=packed)


@functools.cache
def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (1 elsewhere, e.g. in the interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def _num_splits(num_programs: int, num_cols: int, block_n: int, device: torch.device) -> int:
    """How many programs share one query block's candidates, so that the grid fills the GPU."""
    if device.type != "cuda":
        return 1
    sms = _sm_count(device)
    if num_programs >= sms:
        return 1
    wanted = _cdiv(_TARGET_PROGRAMS_PER_SM * sms, num_programs)
    most = max(1, num_cols // (block_n * _MIN_TILES_PER_SPLIT))
    return max(1, min(wanted, most, _MAX_SPLITS))


def _check_launchable(q, k, v, weight, bias, candidates) -> None:
    """Raise ``ValueError`` unless the tensors can go to one launch: a device Triton runs on, all on q's device,
    q, k, v of one dtype. Everything else about the arguments is checked by the public entries
    (:func:`knn_aggregate_triton`, :func:`kernels.knn_aggregate`) before they reach the launcher."""
    if not triton_runs_on(q.device):
        raise ValueError(f"the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1), got device={q.device}")
    tensors = (("k", k), ("v", v), ("weight", weight), ("bias", bias), ("candidates", candidates))
    for name, x in tensors:
        if x is not None and x.device != q.device:
            raise ValueError(f"{name} must be on {q.device}, got {x.device}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype on the Triton kernel, got {q.dtype}, {k.dtype}, {v.dtype}")


def token_major(x: Tensor) -> Tensor:
    """x (B, H, N, D) with unit stride along D (a copy if needed): rows gathered by index are then contiguous."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _inverse_key_norms(k: Tensor, d_pad: int) -> Tensor:
    """1 / max(‖k_j‖, eps) per key, fp32 (B·H, Nk): computed once (:func:`forward.key_inv_norms`, one launch)
    instead of once per query block."""
    B, H, Nk, D = k.shape
    kinv = torch.empty(B * H, Nk, device=k.device, dtype=torch.float32)
    block_r = max(16, 8192 // d_pad)
    launch(forward.key_inv_norms, (_cdiv(B * H * Nk, block_r),), K=k, KInv=kinv, k_strides=k.stride(), H=H, Nk=Nk,
           D=D, num_rows=B * H * Nk, BLOCK_R=block_r, D_PAD=d_pad)
    return kinv


def _channel_major(weight: Tensor) -> Tensor:
    """The Conv1D weight (C_out, C_in/groups, K) as a view of a copy with C_out innermost: the kernels read
    W[:, :, t] one rank slot at a time, a coalesced [C_in, C_out] block then (the weight's own layout puts K elements
    between two output channels); the weight itself where it is laid out so already (no copy)."""
    transposed = weight.permute(2, 1, 0)
    return weight if transposed.is_contiguous() else transposed.contiguous().permute(2, 1, 0)


def launch_forward(q, k, v, weight, bias, num_neighbors, similarity, weighting, temperature, groups, candidates,
                   self_first, blend=None, num_splits=None, config=None) -> tuple[Tensor, Tensor, Tensor]:
    """Allocate and launch the forward. Returns out (B, C_out, Nq), idx (B, H, Nq, K) int64, a fp32.

    For arguments that passed :func:`kernels.checks.check_knn_arguments` and
    :func:`kernels.checks.fused_unsupported_reason`; checks only :func:`_check_launchable`. ``num_splits`` and
    ``config`` (entries of :func:`fwd_config`) override the heuristics (benchmarks, tests).
    """
    _check_launchable(q, k, v, weight, bias, candidates)
    B, H, Nq, D = q.shape
    Nk, Dv = k.shape[2], v.shape[3]
    C_out = weight.shape[0]
    # the candidate columns: sampled keys, the blend's padded map, or every key
    num_cols = candidates.shape[1] if candidates is not None else blend.num_cells if blend is not None else Nk
    cfg = fwd_config(num_neighbors, D, Dv, C_out, num_cols, blend=blend is not None) | (config or {})
    block_m, block_n, k_pad = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["K_PAD"]
    out = torch.empty(B, C_out, Nq, device=q.device, dtype=q.dtype)
    idx = torch.empty(B, H, Nq, num_neighbors, device=q.device, dtype=torch.int64)
    a = torch.empty(B, H, Nq, num_neighbors, device=q.device, dtype=torch.float32)
    if candidates is not None:
        cand, stride_cb = candidates, candidates.stride(0) if candidates.shape[0] > 1 else 0
    else:
        cand, stride_cb = idx, 0  # any pointer: never read
    kinv = _inverse_key_norms(k, cfg["D_PAD"]) if similarity == "cosine" else a  # any pointer for dot: never read
    spatial, width, pad, mix = a, 1, 0, (0.0, 0.0)  # any pointer, no padding: not the blend rule
    if blend is not None:
        width, pad, num_splits = blend.width, blend.pad, 1  # one pass spans the map
        spatial = spatial_profile(blend.window_size, max(blend.height, blend.width) + pad, q.device)
        mix = (1.0 - blend.alpha, float(blend.alpha))
    grid_m = _cdiv(Nq, block_m)
    if num_splits is None:
        num_splits = _num_splits(grid_m * B * H, num_cols, block_n, q.device)
    cols_per_split = _cdiv(_cdiv(num_cols, num_splits), block_n) * block_n
    num_splits = _cdiv(num_cols, cols_per_split)
    split = num_splits > 1
    part = torch.empty(B * H, num_splits, Nq, k_pad, device=q.device, dtype=torch.int64) if split else idx
    defer = bool(cfg["LANES"] and cfg["DEFER"])
    if defer:  # per (sample, head, split): how many rows the lanes could not certify, and which (knn_fwd_repair)
        count = torch.zeros(B * H * num_splits, device=q.device, dtype=torch.int32)
        rows = torch.empty(B * H * num_splits, Nq, device=q.device, dtype=torch.int32)
    else:
        count = rows = idx  # any pointer: never read
    weight = _channel_major(weight)
    args = dict(
        inputs=(q, k, v, weight, bias if bias is not None else weight, cand, kinv, spatial),
        outputs=(out, idx, a, part, count, rows), q_strides=q.stride(), k_strides=k.stride(), v_strides=v.stride(),
        w_strides=weight.stride(), o_strides=out.stride(),
        sizes=(H, Nq, Nk, num_cols, cols_per_split, num_neighbors, D, Dv, C_out, stride_cb, width, pad),
        scale=1.0 if similarity == "cosine" else 1.0 / math.sqrt(D), inv_temperature=1.0 / temperature,
        WEIGHTING=_WEIGHTINGS[weighting], SELF_FIRST=bool(self_first), HAS_BIAS=bias is not None,
        COSINE=similarity == "cosine", CANDIDATES=candidates is not None, DEPTHWISE=groups > 1,
        IEEE=q.dtype == torch.float32, BLOCK_M=block_m, D_PAD=cfg["D_PAD"], K_PAD=k_pad, BLOCK_C=cfg["BLOCK_C"],
        BLOCK_O=cfg["BLOCK_O"], ONE_C=Dv <= cfg["BLOCK_C"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    warm = cfg["WARM"] if candidates is None else 0  # sampled candidates have no neighbourhood
    grid = (grid_m, B * H, num_splits)
    tiles = _cdiv(num_cols, block_n)
    gather = defer and cfg["GATHER"] and not split and candidates is None and blend is None
    gather_t = max(_next_pow2(tiles, 1), k_pad) if gather and tiles <= GATHER_MAX_TILES else 0
    packed = bool(cfg["LANES"] and cfg["PACKED"] and cols_per_split // block_n <= PACKED_TILES and not gather_t)
    launch(forward.knn_fwd, grid, **args, blend=mix, BLEND=blend is not None, SPLIT=split, LANES=cfg["LANES"],
           LANE_DEPTH=cfg["LANE_DEPTH"], DEFER=defer, WARM=warm, BLOCK_N=block_n, GATHER_T=gather_t, PACKED=packed)
    if defer:
        repair = args | dict(BLOCK_M=cfg["REPAIR_BLOCK_M"], num_warps=cfg["REPAIR_WARPS"])
        programs = min(_cdiv(Nq, cfg["REPAIR_BLOCK_M"]),
                       _cdiv(cfg["REPAIR_PROGRAMS_PER_SM"] * _sm_count(q.device), B * H * num_splits))
        launch(forward.knn_fwd_repair, (programs, B * H, num_splits), **repair, blend=mix, BLEND=blend is not None,
               SPLIT=split, BLOCK_N=cfg["REPAIR_BLOCK_N"], GATHER_N=block_n, GATHER_T=gather_t)
    if split:
        launch(forward.knn_fwd_merge, (grid_m, B * H), **args, num_splits=num_splits)
    return out, idx, a


def _normalize_backward(x: Tensor, grad_hat: Tensor) -> Tensor:
    """Gradient w.r.t. x of x̂ = x / max(‖x‖, eps) (F.normalize), given the gradient w.r.t. x̂; fp32."""
    x = x.float()
    norm = x.norm(dim=-1, keepdim=True)
    x_hat = x / norm.clamp_min(NORM_EPS)
    projected = (grad_hat - x_hat * (x_hat * grad_hat).sum(-1, keepdim=True)) / norm.clamp_min(NORM_EPS)
    return torch.where(norm > NORM_EPS, projected, grad_hat / NORM_EPS)


def _key_order(idx: Tensor, Nk: int) -> tuple[Tensor, Tensor]:
    """The (query, slot) entries of ``idx`` (BH, Nq, K) grouped by key: their order (BH, Nq·K) and each key's
    start in it (BH, Nk + 1), both int32, for :func:`_key_sum`."""
    BH = idx.shape[0] * idx.shape[1]
    keys = idx.reshape(BH, -1).long()
    sorted_keys, order = torch.sort(keys, dim=-1, stable=True)
    bounds = torch.arange(Nk + 1, device=idx.device).expand(BH, Nk + 1).contiguous()
    offsets = torch.searchsorted(sorted_keys, bounds).to(torch.int32).contiguous()
    return order.to(torch.int32).contiguous(), offsets


def _key_sum(contrib: Tensor, key_order: tuple[Tensor, Tensor], Nk: int) -> Tensor:
    """Deterministic Σ over (query, slot) entries per key: contrib (BH, Nq·K, W) → (BH, Nk, W) fp32."""
    BH, num_entries, width = contrib.shape
    order, offsets = key_order
    out = torch.empty(BH, Nk, width, device=contrib.device, dtype=torch.float32)
    block_j = 32
    launch(backward.knn_bwd_key_sum, (_cdiv(Nk, block_j), BH), Contrib=contrib, Order=order, Offsets=offsets, Out=out,
           sizes=(Nk, num_entries, width), BLOCK_J=block_j, BLOCK_W=_next_pow2(width, 16), num_warps=4)
    return out


def _weight_grad(grad_out: Tensor, v: Tensor, idx: Tensor, a: Tensor, block_c: int, block_o: int) -> Tensor:
    """Standard Conv1D weight gradient (C_out, Dv, K) fp32 (one head): per-split partials, then their sum."""
    B, _, Nq, K = idx.shape
    Dv, C_out = v.shape[3], grad_out.shape[1]
    block_r = 64
    num_rows = B * Nq
    oc_blocks = _cdiv(C_out, block_o) * _cdiv(Dv, block_c)
    target = _TARGET_PROGRAMS_PER_SM * _sm_count(v.device)
    num_splits = max(1, min(_cdiv(target, K * oc_blocks), _cdiv(num_rows, block_r * 4)))
    rows_per_split = _cdiv(_cdiv(num_rows, num_splits), block_r) * block_r
    num_splits = _cdiv(num_rows, rows_per_split)
    part = torch.empty(num_splits, C_out, Dv, K, device=v.device, dtype=torch.float32)
    launch(backward.knn_bwd_weight, (K, oc_blocks, num_splits), inputs=(v, idx, a, grad_out), DWPart=part,
           v_strides=v.stride(), do_strides=grad_out.stride(), sizes=(Nq, num_rows, rows_per_split, K, Dv, C_out),
           IEEE=v.dtype == torch.float32, BLOCK_R=block_r, BLOCK_C=block_c, BLOCK_O=block_o, num_warps=8)
    return part.sum(0)


def launch_backward(grad_out, grad_a, q, k, v, weight, idx, a, similarity, weighting, temperature, groups,
                    needs_grad) -> tuple[Tensor | None, ...]:
    """Gradients (dq, dk, dv, dweight, dbias) in fp32, each None unless ``needs_grad`` (five bools, for q, k, v,
    weight, bias) asks for it; dq and dk are None too unless weighting is softmax.

    Only what is asked for runs: the query-owned kernel when dq, dk, dv or a depthwise dweight is needed (it writes
    dV and the depthwise dW partials whenever it runs; its softmax part only when dq or dk is needed), the
    deterministic key sums for dv and dk, the standard dW kernel for dweight, the sum over dO for dbias.
    """
    need_q, need_k, need_v, need_w, need_b = needs_grad
    B, H, Nq, D = q.shape
    Nk, Dv = k.shape[2], v.shape[3]
    C_out, K = weight.shape[0], idx.shape[-1]
    BH = B * H
    cosine = similarity == "cosine"
    if weighting != "softmax":  # only softmax weights carry a gradient to q and k
        need_q = need_k = False
    softmax = need_q or need_k  # the kernel's softmax part (da → ds → dq, dk) runs only for them
    depthwise = groups > 1
    deterministic = torch.are_deterministic_algorithms_enabled()
    block_c, block_o = min(64, _next_pow2(Dv, 16)), min(64, _next_pow2(C_out, 16))
    f32 = dict(device=q.device, dtype=torch.float32)
    d_q = d_k = d_v = d_weight = d_bias = None
    if softmax or need_v or (need_w and depthwise):
        block_m = 64
        grid_m = _cdiv(Nq, block_m)
        dv = torch.zeros(BH, Nq * K if deterministic else Nk, Dv, **f32)
        dq = torch.empty(BH, Nq, D, **f32) if softmax else dv
        dk = (torch.empty(BH, Nq * K, D, **f32) if deterministic else torch.zeros(BH, Nk, D, **f32)) if softmax else dv
        dw_part = torch.empty(grid_m, BH, Dv, K, **f32) if depthwise else dv
        grad_a = grad_a.contiguous() if grad_a is not None and softmax else None
        weight = _channel_major(weight)
        launch(
            backward.knn_bwd_query, (grid_m, BH),
            inputs=(q, k, v, weight, idx, a, grad_a if grad_a is not None else a, grad_out),
            grads=(dq, dk, dv, dw_part), q_strides=q.stride(), k_strides=k.stride(), v_strides=v.stride(),
            w_strides=weight.stride(), do_strides=grad_out.stride(), sizes=(H, Nq, Nk, K, D, Dv, C_out),
            scale=1.0 if cosine else 1.0 / math.sqrt(D), inv_temperature=1.0 / temperature, COSINE=cosine,
            SOFTMAX=softmax, DEPTHWISE=depthwise, DETERMINISTIC=deterministic, HAS_GRAD_A=grad_a is not None,
            IEEE=q.dtype == torch.float32, BLOCK_M=block_m, D_PAD=_next_pow2(D, 16), K_PAD=_next_pow2(K, 2),
            BLOCK_C=block_c, BLOCK_O=block_o, num_warps=8)
        key_order = _key_order(idx, Nk) if deterministic and (need_v or need_k) else None
        if need_v:
            d_v = (_key_sum(dv, key_order, Nk) if deterministic else dv).view(B, H, Nk, Dv)
        if need_q:
            d_q = dq.view(B, H, Nq, D)
            d_q = _normalize_backward(q, d_q) if cosine else d_q
        if need_k:
            d_k = (_key_sum(dk, key_order, Nk) if deterministic else dk).view(B, H, Nk, D)
            d_k = _normalize_backward(k, d_k) if cosine else d_k
        if need_w and depthwise:
            d_weight = dw_part.sum(0).view(B, H * Dv, K).sum(0).unsqueeze(1)  # (H·Dv, 1, K)
    if need_w and not depthwise:
        d_weight = _weight_grad(grad_out, v, idx, a, block_c, block_o)
    if need_b:
        d_bias = grad_out.sum((0, 2), dtype=torch.float32)
    return d_q, d_k, d_v, d_weight, d_bias


def padded_rows(idx: Tensor, blend) -> Tensor:
    """Cells of the blend rule's padded map → the token (value row) each is, −1 for padding cells; int64."""
    row = torch.div(idx, blend.width + 2 * blend.pad, rounding_mode="floor") - blend.pad
    col = idx % (blend.width + 2 * blend.pad) - blend.pad
    inside = (row >= 0) & (row < blend.height) & (col >= 0) & (col < blend.width)
    return torch.where(inside, row * blend.width + col, -1)


def fused_backward(grad_out: Tensor | None, grad_a: Tensor | None, q: Tensor, k: Tensor, v: Tensor, weight: Tensor,
                   idx: Tensor, a: Tensor, similarity: str, weighting: str, temperature: float, groups: int,
                   blend: BlendGrid | None, needs_grad: Sequence[bool],
                   dtypes: Sequence[torch.dtype] | None = None) -> tuple[Tensor | None, ...]:
    """The backward of the fused aggregation, shared by its two entries (:class:`KnnAggregate`, eager, and the
    operator ``convnn::knn_fused_backward``, traced): :func:`launch_backward` on the forward's ``idx`` (padded cells
    mapped to value rows for the blend rule) and ``a``, ``v`` token-major. Returns the gradients of q, k, v, weight
    and bias (each None unless ``needs_grad``, five flags, asks for it), each in its dtype of ``dtypes`` (five;
    default: its input's, bias: weight's)."""
    if blend is not None:  # padded cells → value rows; −1 (a padding cell: zero value) gets no gradient
        idx = padded_rows(idx, blend)
    if grad_out is None:
        grad_out = torch.zeros(v.shape[0], weight.shape[0], q.shape[2], device=q.device, dtype=q.dtype)
    grads = launch_backward(grad_out, grad_a, q, k, token_major(v), weight, idx, a, similarity, weighting,
                            temperature, groups, tuple(needs_grad))
    dtypes = dtypes or (q.dtype, k.dtype, v.dtype, weight.dtype, weight.dtype)
    return tuple(None if g is None else g.to(dtype) for g, dtype in zip(grads, dtypes, strict=True))


class KnnAggregate(torch.autograd.Function):
    """Autograd of the fused aggregation in eager mode: :func:`launch_forward`, then :func:`fused_backward` on the
    saved ``idx`` and ``a``; ``v`` is used (and saved) token-major (:func:`token_major`), the weight channel-major
    (:func:`_channel_major`, once for both). Under autocast its inputs are the tensors the caller passed and
    ``computed`` their casts (made without autograd): the kernels read the casts, and the gradients come back in
    the inputs' own dtypes, straight from the kernels' fp32 sums (no cast node, no round trip through the autocast
    dtype). A traced graph calls the operator :func:`knn_fused` instead: the same launches, but a custom operator's
    autograd costs about 70 µs more per call in eager mode (measured on this project's CPU host: 80 µs against 11 µs
    for an empty body)."""

    @staticmethod
    def forward(ctx, q, k, v, weight, bias, num_neighbors, similarity, weighting, temperature, groups, candidates,
                self_first, blend, computed=None):
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, weight.dtype, (weight if bias is None else bias).dtype)
        if computed is not None:
            q, k, v, weight, bias = computed
        v_rows, weight = token_major(v), _channel_major(weight)
        out, idx, a = launch_forward(q, k, v_rows, weight, bias, num_neighbors, similarity, weighting, temperature,
                                     groups, candidates, self_first, blend)
        ctx.save_for_backward(q, k, v_rows, weight, idx, a)
        ctx.options = (similarity, weighting, temperature, groups, blend)
        ctx.mark_non_differentiable(idx)
        if weighting != "softmax":
            ctx.mark_non_differentiable(a)
        return out, idx, a

    @staticmethod
    def backward(ctx, grad_out, grad_idx, grad_a):
        q, k, v, weight, idx, a = ctx.saved_tensors
        grads = fused_backward(grad_out, grad_a, q, k, v, weight, idx, a, *ctx.options, ctx.needs_input_grad[:5],
                               ctx.dtypes)
        return *grads, None, None, None, None, None, None, None, None, None


def _blend_grid(blend_shape: Sequence[int] | None, blend_alpha: float) -> BlendGrid | None:
    """The operators' spelling of a :class:`~kernels.reference.BlendGrid` (a schema has no named tuples)."""
    return None if blend_shape is None else BlendGrid(*blend_shape, blend_alpha)


@torch.library.custom_op("convnn::knn_fused", mutates_args=())
def knn_fused(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, bias: Tensor | None, candidates: Tensor | None,
              num_neighbors: int, similarity: str, weighting: str, temperature: float, groups: int, self_first: bool,
              blend_shape: Sequence[int] | None, blend_alpha: float) -> tuple[Tensor, Tensor, Tensor]:
    """The fused forward as a registered operator (``torch.ops.convnn.knn_fused``), so that a compiled or exported
    graph calls the kernel as one node, without a break (docs/method.md §9): :func:`launch_forward` with ``v``
    token-major (:func:`token_major`). Its fake implementation gives the output shapes; its autograd is the operator
    :func:`knn_fused_backward` on the saved ``idx`` and ``a``.

    Args:
        q, k, v, weight, bias, candidates, num_neighbors, similarity, weighting, temperature, groups, self_first:
            as :func:`knn_aggregate_triton` (arguments that passed its checks, ``candidates`` on q's device).
        blend_shape (Sequence[int], optional): (height, width, window_size) of the blend rule's map, or None.
        blend_alpha (float): α of the blend rule (read only with ``blend_shape``).

    Returns:
        tuple[Tensor, Tensor, Tensor]: out (B, C_out, Nq) in q's dtype, idx (B, H, Nq, K) int64, a (B, H, Nq, K)
        fp32.
    """
    return launch_forward(q, k, token_major(v), weight, bias, num_neighbors, similarity, weighting, temperature,
                          groups, candidates, self_first, _blend_grid(blend_shape, blend_alpha))


@knn_fused.register_fake
def _knn_fused_fake(q, k, v, weight, bias, candidates, num_neighbors, similarity, weighting, temperature, groups,
                    self_first, blend_shape, blend_alpha):
    B, H, Nq, _ = q.shape
    return (q.new_empty(B, weight.shape[0], Nq), q.new_empty(B, H, Nq, num_neighbors, dtype=torch.int64),
            q.new_empty(B, H, Nq, num_neighbors, dtype=torch.float32))


@torch.library.custom_op("convnn::knn_fused_backward", mutates_args=())
def knn_fused_backward(grad_out: Tensor, grad_a: Tensor | None, q: Tensor, k: Tensor, v: Tensor, weight: Tensor,
                       idx: Tensor, a: Tensor, similarity: str, weighting: str, temperature: float, groups: int,
                       blend_shape: Sequence[int] | None, blend_alpha: float, needs_grad: Sequence[bool]
                       ) -> list[Tensor]:
    """:func:`fused_backward` as a registered operator (``torch.ops.convnn.knn_fused_backward``), the autograd of
    :func:`knn_fused`.

    Args:
        grad_out (Tensor): (B, C_out, Nq) gradient of ``out``.
        grad_a (Tensor, optional): (B, H, Nq, K) gradient of ``a`` (read with softmax weighting).
        q, k, v, weight, idx, a: the forward's inputs and outputs.
        similarity, weighting, temperature, groups, blend_shape, blend_alpha: the forward's options.
        needs_grad (Sequence[bool]): five flags, for q, k, v, weight and bias.

    Returns:
        list[Tensor]: the gradients of q, k, v, weight and bias, each in its input's dtype (bias: weight's), or an
        empty tensor where none is asked for (and for q and k unless weighting is softmax).
    """
    grads = fused_backward(grad_out, grad_a, q, k, v, weight, idx, a, similarity, weighting, temperature, groups,
                           _blend_grid(blend_shape, blend_alpha), needs_grad)
    return [weight.new_empty(0) if g is None else g for g in grads]


@knn_fused_backward.register_fake
def _knn_fused_backward_fake(grad_out, grad_a, q, k, v, weight, idx, a, similarity, weighting, temperature, groups,
                             blend_shape, blend_alpha, needs_grad):
    softmax = weighting == "softmax"
    shapes = (q.shape if softmax else None, k.shape if softmax else None, v.shape, weight.shape, weight.shape[:1])
    return [x.new_empty(shape) if need and shape is not None else weight.new_empty(0)
            for need, shape, x in zip(needs_grad, shapes, (q, k, v, weight, weight), strict=True)]


def _setup_fused(ctx, inputs, output) -> None:
    q, k, v, weight, bias, _, _, similarity, weighting, temperature, groups, _, blend_shape, blend_alpha = inputs
    _, idx, a = output
    ctx.save_for_backward(q, k, v, weight, idx, a)
    ctx.options = (similarity, weighting, temperature, groups, blend_shape, blend_alpha)
    ctx.has_bias = bias is not None


def _fused_autograd(ctx, grad_out, grad_idx, grad_a):
    q, k, v, weight, idx, a = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros(v.shape[0], weight.shape[0], q.shape[2], device=q.device, dtype=q.dtype)
    needs = [*ctx.needs_input_grad[:4], ctx.has_bias and ctx.needs_input_grad[4]]
    grads = knn_fused_backward(grad_out, grad_a, q, k, v, weight, idx, a, *ctx.options, needs)
    grads = [g if need and g.numel() else None for g, need in zip(grads, needs, strict=True)]
    return *grads, None, None, None, None, None, None, None, None, None


knn_fused.register_autograd(_fused_autograd, setup_context=_setup_fused)


@takes_options
def knn_aggregate_triton(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, bias: Tensor | None = None,
                         **options) -> KnnResult:
    """Fused ConvNN aggregation (METHOD §2–3; docs/method.md §2–3): the result of
    :func:`kernels.reference.knn_aggregate_reference`, without materialising the (Nq, Nk) score matrix.

    Differentiable (``torch.autograd``) w.r.t. ``v``, ``weight``, ``bias`` and, with ``weighting="softmax"``, ``q``
    and ``k``; indices carry no gradient. Under ``torch.use_deterministic_algorithms(True)`` the backward is
    bit-reproducible (no atomics). A ``v`` without unit stride along its last dimension is copied token-major once.

    Args:
        q (Tensor): (B, H, Nq, D) queries, float32, bfloat16 or float16, any strides.
        k (Tensor): (B, H, Nk, D) keys, same dtype.
        v (Tensor): (B, H, Nk, Dv) values, same dtype.
        weight (Tensor): (C_out, Dv, K) for ``groups=1`` (needs H = 1) or (H·Dv, 1, K) for ``groups=H·Dv``
            (depthwise); tap ``t`` weighs the rank-``t`` neighbour.
        bias (Tensor, optional): (C_out,) Conv1D bias. Default: None
        num_neighbors (int): K, 1 ≤ K ≤ min(number of candidates, 128).
        similarity (str): ``"cosine"`` (q̂·k̂, zero vectors score 0) or ``"dot"`` (q·k/√D). Default: ``"cosine"``
        weighting (str): ρ: ``"none"``, ``"softmax"`` (over the K selected scores / ``temperature``) or
            ``"uniform"`` (1/K). Default: ``"none"``
        temperature (float): softmax temperature, > 0. Default: 1.0
        groups (int): 1 (standard Conv1D) or H·Dv (depthwise). Default: 1
        candidates (Tensor, optional): (B, r) or (1, r) int64 sampled key indices shared by a sample's queries; each
            query's candidates are itself plus these (METHOD §3, ``random``). On the CPU they are range-checked
            without a device sync and copied without blocking; on q's device the check syncs once. None: all Nk
            keys. Default: None
        self_first (bool): rank each query's own token first (needs Nq = Nk); its real score sets its weight.
            Default: False
        blend (BlendGrid, optional): the blend rule over the zero-padded map (needs ``self_first``, weighting
            ``"none"`` or ``"uniform"``); ``topk_idx`` then counts padded cells. Default: None

    Returns:
        KnnResult: ``out`` (B, C_out, Nq) in the input dtype, ``topk_idx`` (B, H, Nq, K) int64 (rank 0 first,
        ties to the lower candidate index), ``topk_weights`` (B, H, Nq, K) fp32.

    Raises:
        ValueError: non-CUDA tensors without ``TRITON_INTERPRET=1`` or tensors on different devices, mixed or
            unsupported dtypes, shapes that do not match, ``groups`` other than 1 or H·Dv, an unknown similarity or
            weighting, K out of range, or 2**31 or more elements (the message names the argument).

    Example:
        >>> q = k = v = torch.randn(2, 1, 1024, 64, device="cuda", dtype=torch.bfloat16)
        >>> w = torch.randn(64, 64, 9, device="cuda", dtype=torch.bfloat16)
        >>> knn_aggregate_triton(q, k, v, w, num_neighbors=9).out.shape  # torch.Size([2, 64, 1024])
    """
    num_neighbors, similarity, weighting, temperature, groups, self_first, candidates, blend = bind_options(
        "knn_aggregate_triton", options)
    check_knn_arguments(q, k, v, weight, bias, num_neighbors, similarity, weighting, temperature, groups,
                        candidates, None, self_first, blend)
    unsupported = fused_unsupported_reason(q, k, v, weight, num_neighbors, similarity, groups, None, weighting, blend)
    if unsupported is not None:
        raise ValueError(unsupported)
    return aggregate_prechecked(q, k, v, weight, bias, **options)


@takes_options
def aggregate_prechecked(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, bias: Tensor | None, *,
                         originals: tuple | None = None, **options) -> KnnResult:
    """:func:`knn_aggregate_triton` for arguments that already passed its checks (the fused path of
    :func:`kernels.knn_aggregate`, which checks once per call); only :func:`_check_launchable` runs here. Under
    autocast q, k, v, weight, bias are casts made without autograd and ``originals`` the tensors they were cast
    from (five; their gradients come back in their own dtypes), else None.
    Same arguments, result and gradients; arguments that would fail the checks give undefined results. Eager mode
    runs :class:`KnnAggregate`; inside ``torch.compile`` or ``torch.export`` the registered operator
    :func:`knn_fused` (docs/method.md §9), so that the graph calls the kernel without a break."""
    num_neighbors, similarity, weighting, temperature, groups, self_first, candidates, blend = bind_options(
        "aggregate_prechecked", options)
    note_backend("triton")
    candidates = candidates_on(candidates, q.device)
    computed = (q, k, v, weight, bias)
    if not torch.compiler.is_compiling():
        return KnnResult(*KnnAggregate.apply(*(originals or computed), num_neighbors, similarity, weighting,
                                             temperature, groups, candidates, self_first, blend, computed))
    if originals is not None:  # a traced graph drops the casts without autograd: casts with it instead
        q, k, v, weight, bias = linked(originals, computed, q.dtype)
    blend_shape = None if blend is None else (blend.height, blend.width, blend.window_size)
    out, idx, a = knn_fused(q, k, token_major(v), weight, bias, candidates, num_neighbors, similarity, weighting,
                            temperature, groups, self_first, blend_shape, 0.0 if blend is None else float(blend.alpha))
    return KnnResult(out, idx, a if weighting == "softmax" else a.detach())  # only softmax weights carry a gradient
