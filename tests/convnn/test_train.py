"""The training CLI: DDP under torchrun/gloo, presets, resume, the written checkpoint and log."""

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from filelock import FileLock

from convnn import create_model, load_checkpoint
from convnn.candidates import DRAW_SCHEME
from convnn.data import normalize, synthetic_images
from convnn.presets import PRESETS
from convnn.train import TrainConfig, learning_rate, parse_config, train
from tests.conftest import ROOT

TINY = ["--data", "synthetic", "--image-size", "16", "--subset", "128", "--batch-size", "32", "--num-classes", "4",
        "--model-args", '{"widths": [8, 16], "depths": [1, 0]}', "--lr", "0.05", "--warmup-epochs", "0"]


TINY_ARCH = {"widths": [8, 16], "depths": [1, 0]}


DDP_CASES = {"plain": {}, "learned-qk": {"qk_dim": 4, "weighting": "softmax"}}


@pytest.fixture(scope="session")
def ddp_runs(tmp_path_factory, worker_id) -> Path:
    """A folder per case of :data:`DDP_CASES` holding its two-process run: both trained in one ``torchrun`` launch,
    one after the other (most of a launch is torchrun and the two processes starting), once per pytest session,
    also under pytest-xdist (the first worker to need them runs them; a file lock keeps the others waiting)."""
    shared = tmp_path_factory.getbasetemp()
    root = (shared if worker_id == "master" else shared.parent) / "ddp-runs"  # xdist: the workers' common folder
    with FileLock(f"{root}.lock"):
        if not (root / "done").is_file():
            shutil.rmtree(root, ignore_errors=True)
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            runs = []  # each case's arguments, "---" between them (ddp_worker.py)
            for case, convnn_options in DDP_CASES.items():
                (root / case).mkdir(parents=True)
                runs += ["---", "--preset", "cnn-l0.5", "--name", "ddp", "--epochs", "3", "--out", str(root / case),
                         *TINY, "--subset", "64", "--model-args", json.dumps({**TINY_ARCH, **convnn_options})]
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       str(ROOT / "tests/convnn/ddp_worker.py"), *runs[1:]]
            subprocess.run(command, check=True, env=env, cwd=ROOT, timeout=600, capture_output=True)
            (root / "done").touch()
    return root


