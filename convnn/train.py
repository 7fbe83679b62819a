"""Train a ConvNN model: ``python -m convnn.train``, one process or many under ``torchrun`` (DDP).

Single process (GPU if present, else CPU)::

    python -m convnn.train --preset cnn-l0.5 --data-root ../shared/data/cifar10 --out runs

One machine, 4 GPUs (``--batch-size`` is the global batch; each rank gets an equal share)::

    torchrun --standalone --nproc_per_node=4 -m convnn.train --preset cnn-l0.5 --data-root ... --out runs

Several machines (run on each; rank 0's host is the rendezvous endpoint)::

    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST0:29500 \\
        -m convnn.train --preset imagenet-resnet50-hybrid --data imagefolder --data-root /data/imagenet --out runs

Writes under ``--out``: ``NAME.log.jsonl`` (one JSON line per epoch: train/test loss and accuracy, learning rate,
epoch time), ``NAME.resume.pt`` (state to continue with ``--resume``: weights, optimiser and every random stream of
every rank — global, augmentation, mixing and each random layer's candidates — so a resumed run continues exactly as
an uninterrupted one would, bit for bit on a CPU, given the same number of processes), and at the end the checkpoint
``NAME.safetensors`` + ``NAME.json`` (the model card, whose ``test_top1``/``test_loss`` are those of the weights as
stored in ``--save-dtype``; for int8 also the trained model's, with ``_before_quantization``). Only rank 0 logs and
writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from kernels import BACKENDS, record_backends, use_backend

from .card import MAX_INPUT_SIZE
from .checkpoint import WEIGHTS_DTYPES, ModelCard, save_checkpoint
from .data import (
    CIFAR10_CLASSES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    DeviceLoader,
    FolderLoader,
    data_fingerprint,
    load_cifar10,
    mix_batch,
    synthetic_images,
)
from .metrics import draw_evaluation, draw_metrics, summarize_draws, test_metrics
from .models import create_model, list_models
from .presets import preset
from .resume import RandomStreams, load_resume, save_resume
from .validation import SEED_RANGE, check_choice, check_int, check_nonnegative, check_positive, check_ratio, derive_seed

log = logging.getLogger("convnn.train")


def _setting(default, help_text: str):
    """A :class:`TrainConfig` field: its default and its ``--help`` text."""
    return field(default=default, metadata={"help": help_text})


@dataclass
class TrainConfig:
    """Everything a run depends on; saved in the model card as the recipe. Each field is a flag (``--help``)."""

    name: str = _setting("model", "the run's name: it writes NAME.json, NAME.safetensors, NAME.log.jsonl and "
                                  "NAME.resume.pt (a preset names it, with -sSEED for --seed)")
    model: str = _setting("convnn_resnet_cifar", "registered model (convnn.models.list_models())")
    model_args: dict = field(default_factory=dict,
                             metadata={"help": "JSON object of model arguments, merged into the preset's"})
    data: str = _setting("cifar10", "cifar10 | imagefolder | synthetic (generated images, no files: to try the CLI)")
    data_root: str | None = _setting(None, "cifar10: the folder holding cifar-10-batches-py/ (unpacked from "
                                           "cifar-10-python.tar.gz) or the offline pack (default: $CONVNN_CIFAR10); "
                                           "imagefolder: the folder holding train/ and val/")
    lite: bool = _setting(False, "read the offline pack's train_lite.jpg (a smaller, coarser JPEG)")
    subset: int | None = _setting(None, "use only the first N train and N test images (synthetic data: N of each, "
                                        "512 without it)")
    image_size: int = _setting(224, "input side in pixels of imagefolder and synthetic data (CIFAR-10 is 32)")
    num_classes: int = _setting(10, "classes of synthetic data")
    epochs: int = _setting(30, "epochs")
    batch_size: int = _setting(512, "global batch, split over the ranks; at most the training images")
    optimizer: str = _setting("sgd", "sgd (Nesterov) | adamw")
    lr: float = _setting(0.2, "peak learning rate: linear warm-up to it, then cosine decay to 0")
    weight_decay: float = _setting(5e-4, "weight decay (not on biases, norms and other 1-D parameters)")
    momentum: float = _setting(0.9, "SGD momentum")
    warmup_epochs: float = _setting(2.0, "epochs of linear warm-up")
    label_smoothing: float = _setting(0.1, "label smoothing of the cross-entropy, in [0, 1]")
    mixup_alpha: float = _setting(0.0, "> 0: mixup on half the batches, cutmix on the other half, Beta(α, α)")
    seed: int = _setting(0, "seed of the data order, augmentation, mixing and the random layers' candidates")
    out: str = _setting("runs", "folder the run writes to")
    backend: str = _setting("auto", "ConvNN aggregation: auto | reference | triton")
    amp: bool = _setting(True, "bf16 autocast on CUDA")
    save_dtype: str = _setting("float16", "how the checkpoint stores the weights: float16 | bfloat16 | float32 | "
                                          "int8 (the card's test metrics are the stored weights')")
    max_steps: int | None = _setting(None, "stop after this many training steps (smoke tests)")
    num_workers: int = _setting(8, "imagefolder loader processes")
    resume: bool = _setting(False, "continue the run from NAME.resume.pt")

    def check(self) -> None:
        """Raise ``ValueError`` naming the first field outside its range (before any data is loaded)."""
        choices = {"data": ("cifar10", "imagefolder", "synthetic"), "optimizer": ("sgd", "adamw"),
                   "backend": BACKENDS, "save_dtype": WEIGHTS_DTYPES, "model": tuple(list_models())}
        for name, allowed in choices.items():
            check_choice(name, getattr(self, name), allowed)
        if not isinstance(self.model_args, dict):
            raise ValueError(f"model_args must be a JSON object, got {self.model_args!r}")
        integers = {"epochs": 1, "batch_size": 1, "num_classes": 1, "num_workers": 0, "subset": 1, "max_steps": 1}
        for name, low in integers.items():
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), low)
        check_int("seed", self.seed, *SEED_RANGE)
        check_int("image_size", self.image_size, 1, MAX_INPUT_SIZE)  # the card's input_size
        check_positive("lr", self.lr)
        check_ratio("momentum", self.momentum)
        for name in ("weight_decay", "warmup_epochs", "mixup_alpha"):
            check_nonnegative(name, getattr(self, name))
        check_nonnegative("label_smoothing", self.label_smoothing, 1)  # 1: every target uniform


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Defaults ← ``--preset`` ← ``--config`` JSON ← explicit flags."""
    parser = argparse.ArgumentParser(prog="python -m convnn.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help="named preset (convnn/presets.py)")
    parser.add_argument("--config", help="JSON file of TrainConfig fields")
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        shown = "" if f.default in (None, dataclasses.MISSING) else f" (default: {f.default})"
        if f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                                help=f.metadata["help"] + shown)
        else:
            kind = {"int": int, "float": float, "int | None": int, "dict": json.loads}.get(f.type, str)
            parser.add_argument(flag, type=kind, default=None, help=f.metadata["help"] + shown)
    args = parser.parse_args(argv)
    values: dict = preset(args.preset) if args.preset else {}
    if args.preset:
        values.setdefault("name", args.preset)
    if args.config:
        try:
            loaded = json.loads(Path(args.config).read_text())
        except (OSError, json.JSONDecodeError) as err:
            parser.error(f"--config {args.config}: {err}")
        if not isinstance(loaded, dict):
            parser.error(f"--config {args.config}: must hold a JSON object of TrainConfig fields")
        values.update(loaded)
    for f in dataclasses.fields(TrainConfig):
        given = getattr(args, f.name)
        if given is None:
            continue
        if f.name == "model_args" and not isinstance(given, dict):
            parser.error(f"--model-args must be a JSON object, got {given!r}")
        values[f.name] = {**values.get("model_args", {}), **given} if f.name == "model_args" else given
    unknown = values.keys() - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        parser.error(f"unknown config fields {sorted(unknown)}")
    if args.name is None and args.seed is not None and "name" in values:
        values["name"] = f"{values['name']}-s{args.seed}"  # one file per seed of the same preset
    config = TrainConfig(**values)
    try:
        config.check()
    except ValueError as err:
        parser.error(str(err))
    return config


