"""Benchmark the fused ConvNN kernel where people run it, on one CUDA GPU: whole layers under bf16 autocast, the
kernel alone beside dense SDPA-flash, forward time by N, a selection floor, and block-size variants.

    python bench/kernel.py --out bench/RESULTS.kernel.md --json bench/results/kernel.json

Every time is the median of ``triton.testing.do_bench`` in ms (CUDA events, launches queued back to back as in a
training loop, L2 flushed between runs); memory is the peak ``max_memory_allocated`` the measured call adds, in MiB.

- **Layers at the CIFAR layer** (B = 128, C = 64 → 64, 32×32, K = 9, cosine, weighting none; fp32 parameters and
  fp32 input requiring grad; inside ``torch.autocast("cuda", torch.bfloat16)``): ``layer_all_*`` (ConvNN2d
  ``all``), ``layer_random32_fwdbwd`` (``random``, r = 32, training mode: a new draw per call), ``layer_blend_fwdbwd``
  (``blend``, α = 0.5), ``layer_hybrid_fwdbwd`` (HybridConvNN2d λ = 0.5), ``conv2d_fwdbwd`` (3×3 ``nn.Conv2d``).
  ``_fwd``: forward without autograd; ``_fwdbwd``: forward + ``out.float().sum().backward()``; ``_peak_mib``: the
  forward with autograd (saved tensors count).
- **The kernel alone** (bf16 q, k, v of (B, 1, N, 64) requiring grad, K = 9, cosine, softmax weighting so q and k get
  gradients, a 64 → 64 Conv1D) beside ``F.scaled_dot_product_attention`` on the same q, k, v under the flash backend:
  ``cifar_*`` (B = 128, N = 1024), ``n16k_bh16_*`` (B = 16, N = 16384), ``by_n_fused_fwd`` (B = 1, N = 1024 … 32768).
- **Selection floor** (``*_floor_fwd``): a bench-only kernel with the fused forward's tiling that keeps only a
  running max + argmax per query (no top-K, no aggregation): the least any selection can cost with this tiling.
- **By K** (``by_k``): the fused forward at the CIFAR kernel configuration for K = 9, 16, 32, 64, under the default
  selection (``by_k_fused_fwd``) and under each selection loop beside it (``by_k_unpacked_fwd``: the lanes before
  they were packed; ``by_k_lanes_fwd``, ``by_k_rounds_fwd``: :func:`kernels.knn_triton.use_selection`), in the
  same call.
- **Packed lanes** (``packed_sweep``): the forward at the CIFAR kernel configuration, K = 9 … 64, under the packed
  lanes' depths, repairs and warps of ``PACKED_SWEEP`` beside the default, and SDPA-flash in the same part.
- **Variants** (``sweep``): the fused forward alone under other block sizes, warp counts, warm starts (``WARM``
  tiles, also for the blend rule's kernel at the CIFAR layer) and selection loops.
- **The blend rule's variants** (``blend``, into ``sweep``): its kernel at the CIFAR layer under the lanes' depths,
  tile widths and warps of ``BLEND_SWEEP``, and the rounds with a warm start.
- **The deferred repair** (``repair_sweep``): the fused forward at the CIFAR and N = 16384 kernel configurations
  under the repair's block sizes and lane depths of ``REPAIR_SWEEP``.
- ``--selection`` runs every part under one selection loop (default ``auto``).
- **Where the time goes** (``profile``): each layer's forward + backward under ``torch.profiler``
  (:func:`gpu_breakdown`): per call the wall time, the time the GPU is busy (the union of its kernels' intervals)
  and each kernel's total, so a layer that waits on the host (wall ≫ busy) tells itself apart from one whose
  kernels are slow, and each kernel's share is known.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import nn
from torch.autograd import DeviceType
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from convnn import ConvNN2d, HybridConvNN2d
from kernels.knn_triton import function, knn_aggregate_triton, use_selection
from kernels.reference import BlendGrid

DEVICE = "cuda"
CIFAR = dict(batch=128, channels=64, size=32, num_neighbors=9)
KERNEL_DIM, KERNEL_K = 64, 9
BY_N = [1024, 2048, 4096, 8192, 16384, 32768]
BY_K = [9, 16, 32, 64]
SWEEP = [  # (LANES, BLOCK_M, BLOCK_N, num_warps, WARM); each loop's default is timed first. WARM ≥ the tiles of a
    # query block's range (16 at N = 1024, 256 at N = 16384) makes the floor the bound of every tile's elementwise max
    (True, 64, 64, 8, 0), (True, 64, 64, 16, 0), (True, 32, 64, 4, 0), (True, 32, 64, 8, 0), (True, 64, 64, 4, 0),
    (True, 128, 64, 16, 0), (True, 64, 32, 4, 0), (True, 64, 32, 8, 0),
    (False, 64, 64, 4, 0), (False, 64, 128, 4, 0), (False, 128, 64, 4, 0), (False, 64, 64, 4, 1),
]
# The deferred repair (``repair``), the forward at the CIFAR and N = 16384 kernel configurations: {name: config}.
# "64-row" is the repair before §1l (the forward's own block sizes); "depth 2" keeps two entries a lane, so more rows
# go to the repair.
REPAIR_SWEEP = {
    "default": {}, "64-row": dict(REPAIR_BLOCK_M=64, REPAIR_BLOCK_N=None), "16x64": dict(REPAIR_BLOCK_N=64),
    "16x256": dict(REPAIR_BLOCK_N=256), "32x128": dict(REPAIR_BLOCK_M=32), "16x128 w2": dict(REPAIR_WARPS=2),
    "16x128 w8": dict(REPAIR_WARPS=8), "depth 2": dict(LANE_DEPTH=2), "depth 3": dict(LANE_DEPTH=3),
    "depth 2 64-wide": dict(LANE_DEPTH=2, BLOCK_N=64), "depth 3 32-wide": dict(LANE_DEPTH=3, BLOCK_N=32),
    "gather": dict(GATHER=True), "depth 3 gather": dict(LANE_DEPTH=3, GATHER=True),
    "grid of every block": dict(REPAIR_PROGRAMS_PER_SM=2**20),
}
# Packed lanes (``PACKED``: one int32 an entry, select.packed_insert) beside the lanes as they were, at the CIFAR
# kernel configuration and K = 16, 32, 64: {name: config}; "DEFER off": a failed row is repaired in its own block;
# None: the default of that K.
PACKED_SWEEP = {
    "default": None, "packed depth 3": dict(PACKED=True, LANE_DEPTH=3, BLOCK_N=64, num_warps=4),
    "packed depth 3 DEFER off": dict(PACKED=True, LANE_DEPTH=3, DEFER=False, BLOCK_N=64, num_warps=4),
    "packed depth 4 DEFER off": dict(PACKED=True, LANE_DEPTH=4, DEFER=False, BLOCK_N=64, num_warps=4),
    "packed depth 2": dict(PACKED=True, LANE_DEPTH=2, BLOCK_N=64, num_warps=4),
    "packed depth 3 DEFER off w8": dict(PACKED=True, LANE_DEPTH=3, DEFER=False, BLOCK_N=64, num_warps=8),
    "packed depth 3 DEFER off 2 stages": dict(PACKED=True, LANE_DEPTH=3, DEFER=False, BLOCK_N=64, num_warps=4,
                                              num_stages=2),
}
# The blend rule's kernel at the CIFAR layer (α = 0.5, 3×3): (LANES, num_warps, WARM, LANE_DEPTH, BLOCK_N); the
# lanes' default is 3 entries over 32-wide tiles with 4 warps, the rounds' 4 warm tiles.
BLEND_SWEEP = [(True, 4, 0, 3, 32), (True, 8, 0, 3, 32), (True, 4, 0, 2, 64), (True, 4, 0, 2, 32),
               (True, 8, 0, 3, 64), (False, 4, 4, 3, 64)]


def median_ms(fn: Callable[[], object], warmup_ms: float, rep_ms: float) -> float:
    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def peak_mib(fn: Callable[[], object]) -> float:
    """Peak memory ``fn`` adds beyond what is allocated before it, its result kept alive until measured."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    del result
    return peak