@pytest.mark.parametrize("case", list(DDP_CASES))
def test_two_process_ddp_on_gloo_keeps_ranks_identical_and_lowers_the_loss(ddp_runs, case):
    """Also with learned q/k projections, which DDP only accepts when they get a gradient (softmax weighting).
    64 images: two steps an epoch, 16 images a rank each (128 images took 3 s more of the ≈ 20 s, most of which
    is torchrun and the two processes starting: the two cases train in one launch, :func:`ddp_runs`)."""
    tmp_path, convnn_options = ddp_runs / case, DDP_CASES[case]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for name, tensor in rank0.items():
        torch.testing.assert_close(rank1[name], tensor, rtol=0, atol=0, msg=name)
    rows = [json.loads(line) for line in (tmp_path / "ddp.log.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and rows[-1]["train_loss"] < rows[0]["train_loss"]
    _, card = load_checkpoint(tmp_path / "ddp")
    assert card.training["world_size"] == 2 and card.model_args["num_classes"] == 4
    if convnn_options:  # the projections trained: they differ from a fresh model's initial ones
        torch.manual_seed(0)
        initial = create_model(card.model, **card.model_args).state_dict()
        projections = [name for name in rank0 if name.endswith(("q_proj.weight", "k_proj.weight"))]
        assert projections and all(not torch.equal(rank0[name], initial[name]) for name in projections)


@pytest.mark.parametrize("preset, model_args", [
    ("cnn-l0.5", {**TINY_ARCH, "selection": "random", "num_candidates": 12}),  # crop/flip, mixup, candidates
    ("vit-convnn16", {"img_size": 16, "dim": 16, "depth": 2, "num_heads": 2, "num_neighbors": 4,  # + DropPath
                      "selection": "random", "num_candidates": 8}),
], ids=["cnn-random", "vit-random"])
def test_an_interrupted_run_resumed_equals_the_uninterrupted_run_bit_for_bit(tmp_path, preset, model_args):
    """3 epochs straight == 2 epochs (stopped by --max-steps) + --resume: the same train losses and weights,
    bit for bit on a CPU, so every random stream continued where it was. Two steps an epoch (32 images in batches
    of 16): the stop after epoch 2 still follows steps within an epoch."""
    args = ["--preset", preset, "--epochs", "3", "--out", str(tmp_path), *TINY, "--subset", "32", "--batch-size",
            "16", "--mixup-alpha", "0.5", "--model-args", json.dumps(model_args)]
    straight, _ = train(parse_config([*args, "--name", "straight"]))
    steps_per_epoch = 32 // 16
    train(parse_config([*args, "--name", "resumed", "--max-steps", str(2 * steps_per_epoch)]))
    resumed, _ = train(parse_config([*args, "--name", "resumed", "--resume"]))
    losses = {name: [json.loads(line)["train_loss"] for line in (tmp_path / f"{name}.log.jsonl").open()]
              for name in ("straight", "resumed")}
    assert len(losses["straight"]) == 3 and losses["resumed"] == losses["straight"]
    for name, tensor in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    card = json.loads((tmp_path / "straight.json").read_text())  # random candidates: measured over 5 eval draws
    assert card["evaluation"] == {"draw_scheme": DRAW_SCHEME, "draws": 5} and "test_top1_std" in card["metrics"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_and_takes_training_steps(name, tmp_path):
    """Each preset's model, recipe and optimiser run two steps on generated images: the CIFAR ViTs (mixup) two of
    two 32 px images each, the others one image a step, the step's cost and not a batch's; the ViT-B/16 at its
    224 px; the ResNets, whose layers take any size, at sizes where every hybrid layer still selects: the
    ResNet-50 at 160 px, where its last stage has 5 × 5 cells, more than K = 16 (224 px took it 2.4× as long), the
    CIFAR ResNets at 24 px, where theirs has 6 × 6, more than K = 16 and than the random presets' 32 candidates
    (32 px took them twice as long)."""
    size, batch = {"convnn_resnet50": (160, 1), "convnn_vit_b16": (224, 1),
                   "convnn_resnet_cifar": (24, 1)}.get(PRESETS[name]["model"], (32, 2))
    config = parse_config(["--preset", name, "--data", "synthetic", "--image-size", str(size), "--subset",
                           str(2 * batch), "--batch-size", str(batch), "--max-steps", "2", "--epochs", "1",
                           "--out", str(tmp_path)])
    model, metrics = train(config)
    assert 0.0 <= metrics["test_top1"] <= 100.0
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # On a CPU every ConvNN aggregation runs on the reference; λ = 0 and MHSA run none.
    card = json.loads((tmp_path / f"{config.name}.json").read_text())
    model_args = PRESETS[name]["model_args"]
    without = model_args.get("branch_ratio") == 0.0 or model_args.get("attention") == "mhsa"
    assert card["training"]["backend"] == ("none (no ConvNN aggregation)" if without else "reference")


def test_a_runs_backend_reaches_the_layers_without_touching_the_environment(tmp_path, monkeypatch):
    """--backend is applied through kernels.use_backend: the card records it and os.environ is left as it was."""
    monkeypatch.delenv("CONVNN_BACKEND", raising=False)
    before = dict(os.environ)
    config = parse_config(["--preset", "cnn-l0.5", "--name", "b", "--out", str(tmp_path), "--epochs", "1",
                           "--backend", "reference", *TINY])
    train(config)
    assert dict(os.environ) == before
    assert json.loads((tmp_path / "b.json").read_text())["training"]["backend"] == "reference"


@pytest.mark.parametrize("save_dtype", ["int8", "float16"])
def test_the_card_scores_the_weights_as_stored(save_dtype, tmp_path):
    """The card's test_top1/test_loss are the stored weights' on the test split; for int8 the float model's are
    kept with the _before_quantization suffix."""
    config = parse_config(["--preset", "cnn-l0", "--name", "q", "--out", str(tmp_path), "--epochs", "1",
                           "--save-dtype", save_dtype, *TINY])
    _, float_metrics = train(config)
    stored, card = load_checkpoint(tmp_path / "q")
    assert card.weights_dtype == save_dtype and card.recipe["save_dtype"] == save_dtype
    images, labels = synthetic_images(config.subset, config.num_classes, config.image_size, config.seed + 1)
    with torch.no_grad():
        logits = stored(normalize(torch.from_numpy(images), tuple(card.mean), tuple(card.std)))
    labels = torch.from_numpy(labels)
    before = {"test_top1_before_quantization": float_metrics["test_top1"],
              "test_loss_before_quantization": float_metrics["test_loss"]} if save_dtype == "int8" else {}
    assert card.metrics == pytest.approx({"test_top1": 100 * (logits.argmax(1) == labels).float().mean().item(),
                                          "test_loss": F.cross_entropy(logits, labels).item(), **before}, rel=1e-5)


def test_preset_seed_names_the_run_and_flags_override():
    config = parse_config(["--preset", "cnn-l0.5", "--seed", "2", "--epochs", "7",
                           "--model-args", '{"num_neighbors": 4}'])
    assert config.name == "cnn-l0.5-s2" and config.epochs == 7 and config.seed == 2
    assert config.model_args["num_neighbors"] == 4 and config.model_args["branch_ratio"] == 0.5


def test_learning_rate_warms_up_then_decays_to_zero():
    peak = 0.4
    assert learning_rate(0, 100, 10, peak) == pytest.approx(0.04)
    assert learning_rate(9, 100, 10, peak) == pytest.approx(peak)
    assert learning_rate(55, 100, 10, peak) == pytest.approx(peak / 2)
    assert learning_rate(100, 100, 10, peak) == pytest.approx(0.0)


def test_imagefolder_data_trains_and_evaluates(tmp_path):
    """The ImageNet layout (ROOT/train/<class>/*, ROOT/val/<class>/*) through ``--data imagefolder``."""
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for label in ("cat", "dog"):
            folder = tmp_path / "data" / split / label
            folder.mkdir(parents=True)
            for i in range(4):
                pixels = torch.randint(0, 256, (20, 24, 3), generator=generator, dtype=torch.uint8).numpy()
                Image.fromarray(pixels).save(folder / f"{i}.png")
    config = parse_config(["--preset", "cnn-l0", "--data", "imagefolder", "--data-root", str(tmp_path / "data"),
                           "--image-size", "16", "--batch-size", "4", "--epochs", "1", "--num-workers", "0",
                           "--model-args", '{"widths": [8, 16], "depths": [1, 0]}', "--out", str(tmp_path)])
    model, metrics = train(config)
    _, card = load_checkpoint(tmp_path / "cnn-l0")
    assert card.classes == ["cat", "dog"] and card.input_size == 16 and card.data["test"] == 8
    assert 0.0 <= metrics["test_top1"] <= 100.0 and model.head.out_features == 2


def test_resuming_a_finished_run_rewrites_its_checkpoint_without_training(tmp_path):
    args = ["--preset", "cnn-l0", "--name", "done", "--out", str(tmp_path), "--epochs", "1", *TINY]
    _, first = train(parse_config(args))
    _, again = train(parse_config([*args, "--resume"]))
    rows = (tmp_path / "done.log.jsonl").read_text().splitlines()
    assert len(rows) == 1 and again["test_top1"] == first["test_top1"]


@pytest.mark.parametrize("flags, message", [
    (["--epochs", "0"], "epochs must be an integer in [1, ∞], got 0"),
    (["--batch-size", "0"], "batch_size"),
    (["--save-dtype", "int16"], "save_dtype must be one of ('float32', 'float16', 'bfloat16', 'int8'), got 'int16'"),
    (["--backend", "cuda"], "backend"),
    (["--label-smoothing", "2"], "label_smoothing must be a number in [0, 1), got 2.0"),
    (["--label-smoothing", "1"], "label_smoothing must be a number in [0, 1), got 1.0"),
    (["--lr", "0"], "lr must be a finite number > 0, got 0.0"),
    (["--lr", "nan"], "lr must be a finite number > 0, got nan"),
    (["--weight-decay", "inf"], "weight_decay must be a number in [0, ∞), got inf"),
    (["--momentum", "1.5"], "momentum must be a number in [0, 1], got 1.5"),
    (["--seed", "-1"], "seed must be an integer in [0, 9223372036854775807], got -1"),  # the one seed range
    (["--seed", str(2**63)], "seed must be an integer in [0, 9223372036854775807], got 9223372036854775808"),
    (["--image-size", "1024"], "image_size must be an integer in [1, 512], got 1024"),  # the card's limit
    (["--subset", "0"], "subset"),
    (["--model-args", "[1, 2]"], "model-args"),
    (["--config", "/nonexistent.json"], "config"),
])
def test_cli_refuses_bad_flags_before_any_work(flags, message, capsys):
    with pytest.raises(SystemExit):
        parse_config(["--preset", "cnn-l0", *flags])
    assert message in capsys.readouterr().err


def test_batch_larger_than_the_data_and_unknown_model_arguments_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match=re.escape("larger than the 128 training images: pass --batch-size 128 or "
                                                   "less (or a larger --subset)")):
        train(parse_config(["--preset", "cnn-l0", "--out", str(tmp_path), *TINY, "--batch-size", "256"]))
    with pytest.raises(ValueError, match="model_args"):
        train(parse_config(["--preset", "cnn-l0", "--out", str(tmp_path), *TINY,
                            "--model-args", '{"num_neighbours": 4}']))


def test_the_cli_ends_with_a_message_not_a_traceback_when_the_data_does_not_fit_the_model(tmp_path):
    """A CIFAR ViT on synthetic data of the default 224 px: the message says which size to pass."""
    from convnn.train import main

    with pytest.raises(SystemExit, match=r"python -m convnn.train: input must be 32×32 \(img_size\), got \(224, 224\) "
                                         r"\(with --data synthetic or imagefolder, pass --image-size 32\)"):
        main(["--preset", "vit-mhsa", "--data", "synthetic", "--subset", "4", "--batch-size", "2", "--epochs", "1",
              "--out", str(tmp_path)])


def test_the_readme_s_command_to_try_the_cli_runs(tmp_path):
    """The README's command for generated images stopped at once ("batch_size=512 is larger than the 256 training
    images"): it passes a batch that fits now, and takes its first step (stopped there)."""
    line = next(line for line in (ROOT / "README.md").read_text().splitlines()
                if line.startswith("python -m convnn.train") and "--data synthetic" in line)
    args = shlex.split(line)[3:]
    config = parse_config([*args, "--out", str(tmp_path), "--max-steps", "1"])
    _, metrics = train(config)
    assert 0.0 <= metrics["test_top1"] <= 100.0 and (tmp_path / f"{config.name}.json").is_file()


def test_every_flag_says_what_it_sets(capsys):
    """``--help`` named most flags with no text; each says what it sets now, with its default."""
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for field in dataclasses.fields(TrainConfig):
        text = " ".join(field.metadata["help"].split())
        assert text and f"--{field.name.replace('_', '-')}" in shown and text in shown, field.name
    assert "cifar-10-python.tar.gz" in shown
