"""Training-step time of a preset's model on real CIFAR-10 images, one GPU, per warm-start setting of the kernel.

    python bench/train_step.py --data-root DIR --presets cnn3-l0.5 cnn3-l0.5-blend0.5 --warm default 0 1 16

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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernel import gpu_breakdown, profile_table

from convnn import create_model
from convnn.data import load_cifar10, normalize
from convnn.presets import preset
from kernels.knn_triton import function, use_selection


def _step_fn(name: str, images: torch.Tensor, labels: torch.Tensor):
    recipe = preset(name)
    model = create_model(recipe["model"], **recipe["model_args"], num_classes=10).cuda().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = images[:recipe["batch_size"]], labels[:recipe["batch_size"]]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step, len(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True, help="the CIFAR-10 pack (train_lite.jpg, meta.npz, …)")
    parser.add_argument("--presets", nargs="+", default=["cnn3-l0.5", "cnn3-l0.5-blend0.5"])
    parser.add_argument("--warm", nargs="+", default=["default", "0", "1", "16"],
                        help="WARM values to time ('default': each rule's own)")
    parser.add_argument("--selections", nargs="+", default=["auto"], choices=function.SELECTIONS,
                        help="selection loops to time ('auto': the default)")
    parser.add_argument("--rep-ms", type=float, default=2000)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--profile", action="store_true", help="also profile each step: wall vs GPU busy, kernels")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/train_step.py needs a CUDA GPU")
    images, labels = load_cifar10(args.data_root, "train", lite=True)
    images = normalize(torch.from_numpy(images[:1024]).cuda())
    labels = torch.from_numpy(labels[:1024]).cuda()
    default_config = function.fwd_config
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    print("| preset | WARM | selection | step ms | epoch estimate s |\n|---|---|---|---:|---:|")
    for name in args.presets:
        for warm in args.warm:
            function.fwd_config = default_config if warm == "default" else (
                lambda *sizes, warm=int(warm), **options: default_config(*sizes, **options) | {"WARM": warm})
            for selection in args.selections:
                key = f"{name} warm={warm}" + ("" if selection == "auto" else f" selection={selection}")
                with use_selection(selection):
                    step, batch = _step_fn(name, images, labels)
                    step()  # compiles
                    ms = triton.testing.do_bench(step, warmup=200, rep=args.rep_ms)
                    results[key] = ms
                    print(f"| {name} | {warm} | {selection} | {ms:.2f} | {ms * 50000 / batch / 1000:.2f} |",
                          flush=True)
                    if args.profile:
                        results.setdefault("profile", {})[key] = gpu_breakdown(step, calls=10)
    function.fwd_config = default_config
    if args.profile:
        print("", *profile_table(results["profile"]), sep="\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