# ---------------------------------------------------------------------------------------------------------------
# Whole layers under autocast
# ---------------------------------------------------------------------------------------------------------------
def _layers() -> dict[str, nn.Module]:
    c, k = CIFAR["channels"], CIFAR["num_neighbors"]
    return {
        "layer_all": ConvNN2d(c, c, num_neighbors=k),
        "layer_random32": ConvNN2d(c, c, num_neighbors=k, selection="random", num_candidates=32),
        "layer_blend": ConvNN2d(c, c, num_neighbors=k, selection="blend", blend_alpha=0.5),
        "layer_hybrid": HybridConvNN2d(c, c, branch_ratio=0.5, num_neighbors=k),
        "conv2d": nn.Conv2d(c, c, 3, padding=1),
    }


def _layer_calls():
    """Per layer of :func:`_layers` on one CIFAR input: its name and calls ``fwd`` (no autograd), ``fwdbwd``
    (forward + ``sum().backward()``) and ``graph`` (the forward with autograd, its output returned)."""
    torch.manual_seed(0)
    x = torch.randn(CIFAR["batch"], CIFAR["channels"], CIFAR["size"], CIFAR["size"], device=DEVICE,
                    requires_grad=True)
    for name, layer in _layers().items():
        layer = layer.to(DEVICE).train()

        def forward(layer=layer):
            with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
                return layer(x)

        def forward_backward(layer=layer):
            with torch.autocast("cuda", torch.bfloat16):
                out = layer(x)
            out.float().sum().backward()

        def forward_graph(layer=layer):
            with torch.autocast("cuda", torch.bfloat16):
                return layer(x)

        yield name, {"fwd": forward, "fwdbwd": forward_backward, "graph": forward_graph}


