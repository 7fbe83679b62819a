"""One launch of each forward kernel of bench/kernel.py's kernel part, for Nsight Compute (one CUDA GPU):

    ncu --clock-control none --profile-from-start off --set full --import-source yes -o fwd python bench/ncu_forward.py

Profiled, after a warm-up that compiles them: the fused forward at the CIFAR kernel configuration (B = 128, N = 1024,
d = 64, K = 9, bf16, cosine, softmax weighting) and at N = 16384, B = 16, then the selection floor (running max +
argmax, the same tiling) at both. ``--config`` overrides the forward's block sizes (``function.fwd_config``
entries), e.g. ``--config BLOCK_M=32 num_warps=2``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kernel  # bench/kernel.py

from kernels.knn_triton import function


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="*", default=[], help="fwd_config overrides, NAME=INT")
    args = parser.parse_args()
    config = {name: int(value) for name, value in (item.split("=", 1) for item in args.config)}
    cases = [[x.detach() for x in kernel._kernel_inputs(batch, tokens)] for batch, tokens in ((128, 1024), (16, 16384))]

    def forward(q, k, v, weight):
        return function.launch_forward(q, k, v, weight, None, kernel.KERNEL_K, "cosine", "softmax", 1.0, 1, None,
                                       False, config=config or None)

    for q, k, v, weight in cases:  # compile and warm up outside the profiled range
        forward(q, k, v, weight)
        kernel._floor(q, k, None, None)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for q, k, v, weight in cases:
        forward(q, k, v, weight)
        kernel._floor(q, k, None, None)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
