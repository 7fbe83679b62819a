"""Training-step time of a preset's model on real CIFAR-10 images, one GPU, per warm-start setting of the kernel;
or on the CPU.

    python bench/train_step.py --data-root DIR --presets cnn3-l0.5 cnn3-l0.5-blend0.5 --warm default 0 1 16
    python bench/train_step.py --device cpu --presets cnn3-l0 cnn3-l0.5 cnn3-l0.5-blend0.25 \
        --json bench/results/train_step_cpu.json

A step is what ``convnn.train`` does per batch (forward under bf16 autocast, cross-entropy, backward, SGD step) on
the preset's batch size, timed with ``triton.testing.do_bench`` (median, ms; host time included, since a step
waits for nothing else). The batch is the first images of the lite training set, normalised as in training; the
same batch every step (no loader or augmentation cost). ``--warm`` sets ``fwd_config``'s ``WARM`` for every
ConvNN layer (``default``: each rule's own, 4 tiles for blend and none otherwise): real features have neighbours
near each query, which the bench's random features in ``bench/kernel.py`` do not. ``--selections`` times each
selection loop beside the default (:func:`kernels.knn_triton.use_selection`; keys ``"<preset> warm=W"`` for the
default, ``"<preset> warm=W selection=S"`` for the others). Prints a table and writes
``--json``; the per-epoch estimate is steps per epoch (50,000 / batch) × the step. ``--profile`` also puts each
step under ``torch.profiler`` (``kernel.gpu_breakdown``: wall vs GPU-busy time, the largest kernels).

``--compile`` also times each step with the model under ``torch.compile(fullgraph=True)`` (Inductor; keys
``"<key> compiled"``), after checking that the compiled step's loss and gradients match the eager step's (bf16:
within 2e-2 relative) and that the graph calls the fused kernel as the operator ``convnn::knn_fused``
(docs/method.md §9): the GPU check of Library II, e.g.

    python bench/train_step.py --data-root DIR --presets cnn3-l0.5 cnn3-l0.5-blend0.5 cnn3-l0 --warm default \
        --selections auto rounds --compile --json bench/results/train_step.json

``--device cpu`` times the same step in fp32 (no autocast) on ``--batch-size`` seeded random 32×32 images (64 by
default; no data needed) with ``--threads`` threads (2): one warm-up step, then the best of ``--repeats`` (2) steps
by the wall clock, and the 60-epoch estimate, 50,000 / batch steps per epoch (what bench/RESULTS.md §5 states for
2026-12-05); the JSON also records the 1-minute load average before and after, since other work on the cores
slows the steps.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel import gpu_breakdown, profile_table

from convnn import create_model
from convnn.data import load_cifar10, normalize
from convnn.presets import preset
from convnn.train import _hardware  # what a training card records
from kernels.knn_triton import function, use_selection

TRAIN_IMAGES, CPU_EPOCHS = 50_000, 60


def _step_fn(name: str, images: torch.Tensor, labels: torch.Tensor, compiled: bool = False,
             backend: str = "inductor"):
    """One training step of preset ``name``'s model on the first images of the batch, on the images' device (bf16
    autocast on a GPU, fp32 on the CPU), the model under ``torch.compile(fullgraph=True, backend=backend)`` if
    ``compiled``; returns (step, batch size, model)."""
    recipe = preset(name)
    torch.manual_seed(0)  # the same weights for the eager and the compiled step
    model = create_model(recipe["model"], **recipe["model_args"], num_classes=10).to(images.device).train()
    forward = torch.compile(model, fullgraph=True, backend=backend) if compiled else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = images[:recipe["batch_size"]], labels[:recipe["batch_size"]]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
            logits = forward(x)
        loss = F.cross_entropy(logits.float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    return step, len(x), model


def _check_compiled(name: str, images: torch.Tensor, labels: torch.Tensor) -> None:
    """Raise ``AssertionError`` unless preset ``name``'s first compiled training step (fullgraph: no graph break)
    has the eager step's loss and gradients (bf16: 2e-2 relative) and, where the eager step ran the fused kernel,
    its graph calls ``convnn::knn_fused`` (``--compile``; docs/method.md §9). The step is compiled with the
    ``aot_eager`` backend for this check: Inductor's bf16 fusions round the features differently, which flips
    near-tied top-K selections (one λ = 0.5 step on an H100, 2026-12-06: loss 2.4434 eager, 2.4352 Inductor, 2.4434
    aot_eager), so only the timing uses Inductor."""
    from kernels import record_backends

    results = []
    for compiled in (False, True):
        torch._dynamo.reset()
        step, _, model = _step_fn(name, images, labels, compiled, backend="aot_eager")
        with record_backends() as used:
            loss = step().item()
        grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
        results.append((loss, grads, used))
    (loss, grads, used), (loss_c, grads_c, _) = results
    assert abs(loss - loss_c) <= 2e-2 * abs(loss), f"{name}: compiled loss {loss_c} vs eager {loss}"
    error = ((grads_c - grads).norm() / grads.norm()).item()
    assert error <= 2e-2, f"{name}: compiled gradients differ from eager by {error:.3g} (relative norm)"
    targets: set = set()

    def capture(gm, example_inputs):
        targets.update(node.target for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        torch.compile(model, fullgraph=True, backend=capture)(images[:8])
    if "triton" in used:
        assert torch.ops.convnn.knn_fused.default in targets, f"{name}: the graph does not call convnn::knn_fused"
    print(f"{name}: compiled step = eager step (loss {loss:.4f}, gradients within {error:.1e}); fused operator in "
          f"the graph: {torch.ops.convnn.knn_fused.default in targets}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", help="the CIFAR-10 pack (train_lite.jpg, meta.npz, …); GPU only")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--batch-size", type=int, default=64, help="CPU: random images per step. Default: 64")
    parser.add_argument("--threads", type=int, default=2, help="CPU: torch threads. Default: 2")
    parser.add_argument("--repeats", type=int, default=2, help="CPU: timed steps after a warm-up. Default: 2")
    parser.add_argument("--presets", nargs="+", default=["cnn3-l0.5", "cnn3-l0.5-blend0.5"])
    parser.add_argument("--warm", nargs="+", default=["default", "0", "1", "16"],
                        help="WARM values to time ('default': each rule's own)")
    parser.add_argument("--selections", nargs="+", default=["auto"], choices=function.SELECTIONS,
                        help="selection loops to time ('auto': the default)")
    parser.add_argument("--rep-ms", type=float, default=2000)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", action="store_true", help="also profile each step: wall vs GPU busy, kernels")
    parser.add_argument("--compile", action="store_true",
                        help="GPU: also check and time each step under torch.compile(fullgraph=True)")
    args = parser.parse_args()
    if args.device == "cpu":
        return _cpu(args)
    if not torch.cuda.is_available() or args.data_root is None:
        raise SystemExit("bench/train_step.py on a GPU needs a CUDA GPU and --data-root")
    images, labels = load_cifar10(args.data_root, "train", lite=True)
    images = normalize(torch.from_numpy(images[:1024]).cuda())
    labels = torch.from_numpy(labels[:1024]).cuda()
    default_config = function.fwd_config
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print("| preset | WARM | selection | step ms | epoch estimate s |\n|---|---|---|---:|---:|")
    for name in args.presets:
        for warm in args.warm:
            function.fwd_config = default_config if warm == "default" else (
                lambda *sizes, warm=int(warm), **options: default_config(*sizes, **options) | {"WARM": warm})
            for selection, compiled in itertools.product(args.selections, (False, True) if args.compile else (False,)):
                key = f"{name} warm={warm}" + ("" if selection == "auto" else f" selection={selection}")
                key += " compiled" if compiled else ""
                with use_selection(selection):
                    if compiled and warm == args.warm[0] and selection == args.selections[0]:
                        _check_compiled(name, images, labels)
                    torch._dynamo.reset()
                    step, batch, _ = _step_fn(name, images, labels, compiled)
                    step()  # compiles
                    ms = triton.testing.do_bench(step, warmup=200, rep=args.rep_ms)
                    results[key] = ms
                    print(f"| {name} | {warm} | {selection}{' compiled' if compiled else ''} | {ms:.2f} | "
                          f"{ms * TRAIN_IMAGES / batch / 1000:.2f} |", flush=True)
                    if args.profile:
                        results.setdefault("profile", {})[key] = gpu_breakdown(step, calls=10)
    function.fwd_config = default_config
    if args.profile:
        print("", *profile_table(results["profile"]), sep="\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def _cpu(args: argparse.Namespace) -> None:
    """``--device cpu`` (module docstring): a table of the best step time per preset, and ``--json``."""
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch_size, 3, 32, 32, generator=generator)
    labels = torch.randint(0, 10, (args.batch_size,), generator=generator)
    results = {"hardware": _hardware(torch.device("cpu"), 1), "threads": args.threads, "batch": args.batch_size,
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "step_s": {},
               "load_average_1min": {"start": round(os.getloadavg()[0], 2)}}  # other work on the cores skews it
    print(f"| preset | step s (best of {args.repeats}) | {CPU_EPOCHS}-epoch estimate h |\n|---|---:|---:|")
    for name in args.presets:
        step, batch, _ = _step_fn(name, images, labels)
        step()  # warm-up
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            step()
            seconds.append(time.perf_counter() - start)
        results["step_s"][name] = round(min(seconds), 3)
        hours = min(seconds) * TRAIN_IMAGES / batch * CPU_EPOCHS / 3600
        print(f"| {name} | {min(seconds):.2f} | {hours:.0f} |", flush=True)
    results["load_average_1min"]["end"] = round(os.getloadavg()[0], 2)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
