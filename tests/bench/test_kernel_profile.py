"""bench/kernel.py's profile part: GPU-busy time and per-kernel totals from profiler events (numbers by hand)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import kernel


def _event(name: str, start: float, end: float, device=DeviceType.CUDA) -> SimpleNamespace:
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end))


def test_busy_time_is_the_union_of_the_kernels_intervals():
    # [0, 10] ∪ [5, 20] ∪ [12, 15] ∪ [30, 40] = [0, 20] ∪ [30, 40]: 30 µs
    assert kernel.busy_ms([(30, 40), (0, 10), (12, 15), (5, 20)]) == pytest.approx(0.030)
    assert kernel.busy_ms([]) == 0.0


def test_kernel_totals_are_per_call_largest_first_and_skip_host_events():
    events = [_event("knn_fwd", 0, 400), _event("aten::mm", 0, 900, DeviceType.CPU), _event("knn_bwd_dw", 500, 700),
              _event("knn_fwd", 1000, 1400), _event("knn_bwd_dw", 1300, 1500)]
    summary = kernel.kernel_summary(events, calls=2)
    assert summary["kernels"] == pytest.approx({"knn_fwd": 0.4, "knn_bwd_dw": 0.2})  # (400 + 400) / 2 µs, …
    assert list(summary["kernels"]) == ["knn_fwd", "knn_bwd_dw"]
    assert summary["gpu_busy_ms"] == pytest.approx(0.55)  # [0, 400] ∪ [500, 700] ∪ [1000, 1500] = 1100 µs / 2
    rows = kernel.profile_table({"layer_all_fwdbwd": {"wall_ms": 1.5, **summary}})
    assert rows[-1] == "| layer_all_fwdbwd | 1.500 | 0.550 | `knn_fwd` 0.400, `knn_bwd_dw` 0.200 |"
