"""Layers under autocast hand the fused kernel their operands in the autocast dtype (kernels.autocast).

On the GPU: CUDA autocast to bf16. On CPU through Triton's interpreter: CPU autocast to fp16 (the interpreter's
bf16 arithmetic is wrong; its fp16 is right). Each layer runs once on the kernel and once on the reference under
the same autocast; the dtype the kernel received is read from its entry, and each kernel call is checked against
the fp64 reference on every row (``every_row.check_every_row``, the half-precision tolerances).
"""

from __future__ import annotations

import copy

import pytest
import torch

from convnn import ConvNN2d, HybridConvNN2d
from convnn.layers.attention import ConvNNAttention, KVTAttention
from kernels.knn_triton import function
from tests.kernels.every_row import DEVICE, check_every_row

DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16
TOL = dict(rtol=3e-2, atol=3e-2)

LAYERS = {
    "convnn2d-all": lambda: ConvNN2d(8, 8, num_neighbors=5),
    "convnn2d-random": lambda: ConvNN2d(8, 8, num_neighbors=5, selection="random", num_candidates=16),
    "convnn2d-softmax-qk": lambda: ConvNN2d(8, 8, num_neighbors=5, weighting="softmax", qk_dim=4),
    "hybrid": lambda: HybridConvNN2d(8, 8, branch_ratio=0.5, num_neighbors=5),
    "convnn-attention": lambda: ConvNNAttention(8, num_heads=2, num_neighbors=5, weighting="softmax"),
    "kvt": lambda: KVTAttention(8, num_heads=2, num_neighbors=5, weighting="softmax"),
}


def _set_backend(module: torch.nn.Module, backend: str) -> None:
    for layer in module.modules():
        if hasattr(layer, "backend"):
            layer.backend = backend


@pytest.mark.parametrize("name", list(LAYERS))
def test_layers_under_autocast_run_the_kernel_in_the_autocast_dtype(name, monkeypatch):
    torch.manual_seed(0)
    layer = LAYERS[name]().to(DEVICE).eval()
    reference = copy.deepcopy(layer)
    _set_backend(layer, "triton")
    _set_backend(reference, "reference")
    x = torch.randn(2, 8, 5, 6, device=DEVICE) if "attention" not in name and name != "kvt" else torch.randn(
        2, 30, 8, device=DEVICE)
    seen, calls = [], []
    entry = function.aggregate_prechecked

    def spy(q, k, v, weight, bias, originals=None, **options):
        seen.append({t.dtype for t in (q, k, v, weight) + ((bias,) if bias is not None else ())})
        calls.append((entry(q, k, v, weight, bias, originals=originals, **options), (q, k, v, weight, bias),
                      options))
        return calls[-1][0]

    monkeypatch.setattr(function, "aggregate_prechecked", spy)
    with torch.autocast(DEVICE, DTYPE):
        out = layer(x)
        expected = reference(x)
    assert seen and all(dtypes == {DTYPE} for dtypes in seen)
    for result, args, options in calls:
        check_every_row(result, *args, **options)
    assert out.dtype == expected.dtype == DTYPE
    torch.testing.assert_close(out.float(), expected.float(), **TOL)
    x.requires_grad_(True)
    with torch.autocast(DEVICE, DTYPE):
        out, expected = layer(x), reference(x)
    out.float().square().sum().backward()
    grads = [p.grad for p in layer.parameters() if p.requires_grad] + [x.grad]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)
    x.grad = None
    expected.float().square().sum().backward()  # the reference's casts carry its gradients back (autocast.linked)
    expected_grads = [p.grad for p in reference.parameters() if p.requires_grad] + [x.grad]
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want, rtol=5e-2, atol=5e-2 * want.abs().max().item())
