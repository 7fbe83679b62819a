"""Host cost of the fused path's Python, without a GPU: a ``ConvNN2d`` "all" layer's forward and backward under
fp16 autocast on the CPU, ``backend="triton"`` in Triton's interpreter with every kernel launch stubbed out (the
launches return at once), so what is timed is the layer's Python, the dispatch, the checks, the launch
configuration and the PyTorch operators around the kernels (on a tiny 2×64×4×4 input: their compute is small).

    python bench/host_path.py                   # this checkout
    python bench/host_path.py --root OTHER_TREE # another checkout's kernels/ and convnn/, for an A/B on one machine

Prints the best of 7 rounds of 200 calls (µs a call). On a GPU the same code runs before and around the real
launches (bench/RESULTS.md §1r: the layer there is host-bound); this bench ranks host-path changes without one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="the checkout whose kernels/ and convnn/ are timed (default: this one)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, args.root)
    import torch

    from convnn import ConvNN2d
    from kernels.knn_triton import backward, forward

    class Stub:  # kernel[grid](...) that launches nothing
        def __getitem__(self, grid):
            return lambda *a, **k: None

    for module in (forward, backward):
        for name in dir(module):
            if name.startswith(("knn_", "key_")) and hasattr(getattr(module, name), "run"):
                setattr(module, name, Stub())
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(2, 64, 4, 4, requires_grad=True)
    layer = ConvNN2d(64, 64, num_neighbors=9, backend="triton").train()

    def step():
        with torch.autocast("cpu", torch.float16):
            out = layer(x)
        out.float().sum().backward()

    for _ in range(20):
        step()
    best = float("inf")
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.calls):
            step()
        best = min(best, (time.perf_counter() - start) / args.calls * 1e6)
    print(f"{args.root}: {best:.0f} µs a forward + backward (best of {args.rounds} × {args.calls})")


if __name__ == "__main__":
    main()
