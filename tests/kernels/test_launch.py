"""The direct launch (``kernels/knn_triton/launch.py``), on a GPU: its launches give the results of Triton's launch
path bit for bit and skip that path, and an input Triton specialises otherwise (an address off 16 bytes) gets the
kernel Triton compiles for it, the fp64 reference's result on every row. (In the interpreter every launch is
Triton's: the rest of ``tests/kernels`` runs through :func:`launch` there.)"""

from __future__ import annotations

import pytest
import torch

from kernels.knn_triton import forward, knn_aggregate_triton, launch
from tests.kernels.every_row import DEVICE, check_every_row, random_inputs

CUDA_ONLY = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")


def _inputs(seed: int):
    return random_inputs(batch=2, heads=1, tokens=300, dim=16, value_dim=16, out_channels=8, num_neighbors=9,
                         depthwise=False, seed=seed, dtype=torch.bfloat16)


@CUDA_ONLY
def test_direct_launches_give_triton_s_results_and_skip_its_launch_path(monkeypatch):
    """The same call three times: through Triton's launch path (``use_direct_launch(False)``), then twice by
    default, of which the second launches ``knn_fwd`` without calling ``JITFunction.run``; outputs, indices and
    gradients equal bit for bit. Then q, k, v one bf16 element (2 bytes) off a 16-byte address: Triton specialises
    them otherwise, so its path compiles a kernel for them, and the result is the reference's on every row."""
    options = dict(num_neighbors=9, similarity="cosine", weighting="softmax")
    *tensors, _groups = _inputs(seed=0)
    runs = []
    calls = []
    run = forward.knn_fwd.run
    monkeypatch.setattr(forward.knn_fwd, "run", lambda *a, **kw: calls.append(1) or run(*a, **kw))
    for direct in (False, True, True):
        leaves = [x.detach().clone().requires_grad_() for x in tensors]
        calls.clear()
        with launch.use_direct_launch(direct):
            result = knn_aggregate_triton(*leaves, **options)
            result.out.float().sum().backward()
        torch.cuda.synchronize()
        runs.append((result.out, result.topk_idx, result.topk_weights, *(leaf.grad for leaf in leaves)))
    assert not calls  # the last call went straight to the compiled launcher
    for triton_path, direct in zip(runs[0], runs[2], strict=True):
        assert torch.equal(triton_path, direct)

    q, k, v, weight, bias = (x.detach() for x in tensors)
    shifted = []
    for x in (q, k, v):
        buffer = torch.empty(x.numel() + 1, device=x.device, dtype=x.dtype)
        view = buffer[1:].view(x.shape)
        view.copy_(x)
        assert view.data_ptr() % 16
        shifted.append(view)
    result = knn_aggregate_triton(*shifted, weight, bias, **options)
    check_every_row(result, *shifted, weight, bias, **options)
