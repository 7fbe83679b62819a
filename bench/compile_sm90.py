"""Compile every variant of the fused kernel for an H100/H200 (sm_90) on a machine without a GPU.

    PYTHONPATH=/path/to/triton-3.6 python bench/compile_sm90.py

Device time is scarce; a Triton compiler failure (Triton 3.6's layout pass crashed on a ``while`` loop in the
selection) shows here in minutes instead. A stand-in driver reports an sm_90 target, the launchers run on CPU
tensors, and each kernel launch is replaced by ``warmup`` (compile only, through ptxas, no launch). Run it with the
Triton of the GPU machine first on ``PYTHONPATH`` (a wheel unpacked with ``pip install --target``) and with the local
one. Each compiled kernel's PTX goes through Triton's own ``ptxas -v`` for sm_90a, which gives its registers a thread
and bytes of spill stores. Prints a line per kernel variant, exits 1 if any failed, and with ``--json PATH`` writes
{triton, kernels: [{name, config, registers, spill_bytes, seconds}]} (``bench/results/compile_sm90.json``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _Sm90:
    """The driver calls a compile needs, for an sm_90 device that is not there."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda

    def get_benchmarker(self):
        return None

    @staticmethod
    def is_active():
        return True


def ptxas_usage(ptx: str) -> tuple[int, int]:
    """(registers a thread, bytes of spill stores) of a kernel's PTX, from Triton's bundled ptxas for sm_90a."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        Path(source).write_text(ptx)
        report = subprocess.run([str(ptxas), "-v", "--gpu-name", "sm_90a", source, "-o", os.devnull],
                                capture_output=True, text=True, check=True).stderr
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    return int(registers.group(1)) if registers else 0, int(spills.group(1)) if spills else 0


def _config(kwargs: dict) -> str:
    """The compile-time choices of a launch (constexprs and launch options), as one readable string."""
    return " ".join(f"{name}={value}" for name, value in kwargs.items()
                    if name.isupper() or name in ("num_warps", "num_stages"))


class _CompileOnly:
    """Stands in for a jit kernel: ``kernel[grid](**kwargs)`` compiles it and records the outcome."""

    def __init__(self, name, kernel, outcomes):
        self.name, self.kernel, self.outcomes = name, kernel, outcomes

    def __getitem__(self, grid):
        def compile_only(**kwargs):
            started = time.perf_counter()
            record = dict(name=self.name, config=_config(kwargs))
            try:
                compiled = self.kernel.warmup(grid=grid, **kwargs)
                registers, spills = ptxas_usage(compiled.asm["ptx"])
                record.update(outcome="ok", registers=registers, spill_bytes=spills)
            except Exception as error:  # report every variant, not only the first failure
                record.update(outcome=f"FAILED {str(error).splitlines()[0][:200]}")
            record["seconds"] = round(time.perf_counter() - started, 1)
            self.outcomes.append(record)
        return compile_only


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write every variant's registers and spills here")
    args = parser.parse_args()
    driver.set_active(_Sm90())
    from kernels.knn_triton import backward, forward, function
    from kernels.reference import BlendGrid

    outcomes: list = []
    function.triton_runs_on = lambda device: True
    for module, names in ((forward, ("knn_fwd", "knn_fwd_repair", "knn_fwd_merge", "key_inv_norms")),
                          (backward, ("knn_bwd_query", "knn_bwd_weight", "knn_bwd_key_sum"))):
        for name in names:
            setattr(module, name, _CompileOnly(name, getattr(module, name), outcomes))
    B, N, D = 2, 300, 64
    for K, dtype, sampled, depthwise in itertools.product((1, 9, 128), (torch.bfloat16, torch.float32),
                                                          (False, True), (False, True)):
        heads, groups = (2, 128) if depthwise else (1, 1)
        q = torch.randn(B, heads, N, D, dtype=dtype)
        w = torch.randn(128 if depthwise else 64, 1 if depthwise else 64, K, dtype=dtype)
        cand = torch.randint(0, N, (B, 160)) if sampled else None
        for selection in function.SELECTIONS:  # every exact selection of the forward (function.use_selection)
            with function.use_selection(selection):
                function.launch_forward(q, q, q, w, None, K, "cosine", "softmax", 1.0, groups, cand, True)
                function.launch_forward(q, q, q, w, w[:, 0, 0], K, "dot", "uniform", 1.0, groups, cand, False,
                                        num_splits=2)
        if not sampled:  # a warm start for every key (bench/kernel.py's sweep; the blend rule's default)
            function.launch_forward(q, q, q, w, None, K, "cosine", "softmax", 1.0, groups, cand, True,
                                    config=dict(LANES=False, WARM=1))
        idx, a = torch.zeros(B, heads, N, K, dtype=torch.int64), torch.zeros(B, heads, N, K)
        grad_out = torch.randn(B, w.shape[0], N, dtype=dtype)
        function.launch_backward(grad_out, None, q, q, q, w, idx, a, "cosine", "softmax", 1.0, groups, (True,) * 5)
    for dtype, window in itertools.product((torch.bfloat16, torch.float32), (3, 5)):
        q = torch.randn(B, 1, 42, D, dtype=dtype)
        w = torch.randn(64, 64, 9, dtype=dtype)
        for selection in function.SELECTIONS:
            with function.use_selection(selection):
                function.launch_forward(q, q, q, w, None, 9, "cosine", "none", 1.0, 1, None, True,
                                        BlendGrid(6, 7, window, 0.5))
    for record in outcomes:
        usage = f"{record['registers']} registers, {record['spill_bytes']} B spilled" if "registers" in record else ""
        print(f"  {record['name']} [{record['config']}]: {record['outcome']} {usage} ({record['seconds']} s)")
    failed = [record for record in outcomes if record["outcome"] != "ok"]
    print(f"triton {triton.__version__}: {len(outcomes)} kernels compiled for sm_90, {len(failed)} failed")
    if args.json:
        args.json.write_text(json.dumps(dict(triton=triton.__version__, kernels=outcomes), indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