def bench_layers(results: dict, warmup_ms: float, rep_ms: float) -> None:
    for name, calls in _layer_calls():
        _measure(results, name, {"fwd": calls["fwd"], "fwdbwd": calls["fwdbwd"]}, warmup_ms, rep_ms)
        if name == "layer_all":
            results["layer_all_peak_mib"] = peak_mib(calls["graph"])
            results["layer_all_out_dtype"] = str(calls["fwd"]().dtype)


def _measure(results: dict, prefix: str, fns: dict[str, Callable], warmup_ms: float, rep_ms: float) -> None:
    for suffix, fn in fns.items():
        key = f"{prefix}_{suffix}"
        try:
            started = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            first = time.perf_counter() - started
            results[key] = median_ms(fn, warmup_ms, rep_ms)
            print(f"{key:32s} {results[key]:8.3f} ms   (first call {first:.1f} s)", flush=True)
        except Exception as error:  # one failing measurement must not stop the benchmark
            results.setdefault("errors", {})[key] = f"{type(error).__name__}: {str(error)[:200]}"
            traceback.print_exc()


def busy_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals in µs, as ms: the time at least one kernel runs."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1000


def kernel_summary(events, calls: int) -> dict:
    """Per call of the profiled function: ``gpu_busy_ms`` (:func:`busy_ms` over the CUDA kernel events) and
    ``kernels`` ({name: ms}, largest first) from ``torch.profiler`` events (``name``, ``device_type``,
    ``time_range`` in µs); memory copies and sets count as kernels."""
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    totals: dict[str, float] = {}
    for event in kernels:
        totals[event.name] = totals.get(event.name, 0.0) + (event.time_range.end - event.time_range.start) / 1000
    return {"gpu_busy_ms": busy_ms([(e.time_range.start, e.time_range.end) for e in kernels]) / calls,
            "kernels": {name: ms / calls for name, ms in sorted(totals.items(), key=lambda item: -item[1])}}


