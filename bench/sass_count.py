"""Instructions of the fused forward's loops, counted in its sm_90a SASS on a machine without a GPU.

    PYTHONPATH=/path/to/triton-3.6 python bench/sass_count.py [--config LANE_DEPTH=3 BLOCK_N=32 num_warps=4] [--blend]

The forward is ALU-bound (Nsight Compute, bench/RESULTS.md §1e: the ALU pipe 78–79 % busy, tensor and memory pipes
idle), so the instructions a thread issues per score bound its time; a change to the selection can be counted here
in seconds before a GPU times it. ``knn_fwd`` (and ``knn_fwd_repair``, ``key_inv_norms``) are compiled for the CIFAR
kernel configuration (N = 1,024, d = 64, K = 9, bf16, cosine, softmax; ``function.fwd_config``'s defaults, or
``--config`` overrides; ``--blend``: the blend layer's call of ``bench/kernel.py`` instead — a 32×32 map, 3×3
window, α = 0.5, weighting none, the query first) with the stand-in sm_90 driver of ``bench/compile_sm90.py``,
assembled with Triton's bundled ``ptxas`` and disassembled with its ``nvdisasm``. Each loop of the SASS (a
backward branch) is listed with its static instruction count — a branch inside a loop counts whole — and the source
lines its instructions come from (the lanes' stream: one tile a trip, ``BLOCK_M · BLOCK_N / threads`` scores a
thread; the end of the row: one rank a trip; the Conv1D: one rank slot a trip).
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.runtime import driver

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import compile_sm90  # bench/compile_sm90.py

_INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)")
_SOURCE = re.compile(r'File "(.*?)", line (\d+)')
_BRANCH = re.compile(r"BRA\s+`?\(?(\.L_x_\d+)")


def loops(sass: str) -> list[dict]:
    """Each loop of a kernel's SASS text (``nvdisasm -g``): {head, instructions, lines: {"file:line": {opcode: n}}},
    a loop being the span from a label to a branch back to it."""
    rows, labels, current = [], {}, "?"
    for text in sass.splitlines():
        source = _SOURCE.search(text)
        if source:
            current = f"{Path(source.group(1)).name}:{source.group(2)}"
        elif text.startswith(".L_x_") and text.rstrip().endswith(":"):
            labels[text.strip()[:-1]] = len(rows)
        elif match := _INSTRUCTION.match(text):
            branch = _BRANCH.search(text)
            rows.append((current, match.group(3), branch.group(1) if branch else None))
    found = []
    for end, (_, _, target) in enumerate(rows):
        if target in labels and labels[target] <= end:
            lines: dict = collections.defaultdict(collections.Counter)
            for where, opcode, _ in rows[labels[target]:end + 1]:
                lines[where][opcode] += 1
            found.append(dict(head=target, instructions=end + 1 - labels[target], lines=lines))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="*", default=[], help="fwd_config overrides, NAME=INT")
    parser.add_argument("--lines", type=int, default=8, help="source lines listed a loop")
    parser.add_argument("--blend", action="store_true", help="the blend layer's call (32×32 map, 3×3 window)")
    args = parser.parse_args()
    config = {name: int(value) for name, value in (item.split("=", 1) for item in args.config)}
    driver.set_active(compile_sm90._Sm90())
    from kernels.knn_triton import forward, function
    from kernels.reference import BlendGrid

    function.triton_runs_on = lambda device: True
    compiled = {}

    class _Keep:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def compile_only(**kwargs):
                compiled[self.name] = self.kernel.warmup(grid=grid, **kwargs)
            return compile_only

    for name in ("knn_fwd", "knn_fwd_repair", "key_inv_norms"):
        setattr(forward, name, _Keep(name, getattr(forward, name)))
    q = torch.randn(2, 1, 1024, 64, dtype=torch.bfloat16)
    weight = torch.randn(64, 64, 9, dtype=torch.bfloat16)
    blend = BlendGrid(32, 32, 3, 0.5) if args.blend else None
    function.launch_forward(q, q, q, weight, None, 9, "cosine", "none" if blend else "softmax", 1.0, 1, None,
                            blend is not None, blend=blend, config=config or None)
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    num_cols = blend.num_cells if blend else 1024
    print(f"triton {triton.__version__}, sm_90a; {'blend, ' if blend else ''}config "
          f"{function.fwd_config(9, 64, 64, 64, num_cols, blend=blend is not None) | config}")
    for name, kernel in compiled.items():
        with tempfile.TemporaryDirectory() as folder:
            ptx, cubin = Path(folder) / "k.ptx", Path(folder) / "k.cubin"
            ptx.write_text(kernel.asm["ptx"])
            subprocess.run([str(tools / "ptxas"), "--gpu-name", "sm_90a", str(ptx), "-o", str(cubin)], check=True)
            sass = subprocess.run([str(tools / "nvdisasm"), "-c", "-g", str(cubin)], capture_output=True, text=True,
                                  check=True).stdout
        registers, spills = compile_sm90.ptxas_usage(kernel.asm["ptx"])
        print(f"\n{name}: {registers} registers, {spills} B spilled")
        for loop in loops(sass):
            top = sorted(loop["lines"].items(), key=lambda item: -sum(item[1].values()))[:args.lines]
            print(f"  loop {loop['head']}: {loop['instructions']} instructions a trip")
            for where, opcodes in top:
                print(f"    {sum(opcodes.values()):5d}  {where:22s} {dict(opcodes.most_common(4))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