def learning_rate(step: int, total_steps: int, warmup_steps: int, peak: float) -> float:
    """Linear warm-up from 0 to ``peak`` over ``warmup_steps``, then cosine decay to 0 at ``total_steps``."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return peak * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD (Nesterov) or AdamW; no weight decay on biases, norms and other 1-D parameters."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() <= 1]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum, nesterov=True)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.999))
    raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {config.optimizer!r}")


def _hardware(device: torch.device, world_size: int) -> str:
    if device.type == "cuda":
        return f"{world_size}× {torch.cuda.get_device_name(device)}"
    return f"{world_size}× CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    return versions


def _loaders(config: TrainConfig, device: torch.device, rank: int, world_size: int):
    """(train loader, test loader, classes, mean, std, input size, data description)."""
    per_rank = config.batch_size // world_size
    if config.data == "cifar10":
        train_x, train_y = load_cifar10(config.data_root, "train", lite=config.lite)
        test_x, test_y = load_cifar10(config.data_root, "test")
        if config.subset is not None:
            train_x, train_y, test_x, test_y = (a[:config.subset] for a in (train_x, train_y, test_x, test_y))
        data = {"name": "CIFAR-10", "train": len(train_y), "test": len(test_y), "lite": config.lite,
                "train_sha256": data_fingerprint(train_x, train_y), "test_sha256": data_fingerprint(test_x, test_y)}
        return (DeviceLoader(train_x, train_y, per_rank, device, True, rank, world_size, config.seed),
                DeviceLoader(test_x, test_y, min(1000, per_rank * 2), device, False, rank, world_size),
                list(CIFAR10_CLASSES), CIFAR10_MEAN, CIFAR10_STD, 32, data)
    if config.data == "synthetic":
        count = 512 if config.subset is None else config.subset
        train_x, train_y = synthetic_images(count, config.num_classes, config.image_size, config.seed)
        test_x, test_y = synthetic_images(count, config.num_classes, config.image_size, config.seed + 1)
        classes = [f"class {c}" for c in range(config.num_classes)]
        data = {"name": "synthetic", "train": count, "test": count}
        return (DeviceLoader(train_x, train_y, per_rank, device, True, rank, world_size, config.seed),
                DeviceLoader(test_x, test_y, per_rank, device, False, rank, world_size),
                classes, CIFAR10_MEAN, CIFAR10_STD, config.image_size, data)
    if config.data == "imagefolder":
        root = Path(config.data_root or ".")
        options = dict(image_size=config.image_size, device=device, rank=rank, world_size=world_size,
                       seed=config.seed, num_workers=config.num_workers)
        train = FolderLoader(root / "train", batch_size=per_rank, train=True, **options)
        test = FolderLoader(root / "val", batch_size=per_rank, train=False, **options)
        data = {"name": f"ImageFolder {root}", "train": len(train.dataset), "test": len(test.dataset)}
        return train, test, train.dataset.classes, IMAGENET_MEAN, IMAGENET_STD, config.image_size, data
    raise ValueError(f"data must be 'cifar10', 'imagefolder' or 'synthetic', got {config.data!r}")


@dataclass
class _Run:
    """What the epochs of one run share: the model (as the forward sees it), optimiser, data and schedule."""

    config: TrainConfig
    ddp_model: nn.Module  # what the forward goes through (DDP wrapper or the model itself)
    optimizer: torch.optim.Optimizer
    train_loader: DeviceLoader | FolderLoader
    test_loader: DeviceLoader | FolderLoader
    num_classes: int
    device: torch.device
    amp: bool
    is_main: bool
    mix_generator: torch.Generator

    @property
    def steps_per_epoch(self) -> int:
        return len(self.train_loader)

    def streams(self, model: nn.Module) -> RandomStreams:
        """The random streams this rank draws from (for the resume file)."""
        return RandomStreams(model, self.train_loader, self.mix_generator, self.device)

    def steps_planned(self) -> int:
        total = self.config.epochs * self.steps_per_epoch
        return total if self.config.max_steps is None else min(total, self.config.max_steps)


def train_epoch(run: _Run, epoch: int) -> tuple[float, float, int]:
    """One pass over the training data; returns (mean loss over ranks, last learning rate, steps taken)."""
    config, step = run.config, epoch * run.steps_per_epoch
    total_steps = config.epochs * run.steps_per_epoch
    warmup_steps = int(config.warmup_epochs * run.steps_per_epoch)
    run.ddp_model.train()
    run.train_loader.set_epoch(epoch)
    loss_sum, lr, taken, last_step = torch.zeros((), device=run.device), config.lr, 0, run.steps_planned()
    bar = tqdm(run.train_loader, desc=f"epoch {epoch + 1}/{config.epochs}", disable=not run.is_main, leave=False)
    for images, labels in bar:
        if step + taken >= last_step:
            break
        lr = learning_rate(step + taken, total_steps, warmup_steps, config.lr)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        images, targets = mix_batch(images, labels, run.num_classes, config.mixup_alpha, config.label_smoothing,
                                    run.mix_generator)
        with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=run.amp):
            logits = run.ddp_model(images)
        loss = F.cross_entropy(logits.float(), targets)
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        run.optimizer.step()
        loss_sum += loss.detach()
        taken += 1
    if dist.is_initialized():
        dist.all_reduce(loss_sum)
        loss_sum /= dist.get_world_size()
    return loss_sum.item() / max(taken, 1), lr, taken


def _build_model(config: TrainConfig, num_classes: int, device: torch.device) -> tuple[nn.Module, dict]:
    """The model and the arguments the card stores: the run's seed is the model's ``candidate_seed`` (the seed every
    random layer derives its own from, :mod:`convnn.candidates`) unless ``model_args`` sets one."""
    model_args = {"candidate_seed": config.seed, **config.model_args, "num_classes": num_classes}
    try:
        return create_model(config.model, **model_args).to(device), model_args
    except TypeError as err:  # an argument the constructor does not take
        raise ValueError(f"model_args do not fit {config.model!r}: {err}") from err


@dataclass
class _Progress:
    """How far a run is: epochs finished, training seconds, the last test metrics, the ConvNN paths taken."""

    epochs_done: int = 0
    elapsed: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    backends: set[str] = field(default_factory=set)


def _setup(config: TrainConfig, device: torch.device, rank: int, world_size: int):
    """Data, model and optimiser of a run: (run, model, model arguments for the card, data description, classes,
    mean, std, input size)."""
    train_loader, test_loader, classes, mean, std, input_size, data = _loaders(config, device, rank, world_size)
    if len(train_loader) == 0:
        largest = data["train"] // world_size * world_size
        raise ValueError(f"batch_size={config.batch_size} is larger than the {data['train']} training images: pass "
                         f"--batch-size {largest} or less" + (" (or a larger --subset)" if config.subset else ""))
    model, model_args = _build_model(config, len(classes), device)
    run = _Run(config, DistributedDataParallel(model) if world_size > 1 else model,
               make_optimizer(model, config), train_loader, test_loader, len(classes), device,
               config.amp and device.type == "cuda", rank == 0,
               torch.Generator().manual_seed(derive_seed(config.seed, "mix", rank)))
    return run, model, model_args, data, classes, mean, std, input_size


def _train_epochs(run: _Run, model: nn.Module, progress: _Progress, out: Path) -> None:
    """Train the remaining epochs; after each, measure, log one JSON line and write the resume file (rank 0)."""
    config, device = run.config, run.device
    resume_path, log_path = out / f"{config.name}.resume.pt", out / f"{config.name}.log.jsonl"
    with record_backends() as backends:  # the paths the ConvNN layers took, for the card
        while progress.epochs_done < config.epochs and progress.epochs_done * run.steps_per_epoch < run.steps_planned():
            started = time.perf_counter()
            train_loss, lr, steps = train_epoch(run, progress.epochs_done)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            epoch_time = time.perf_counter() - started
            progress.elapsed += epoch_time
            progress.epochs_done += 1
            progress.metrics = test_metrics(run.ddp_model, run.test_loader, device, run.amp)
            streams = run.streams(model).of_every_rank()
            if run.is_main:
                row = {"epoch": progress.epochs_done, "train_loss": train_loss, **progress.metrics, "lr": lr,
                       "epoch_time_s": epoch_time, "images_per_s": steps * config.batch_size / epoch_time}
                with log_path.open("a") as file:
                    file.write(json.dumps(row) + "\n")
                log.info("epoch %d/%d  train loss %.4f  test top-1 %.2f%%  %.1fs", progress.epochs_done,
                         config.epochs, train_loss, progress.metrics["test_top1"], epoch_time)
                save_resume(resume_path, model, run.optimizer, progress.epochs_done, progress.elapsed, streams)
        if not progress.metrics:  # resumed after the last epoch: report the finished model
            progress.metrics = test_metrics(run.ddp_model, run.test_loader, device, run.amp)
    progress.backends |= backends


def _run(config: TrainConfig, device: torch.device, rank: int, world_size: int) -> tuple[nn.Module, dict]:
    """:func:`train` once the process group and the device are set up."""
    out = Path(config.out)
    run, model, model_args, data, classes, mean, std, input_size = _setup(config, device, rank, world_size)
    progress = _Progress()
    resume_path, log_path = out / f"{config.name}.resume.pt", out / f"{config.name}.log.jsonl"
    if config.resume and resume_path.is_file():
        progress.epochs_done, progress.elapsed = load_resume(resume_path, run.optimizer, run.streams(model), rank,
                                                             world_size)
    elif config.resume and run.is_main:
        log.warning("--resume: no %s, so the run starts from epoch 1", resume_path)
    if run.is_main:
        out.mkdir(parents=True, exist_ok=True)
        if progress.epochs_done == 0:
            log_path.write_text("")
        log.info("%s: %s (%d parameters) on %s, from epoch %d", config.name, config.model,
                 sum(p.numel() for p in model.parameters()), _hardware(device, world_size), progress.epochs_done + 1)
    _train_epochs(run, model, progress, out)
    card = ModelCard(
        name=config.name, model=config.model, model_args=model_args, classes=classes, input_size=input_size,
        mean=list(mean), std=list(std), metrics=progress.metrics, recipe=dataclasses.asdict(config), data=data,
        training={"epochs": progress.epochs_done, "seed": config.seed, "train_time_s": round(progress.elapsed, 1),
                  "hardware": _hardware(device, world_size), "world_size": world_size,
                  "versions": _versions(), "date": datetime.date.today().isoformat(),
                  "backend": " + ".join(sorted(progress.backends)) or "none (no ConvNN aggregation)"},
        evaluation=draw_evaluation(model))
    # Every rank measures the weights as stored on its shard of the test data (a model with random candidates over
    # convnn.metrics.EVAL_DRAWS eval draws, METHOD §3b); rank 0 writes.
    save_checkpoint(model, out / config.name, card, getattr(torch, config.save_dtype), write=run.is_main,
                    measure=lambda stored, _: summarize_draws(draw_metrics(stored.to(device), run.test_loader, device,
                                                                           run.amp)))
    if run.is_main:
        log.info("weights as stored (%s): test top-1 %.2f%% (trained model %.2f%%)", config.save_dtype,
                 card.metrics["test_top1"], progress.metrics["test_top1"])
    return model, progress.metrics


def train(config: TrainConfig) -> tuple[nn.Module, dict[str, float]]:
    """Run the whole training described by ``config`` (checked first with :meth:`TrainConfig.check`).

    ``config.backend`` applies to every ConvNN layer left at ``backend="auto"`` (:func:`kernels.use_backend`).

    Returns:
        tuple[nn.Module, dict[str, float]]: this rank's trained model (unwrapped from DDP) and its final test
        metrics (``test_top1`` in percent, ``test_loss``), before storage in ``save_dtype``.

    Raises:
        ValueError: a configuration field outside its range, a batch larger than the data, model arguments the
            model does not take, or trained weights that cannot be stored in ``save_dtype``
            (:func:`~convnn.checkpoint.save_checkpoint`; nothing is written then, ``NAME.resume.pt`` aside).
    """
    config.check()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if config.batch_size % world_size:
        raise ValueError(f"batch_size={config.batch_size} must be divisible by the world size {world_size}")
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    if world_size > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True  # fixed input sizes: let cuDNN pick the fastest algorithms
    torch.manual_seed(config.seed)  # identical initial weights on every rank
    try:
        with use_backend(config.backend):
            return _run(config, device, rank, world_size)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """The CLI: a configuration or data the run cannot use ends it with the message, not a traceback."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        train(parse_config(argv))
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"python -m convnn.train: {err}") from err


if __name__ == "__main__":
    main()