def gpu_breakdown(fn: Callable[[], object], calls: int = 20) -> dict:
    """Where ``fn``'s time goes: ``calls`` calls (after one untimed) under ``torch.profiler``; ``wall_ms`` per call
    (host included, the profiler's own overhead too) beside :func:`kernel_summary`'s ``gpu_busy_ms`` and
    ``kernels``. Wall well above busy: the GPU waits on the host (launches, Python, syncs)."""
    fn()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - started) * 1000 / calls
    return {"wall_ms": wall_ms, **kernel_summary(profile.events(), calls)}


def bench_profile(results: dict, warmup_ms: float, rep_ms: float) -> None:
    results["profile"] = {f"{name}_fwdbwd": gpu_breakdown(calls["fwdbwd"]) for name, calls in _layer_calls()}


def profile_table(profile: dict, top: int = 6) -> list[str]:
    """Markdown rows of :func:`gpu_breakdown` results ({what: breakdown}): wall, busy and the ``top`` kernels."""
    lines = ["| call | wall ms | GPU busy ms | largest kernels (ms per call) |", "|---|---:|---:|---|"]
    for what, entry in profile.items():
        largest = ", ".join(f"`{name[:40]}` {ms:.3f}" for name, ms in list(entry["kernels"].items())[:top])
        lines.append(f"| {what} | {entry['wall_ms']:.3f} | {entry['gpu_busy_ms']:.3f} | {largest} |")
    return lines


# ---------------------------------------------------------------------------------------------------------------
# The kernel alone, SDPA, the floor
# ---------------------------------------------------------------------------------------------------------------
def _kernel_inputs(batch: int, tokens: int):
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    shape = (batch, 1, tokens, KERNEL_DIM)
    q, k, v = (torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    weight = (torch.randn(KERNEL_DIM, KERNEL_DIM, KERNEL_K, device=DEVICE, dtype=torch.bfloat16, generator=gen)
              / 24).requires_grad_()
    return q, k, v, weight


def _fused(q, k, v, weight):
    return knn_aggregate_triton(q, k, v, weight, num_neighbors=KERNEL_K, similarity="cosine", weighting="softmax").out


def _sdpa(q, k, v, weight):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v)


def _timed_pair(fn, tensors):
    def forward():
        with torch.no_grad():
            return fn(*tensors)

    def forward_backward():
        fn(*tensors).float().sum().backward()

    return forward, forward_backward


@triton.jit
def _floor_kernel(Q, K, Arg, N, stride_b, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Running max + argmax of q·k over all keys, per query: the selection floor of the fused tiling."""
    pid_m = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + pid_b * stride_b + offs_m[:, None] * D + offs_d[None, :], mask=offs_m[:, None] < N, other=0.0)
    best = tl.full([BLOCK_M], float("-inf"), tl.float32)
    arg = tl.zeros([BLOCK_M], tl.int32)
    for start in range(0, N, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + pid_b * stride_b + offs_n[:, None] * D + offs_d[None, :], mask=offs_n[:, None] < N,
                    other=0.0)
        s = tl.dot(q, tl.trans(k))
        s = tl.where(offs_n[None, :] < N, s, float("-inf"))
        m, at = tl.max(s, axis=1, return_indices=True)
        better = m > best
        best = tl.where(better, m, best)
        arg = tl.where(better, start + at, arg)
    tl.store(Arg + pid_b * N + offs_m, arg, mask=offs_m < N)


def _floor(q, k, v, weight):
    B, _, N, D = q.shape
    arg = torch.empty(B, N, device=DEVICE, dtype=torch.int32)
    _floor_kernel[(triton.cdiv(N, 64), B)](q, k, arg, N, N * D, D=D, BLOCK_M=64, BLOCK_N=64, num_warps=4)
    return arg


def bench_kernel(results: dict, warmup_ms: float, rep_ms: float) -> None:
    for prefix, batch, tokens in (("cifar", 128, 1024), ("n16k_bh16", 16, 16384)):
        tensors = _kernel_inputs(batch, tokens)
        for method, fn in (("fused", _fused), ("sdpa_flash", _sdpa)):
            forward, forward_backward = _timed_pair(fn, tensors)
            _measure(results, f"{prefix}_{method}", {"fwd": forward, "fwdbwd": forward_backward}, warmup_ms, rep_ms)
        q, k = (x.detach() for x in tensors[:2])
        _measure(results, f"{prefix}_floor", {"fwd": lambda q=q, k=k: _floor(q, k, None, None)}, warmup_ms, rep_ms)
    results["by_n_fused_fwd"] = {}
    for tokens in BY_N:
        forward, _ = _timed_pair(_fused, _kernel_inputs(1, tokens))
        local: dict = {}
        _measure(local, "n", {"fwd": forward}, warmup_ms, rep_ms)
        if "n_fwd" in local:
            results["by_n_fused_fwd"][str(tokens)] = local["n_fwd"]


def bench_by_k(results: dict, warmup_ms: float, rep_ms: float) -> None:
    q, k, v, _ = (x.detach() for x in _kernel_inputs(CIFAR["batch"], CIFAR["size"] ** 2))
    for selection in ("fused", "unpacked", "lanes", "rounds"):
        results[f"by_k_{selection}_fwd"] = {}
        for num_neighbors in BY_K:
            weight = torch.randn(KERNEL_DIM, KERNEL_DIM, num_neighbors, device=DEVICE, dtype=torch.bfloat16) / 24

            def forward(num_neighbors=num_neighbors, weight=weight, selection=selection):
                with use_selection("auto" if selection == "fused" else selection):
                    return knn_aggregate_triton(q, k, v, weight, num_neighbors=num_neighbors, similarity="cosine",
                                                weighting="softmax").out

            local: dict = {}
            _measure(local, f"{selection} K={num_neighbors}", {"fwd": forward}, warmup_ms, rep_ms)
            if local:
                results[f"by_k_{selection}_fwd"][str(num_neighbors)] = next(iter(local.values()))


def bench_sweep(results: dict, warmup_ms: float, rep_ms: float) -> None:
    results["sweep"] = {}
    for prefix, batch, tokens in (("cifar", 128, 1024), ("n16k_bh16", 16, 16384)):
        q, k, v, weight = (x.detach() for x in _kernel_inputs(batch, tokens))
        for lanes, block_m, block_n, warps, warm in SWEEP:
            config = dict(LANES=lanes, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, WARM=warm)

            def forward(config=config, q=q, k=k, v=v, weight=weight):
                return function.launch_forward(q, k, v, weight, None, KERNEL_K, "cosine", "softmax", 1.0, 1, None,
                                               False, config=config)

            local: dict = {}
            name = f"{prefix} {'lanes' if lanes else 'rounds'} {block_m}x{block_n} w{warps} warm{warm}"
            _measure(local, name, {"fwd": forward}, warmup_ms, rep_ms)
            results["sweep"].update(local)
    bench_blend(results, warmup_ms, rep_ms)


def bench_blend(results: dict, warmup_ms: float, rep_ms: float) -> None:
    results.setdefault("sweep", {})
    q, k, v, weight = (x.detach() for x in _kernel_inputs(CIFAR["batch"], CIFAR["size"] ** 2))
    grid = BlendGrid(CIFAR["size"], CIFAR["size"], 3, 0.5)
    for lanes, warps, warm, depth, block_n in BLEND_SWEEP:
        config = dict(LANES=lanes, num_warps=warps, WARM=warm, LANE_DEPTH=depth, BLOCK_N=block_n)

        def blend_forward(config=config):
            return function.launch_forward(q, k, v, weight, None, KERNEL_K, "cosine", "none", 1.0, 1, None, True,
                                           grid, config=config)

        local: dict = {}
        name = f"cifar blend {'lanes' if lanes else 'rounds'} depth{depth} {block_n}-wide w{warps} warm{warm}"
        _measure(local, name, {"fwd": blend_forward}, warmup_ms, rep_ms)
        results["sweep"].update(local)


def bench_repair(results: dict, warmup_ms: float, rep_ms: float) -> None:
    results["repair_sweep"] = {}
    for prefix, batch, tokens in (("cifar", 128, 1024), ("n16k_bh16", 16, 16384)):
        q, k, v, weight = (x.detach() for x in _kernel_inputs(batch, tokens))
        block_n = function.fwd_config(KERNEL_K, KERNEL_DIM, KERNEL_DIM, KERNEL_DIM, tokens)["BLOCK_N"]
        for name, variant in REPAIR_SWEEP.items():
            config = {key: block_n if value is None else value for key, value in variant.items()}

            def forward(config=config, q=q, k=k, v=v, weight=weight):
                return function.launch_forward(q, k, v, weight, None, KERNEL_K, "cosine", "softmax", 1.0, 1, None,
                                               False, config=config)

            local: dict = {}
            _measure(local, f"{prefix} {name}", {"fwd": forward}, warmup_ms, rep_ms)
            results["repair_sweep"].update(local)


def bench_packed(results: dict, warmup_ms: float, rep_ms: float) -> None:
    results["packed_sweep"] = {}
    q, k, v, _ = (x.detach() for x in _kernel_inputs(CIFAR["batch"], CIFAR["size"] ** 2))
    for num_neighbors in BY_K:
        weight = torch.randn(KERNEL_DIM, KERNEL_DIM, num_neighbors, device=DEVICE, dtype=torch.bfloat16) / 24
        for name, config in PACKED_SWEEP.items():
            if num_neighbors > 9 and name not in ("default", "packed depth 3", "packed depth 3 DEFER off",
                                                  "packed depth 4 DEFER off"):
                continue

            def forward(config=config, weight=weight, num_neighbors=num_neighbors):
                return function.launch_forward(q, k, v, weight, None, num_neighbors, "cosine", "softmax", 1.0, 1,
                                               None, False, config=config)

            local: dict = {}
            _measure(local, f"cifar K={num_neighbors} {name}", {"fwd": forward}, warmup_ms, rep_ms)
            results["packed_sweep"].update(local)
    forward, _ = _timed_pair(_sdpa, (q, k, v, None))
    _measure(results["packed_sweep"], "cifar sdpa_flash", {"fwd": forward}, warmup_ms, rep_ms)


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------
TARGETS = [  # (what, value from results, bound, "≤")
    ("ConvNN2d all fwd+bwd under autocast, ms", lambda r: r.get("layer_all_fwdbwd"), 1.0),
    ("ConvNN2d all fwd under autocast, ms", lambda r: r.get("layer_all_fwd"), 0.4),
    ("random r=32 fwd+bwd / all fwd+bwd", lambda r: _ratio(r.get("layer_random32_fwdbwd"), r.get("layer_all_fwdbwd")),
     0.5),
    ("ConvNN2d all peak MiB", lambda r: r.get("layer_all_peak_mib"), 50.0),
    ("fused fwd / SDPA-flash fwd, CIFAR kernel config", lambda r: _ratio(r.get("cifar_fused_fwd"),
                                                                         r.get("cifar_sdpa_flash_fwd")), 3.0),
    ("fused fwd / SDPA-flash fwd, N=16384 B·H=16", lambda r: _ratio(r.get("n16k_bh16_fused_fwd"),
                                                                    r.get("n16k_bh16_sdpa_flash_fwd")), 2.0),
    ("fused fwd+bwd / SDPA-flash fwd+bwd, N=16384 B·H=16",
     lambda r: _ratio(r.get("n16k_bh16_fused_fwdbwd"), r.get("n16k_bh16_sdpa_flash_fwdbwd")), 1.0),
    ("blend fwd+bwd / all fwd+bwd", lambda r: _ratio(r.get("layer_blend_fwdbwd"), r.get("layer_all_fwdbwd")), 1.5),
    ("slowest K: default fwd / insertion rounds fwd (by_k)", lambda r: max(
        (_ratio(v, r.get("by_k_rounds_fwd", {}).get(k)) or 0 for k, v in r.get("by_k_fused_fwd", {}).items()),
        default=None), 1.0),
    ("slowest K: default fwd / unpacked lanes fwd (by_k)", lambda r: max(
        (_ratio(v, r.get("by_k_unpacked_fwd", {}).get(k)) or 0 for k, v in r.get("by_k_fused_fwd", {}).items()),
        default=None), 1.0),
]


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def report(results: dict) -> str:
    lines = [f"- GPU: {results['gpu']}; torch {results['torch']}; triton {results['triton']}; {results['date']}",
             "- `python bench/kernel.py` (medians of `triton.testing.do_bench`, ms; MiB for memory)", "",
             "| key | value |", "|---|---:|"]
    for key, value in results.items():
        if isinstance(value, float):
            lines.append(f"| `{key}` | {value:.3f} |")
    for key in ("by_k_fused_fwd", "by_k_unpacked_fwd", "by_k_lanes_fwd", "by_k_rounds_fwd"):
        if results.get(key):
            lines.append(f"| `{key}` K = " + ", ".join(f"{k}: {v:.3f}" for k, v in results[key].items()) + " |")
    by_n = results.get("by_n_fused_fwd", {})
    if by_n:
        lines += ["", "| N (B = 1) | " + " | ".join(by_n) + " |", "|---" * (len(by_n) + 1) + "|",
                  "| fused fwd ms | " + " | ".join(f"{v:.3f}" for v in by_n.values()) + " |"]
        times = list(by_n.values())
        monotone = all(a <= b for a, b in itertools.pairwise(times))
        lines.append(f"\nNo N slower than a larger N: {'yes' if monotone else 'no'}")
    lines += ["", "| target | value | bound | met |", "|---|---:|---:|---|"]
    for what, get, bound in TARGETS:
        value = get(results)
        met = "—" if value is None else ("yes" if value <= bound else "no")
        lines.append(f"| {what} | {'—' if value is None else f'{value:.2f}'} | ≤ {bound:g} | {met} |")
    if results.get("sweep"):
        lines += ["", "Fused forward alone by block size (BLOCK_M×BLOCK_N, warps):", "", "| variant | fwd ms |",
                  "|---|---:|"] + [f"| {k} | {v:.3f} |" for k, v in results["sweep"].items()]
    if results.get("profile"):
        lines += ["", "Where the time goes (torch.profiler, forward + backward):", "",
                  *profile_table(results["profile"])]
    if results.get("errors"):
        lines += ["", "Errors:", ""] + [f"- `{k}`: {v}" for k, v in results["errors"].items()]
    return "\n".join(lines) + "\n"


PARTS = {"layers": bench_layers, "kernel": bench_kernel, "by_k": bench_by_k, "sweep": bench_sweep,
         "packed": bench_packed,
         "repair": bench_repair, "blend": bench_blend, "profile": bench_profile}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    parser.add_argument("--json", type=Path, default=None, help="write the results (bench/results/kernel.json)")
    parser.add_argument("--rep-ms", type=float, default=200, help="timed runs per measurement, in ms (median)")
    parser.add_argument("--warmup-ms", type=float, default=25, help="untimed runs before each measurement, in ms")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="what to measure: the layers, the kernel alone, the forward by K, the block-size "
                        "variants, where each layer's time goes (default: all)")
    parser.add_argument("--selection", choices=function.SELECTIONS, default="auto",
                        help="the selection loop of every part (kernels.knn_triton.use_selection; default: auto)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/kernel.py needs a CUDA GPU")
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "selection": args.selection}
    with use_selection(args.selection):
        for part in args.parts:
            PARTS[part](results, args.warmup_ms, args.rep_ms)
    text = report(results)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
