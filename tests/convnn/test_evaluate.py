"""The evaluation CLI on generated images: its metrics, the int8 re-save and the card it writes."""

import hashlib
import itertools
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from convnn import ModelCard, create_model, load_checkpoint, save_checkpoint
from convnn import checkpoint as checkpoint_module
from convnn import evaluate as evaluate_cli
from convnn import metrics as metrics_module
from convnn.checkpoint import checkpoint_paths
from convnn.data import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD, normalize, synthetic_images
from tests.small_models import SMALL_MODELS

NUM_IMAGES = 48
IMAGES, LABELS = synthetic_images(NUM_IMAGES, len(CIFAR10_CLASSES), 32, seed=3)


@pytest.fixture
def source(tmp_path, monkeypatch):
    """A small fp16 checkpoint with a trained-looking card, and the CLI reading the generated images as CIFAR-10."""
    monkeypatch.setattr(evaluate_cli, "load_cifar10", lambda root, split: (IMAGES, LABELS))
    model_name, args = SMALL_MODELS["vit-mhsa"]
    torch.manual_seed(0)
    card = ModelCard(name="vit", model=model_name, model_args=args, classes=list(CIFAR10_CLASSES), input_size=32,
                     mean=list(CIFAR10_MEAN), std=list(CIFAR10_STD), metrics={"test_top1": 55.5, "test_loss": 1.5},
                     recipe={"epochs": 3, "save_dtype": "float16"}, data={"name": "CIFAR-10", "test": 10_000},
                     training={"seed": 0, "hardware": "1× H200"})
    _, card_path = save_checkpoint(create_model(model_name, **args), tmp_path / "src" / "vit", card,
                                   dtype=torch.float16)
    return card_path


def _metrics(path) -> tuple[float, float]:
    """Top-1 (percent) and mean cross-entropy of a checkpoint on the generated images, computed directly."""
    model, card = load_checkpoint(path)
    with torch.no_grad():
        logits = model(normalize(torch.from_numpy(IMAGES), tuple(card.mean), tuple(card.std)))
    labels = torch.from_numpy(LABELS)
    return 100 * (logits.argmax(1) == labels).sum().item() / NUM_IMAGES, F.cross_entropy(logits, labels).item()


def test_int8_resave_writes_the_stored_weights_metrics_and_keeps_the_rest_of_the_card(source, tmp_path, capsys):
    out = tmp_path / "int8"
    before = source.read_bytes(), source.with_suffix(".safetensors").read_bytes()
    evaluate_cli.main([str(source), "--data-root", "unused", "--save-dtype", "int8", "--out", str(out),
                       "--batch-size", "20", "--device", "cpu"])
    old, new = json.loads(source.read_text()), json.loads((out / "vit.json").read_text())
    (top1, loss), (stored_top1, stored_loss) = _metrics(source), _metrics(out / "vit.json")
    assert new["weights_dtype"] == "int8" and new["name"] == "vit"
    assert new["metrics"] == pytest.approx({"test_top1": stored_top1, "test_loss": stored_loss,
                                            "test_top1_before_quantization": top1,
                                            "test_loss_before_quantization": loss}, rel=1e-5)
    changed = {"metrics", "weights_dtype", "weights_sha256"}
    assert {key: value for key, value in new.items() if key not in changed} == {
        key: value for key, value in old.items() if key not in changed}
    assert (source.read_bytes(), source.with_suffix(".safetensors").read_bytes()) == before
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 and table[1].split()[:2] == ["vit", "float16"] and "int8" in table[1]


def test_resaving_an_int8_checkpoint_keeps_the_float_models_numbers(source, tmp_path):
    first, second = tmp_path / "int8", tmp_path / "again"
    options = ["--data-root", "unused", "--save-dtype", "int8", "--device", "cpu"]
    evaluate_cli.main([str(source), *options, "--out", str(first)])
    evaluate_cli.main([str(first / "vit.json"), *options, "--out", str(second)])
    metrics = json.loads((second / "vit.json").read_text())["metrics"]
    assert metrics["test_top1_before_quantization"] == pytest.approx(_metrics(source)[0], rel=1e-5)


@pytest.mark.parametrize("argv, message", [
    (["--save-dtype", "int8"], None),  # argparse: --out missing
    (["--save-dtype", "int8", "--out", "SOURCE"], "vit.safetensors exists there already"),
])
def test_refuses_half_a_resave_request_and_overwriting_the_source(source, argv, message, capsys):
    argv = [str(source.parent) if arg == "SOURCE" else arg for arg in argv]
    with pytest.raises(SystemExit) as info:
        evaluate_cli.main([str(source), "--data-root", "unused", "--device", "cpu", *argv])
    if message is None:
        assert info.value.code == 2 and "go together" in capsys.readouterr().err
    else:
        assert message in str(info.value.code)


def test_a_float_resave_is_not_a_quantization(source, tmp_path):
    """float16 → float32: the new card's metrics are the stored weights', without *_before_quantization keys."""
    evaluate_cli.main([str(source), "--data-root", "unused", "--save-dtype", "float32", "--device", "cpu",
                       "--out", str(tmp_path / "fp32")])
    metrics = json.loads((tmp_path / "fp32" / "vit.json").read_text())["metrics"]
    assert metrics == pytest.approx(dict(zip(("test_top1", "test_loss"), _metrics(tmp_path / "fp32" / "vit.json"),
                                             strict=True)), rel=1e-5)


def _tree(folder) -> dict[str, str | None]:
    """Every path under ``folder``: a file's sha256, None for a folder."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
            for path in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("case, message", [
    ("other source's folder", "--out .*B: vit.safetensors exists there already"),  # A/vit B/vit --out B
    ("two sources, one name", "would both be re-saved as"),
    ("a file exists in --out", "vit.json exists there already"),
    ("a later card is missing", "does not exist"),
    ("a later card is no card", "not a readable JSON model card"),
    ("test_top1 is null", "metrics.test_top1 must be a finite number, got None"),
    ("test_top1 is text", "metrics.test_top1 must be a finite number, got 'n/a'"),
    ("a later card is not CIFAR-10", r"vit: not a CIFAR-10 model: classes \['c0', 'c1'\]"),
])
def test_refuses_before_anything_is_evaluated_or_written(case, message, source, tmp_path):
    """Every source is loaded and every new path planned first: one bad argument leaves every folder unchanged."""
    first, second, out = tmp_path / "A", tmp_path / "B", tmp_path / "out"
    shutil.copytree(source.parent, first)
    shutil.copytree(source.parent, second)
    sources, folder = [first / "vit.json", second / "vit.json"], out
    if case == "other source's folder":
        folder = second
    elif case == "a file exists in --out":
        out.mkdir()
        (out / "vit.json").write_text("{}")
        sources = sources[:1]
    elif case == "a later card is missing":
        (second / "vit.json").unlink()
    elif case == "a later card is no card":
        (second / "vit.json").write_text("[" * 100_000 + "]" * 100_000)
    elif case.startswith("test_top1"):
        card = json.loads((second / "vit.json").read_text())
        card["metrics"]["test_top1"] = None if case.endswith("null") else "n/a"
        (second / "vit.json").write_text(json.dumps(card))
    elif case == "a later card is not CIFAR-10":  # named "other": only its classes are the problem
        card = json.loads((second / "vit.json").read_text())
        card["classes"] = [f"c{c}" for c in range(10)]
        (second / "other.json").write_text(json.dumps(card))
        (second / "vit.safetensors").rename(second / "other.safetensors")
        (second / "vit.json").unlink()
        sources[1] = second / "other.json"
    if case not in ("other source's folder", "two sources, one name", "a file exists in --out"):
        folder = out / "new"  # distinct names are not the problem here
    before = _tree(tmp_path)
    with pytest.raises(SystemExit) as info:
        evaluate_cli.main([*map(str, sources), "--data-root", "unused", "--save-dtype", "int8", "--device", "cpu",
                           "--out", str(folder)])
    assert info.value.code.startswith("python -m convnn.evaluate: ")
    assert re.search(message, info.value.code), info.value.code
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("out, message", [("file", "is a file"), ("file/sub/dir", "is under the file FILE")])
def test_out_naming_a_file_or_a_path_under_one_is_a_usage_error(out, message, source, tmp_path, capsys, monkeypatch):
    """Found before any checkpoint is loaded or evaluated, not when the first file is written."""
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(evaluate_cli, "load_checkpoint", lambda *args: pytest.fail("a checkpoint was loaded"))
    with pytest.raises(SystemExit) as info:
        evaluate_cli.main([str(source), "--data-root", "unused", "--save-dtype", "int8", "--device", "cpu",
                           "--out", str(tmp_path / out)])
    message = message.replace("FILE", str(tmp_path / "file"))
    assert info.value.code == 2 and f"--out {tmp_path / out} {message}: give a folder" in capsys.readouterr().err


@pytest.mark.parametrize("save_dtype", ["int8", "float32"])
def test_a_nan_measurement_of_the_stored_weights_is_never_written_into_a_card(save_dtype, source, tmp_path,
                                                                               monkeypatch):
    """The source measures fine; the stored weights' loss is NaN (here forced): the run stops, nothing is written."""
    measured = iter([{"test_loss": 1.0, "test_top1": 10.0}, {"test_loss": float("nan"), "test_top1": 10.0}])
    monkeypatch.setattr(metrics_module, "test_metrics", lambda *args, **kwargs: next(measured))
    with pytest.raises(SystemExit) as info:
        evaluate_cli.main([str(source), "--data-root", "unused", "--save-dtype", save_dtype, "--device", "cpu",
                           "--out", str(tmp_path / "new")])
    assert info.value.code == "python -m convnn.evaluate: vit: metrics.test_loss must be a finite number, got nan"
    assert next(measured, None) is None and not (tmp_path / "new").exists()


def test_a_later_checkpoint_that_cannot_be_stored_stops_the_run_before_anything_is_written(source, tmp_path):
    """A 1e6 bias is a float32 checkpoint, but float16 ends at ±65504: found before the first one is re-saved."""
    model, card = load_checkpoint(source)
    with torch.no_grad():
        model.head.bias[0] = 1e6
    big, _ = save_checkpoint(model, tmp_path / "src" / "big", card, dtype=torch.float32)
    before = _tree(tmp_path)
    with pytest.raises(SystemExit) as info:
        evaluate_cli.main([str(source), str(big), "--data-root", "unused", "--save-dtype", "float16",
                           "--device", "cpu", "--out", str(tmp_path / "new")])
    assert re.fullmatch(r"python -m convnn.evaluate: not saved, as load_checkpoint would refuse it: big.safetensors: 1 "
                        r"tensors hold an inf or NaN once loaded \(e.g. head.bias, stored as torch.float16, which "
                        r"ends at ±65504\)", info.value.code), info.value.code
    assert _tree(tmp_path) == before and not (tmp_path / "new").exists()


def test_the_new_card_is_written_only_after_the_stored_weights_are_measured(source, tmp_path, monkeypatch):
    """A run killed while measuring must not leave a loadable card that carries the source's metrics."""
    out, measure = tmp_path / "int8", evaluate_cli.EvaluationData.draw_metrics  # what every measurement runs
    cards_seen = []

    def spy(self, model, card):
        cards_seen.append(sorted(path.name for path in out.glob("*.json")) if out.exists() else [])
        return measure(self, model, card)

    monkeypatch.setattr(evaluate_cli.EvaluationData, "draw_metrics", spy)
    evaluate_cli.main([str(source), "--data-root", "unused", "--save-dtype", "int8", "--out", str(out),
                       "--device", "cpu"])
    assert len(cards_seen) == 2 and "vit.json" not in cards_seen[1]  # [0]: the source, [1]: the stored weights
    assert sorted(path.name for path in out.iterdir()) == ["vit.json", "vit.safetensors"]
    assert json.loads((out / "vit.json").read_text())["name"] == "vit"


def _copy(source, folder, name: str):
    """A copy of the checkpoint ``source`` (card path) as ``folder/name``; its card path."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in checkpoint_paths(source):
        shutil.copy(path, folder / (name + path.suffix))
    return folder / f"{name}.json"


def test_a_nan_measurement_of_a_later_checkpoint_writes_nothing_and_the_run_can_be_repeated(source, tmp_path,
                                                                                          monkeypatch):
    """Every source and its stored weights are measured before anything is written: the first source's new files
    do not stay behind to make the same command refuse "exists there already" once the data is fixed."""
    second, out = _copy(source, tmp_path / "src", "second"), tmp_path / "new"
    ok, nan = {"test_loss": 1.0, "test_top1": 10.0}, {"test_loss": float("nan"), "test_top1": 10.0}
    measured = iter([ok, ok, ok, nan])  # vit, vit stored, second, second stored
    monkeypatch.setattr(metrics_module, "test_metrics", lambda *args, **kwargs: next(measured))
    argv = [str(source), str(second), "--data-root", "unused", "--save-dtype", "int8", "--device", "cpu",
            "--out", str(out)]
    with pytest.raises(SystemExit) as info:
        evaluate_cli.main(argv)
    assert info.value.code == "python -m convnn.evaluate: second: metrics.test_loss must be a finite number, got nan"
    assert next(measured, None) is None and not out.exists()
    monkeypatch.setattr(metrics_module, "test_metrics", lambda *args, **kwargs: ok)
    evaluate_cli.main(argv)
    assert sorted(path.name for path in out.iterdir()) == ["second.json", "second.safetensors", "vit.json",
                                                           "vit.safetensors"]


def test_a_write_that_fails_removes_what_the_run_wrote(source, tmp_path, monkeypatch):
    """The second checkpoint's weights cannot be renamed into place: the first one's files are removed as well."""
    second, out = _copy(source, tmp_path / "src", "second"), tmp_path / "new"
    replace, calls = os.replace, []

    def third_fails(src, dst):
        calls.append(Path(dst).name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        replace(src, dst)

    monkeypatch.setattr(checkpoint_module.os, "replace", third_fails)
    with pytest.raises(SystemExit) as info:
        evaluate_cli.main([str(source), str(second), "--data-root", "unused", "--save-dtype", "int8", "--device",
                           "cpu", "--out", str(out)])
    assert info.value.code == "python -m convnn.evaluate: [Errno 28] No space left on device"
    assert calls == ["vit.safetensors", "vit.json", "second.safetensors"] and list(out.iterdir()) == []


def test_evaluating_only_reports_every_checkpoint_that_works_and_names_those_that_do_not(source, tmp_path, capsys):
    """Without --out, a checkpoint that does not load or measures NaN costs only its own row."""
    model, card = load_checkpoint(source)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.mul_(1e15)  # finite weights, inf logits, a NaN loss
    _, huge = save_checkpoint(model, tmp_path / "src" / "huge", card, dtype=torch.float32)
    missing = tmp_path / "src" / "missing.json"
    with pytest.raises(SystemExit) as info:
        evaluate_cli.main([str(missing), str(source), str(huge), "--data-root", "unused", "--device", "cpu"])
    assert info.value.code == (f"python -m convnn.evaluate: 2 of 3 checkpoints could not be evaluated (the others "
                               f"are in the table above): {missing}: checkpoint file "
                               f"{missing.with_suffix('.safetensors')} does not exist; {huge}: huge: "
                               f"metrics.test_loss must be a finite number, got nan")
    table = capsys.readouterr().out.splitlines()
    (top1, loss), size = _metrics(source), source.with_suffix(".safetensors").stat().st_size
    assert len(table) == 2 and table[1].split() == ["vit", "float16", f"{size / 1e6:.2f}", "MB", "55.50",
                                                    f"{top1:.2f}", f"{loss:.4f}"]


def test_a_float_resave_of_an_int8_checkpoint_drops_the_before_quantization_metrics(source, tmp_path):
    """Those numbers describe how int8 storage changed the float model: a float32 copy stores no quantisation."""
    options = ["--data-root", "unused", "--device", "cpu"]
    evaluate_cli.main([str(source), *options, "--save-dtype", "int8", "--out", str(tmp_path / "int8")])
    assert "test_top1_before_quantization" in json.loads((tmp_path / "int8" / "vit.json").read_text())["metrics"]
    evaluate_cli.main([str(tmp_path / "int8" / "vit.json"), *options, "--save-dtype", "float32",
                       "--out", str(tmp_path / "fp32")])
    metrics = json.loads((tmp_path / "fp32" / "vit.json").read_text())["metrics"]
    top1, loss = _metrics(tmp_path / "fp32" / "vit.json")
    assert metrics.keys() == {"test_top1", "test_loss"} and metrics == pytest.approx(
        {"test_top1": top1, "test_loss": loss}, rel=1e-5)


RANDOM_IMAGES = 24


def test_a_random_candidate_model_is_measured_as_mean_and_std_over_5_draws(tmp_path, monkeypatch, capsys):
    """The row and the re-saved card give the mean of top-1 and loss over eval draws 0 … 4 and the sample std of
    top-1, each draw computed here with candidate_draw; the card records the draw scheme. Defects it catches: the
    draws not applied (every draw is draw 0), a population std, a card without the scheme. Half of the generated
    images: each image is run 25 times (5 draws: here, the direct measurement, the table and the re-save's source
    and stored weights), and 24 already set the draws' losses ≥ 3e-4 apart."""
    import statistics

    from convnn.candidates import DRAW_SCHEME, candidate_draw
    from convnn.metrics import summarize_draws

    images, labels = IMAGES[:RANDOM_IMAGES], LABELS[:RANDOM_IMAGES]
    monkeypatch.setattr(evaluate_cli, "load_cifar10", lambda root, split: (images, labels))
    model_name, args = SMALL_MODELS["cnn-random"]
    torch.manual_seed(1)
    card = ModelCard(name="rnd", model=model_name, model_args=args, classes=list(CIFAR10_CLASSES), input_size=32,
                     mean=list(CIFAR10_MEAN), std=list(CIFAR10_STD), metrics={"test_top1": 10.0, "test_loss": 2.3})
    model = create_model(model_name, **args)
    with torch.no_grad():  # a confident head, so that the draws' losses lie far apart
        [module for module in model.modules() if isinstance(module, torch.nn.Linear)][-1].weight.mul_(100)
    _, source = save_checkpoint(model, tmp_path / "src" / "rnd", card, dtype=torch.float32)
    model, card = load_checkpoint(source)
    x, targets = normalize(torch.from_numpy(images), tuple(card.mean), tuple(card.std)), torch.from_numpy(labels)
    top1, loss = [], []
    for draw in range(5):
        with torch.no_grad(), candidate_draw(draw):
            logits = model(x)
        top1.append(100 * (logits.argmax(1) == targets).sum().item() / RANDOM_IMAGES)
        loss.append(F.cross_entropy(logits, targets).item())
    apart = min(abs(a - b) for a, b in itertools.combinations(loss, 2))
    assert apart > 1e-5  # five different draws, far apart next to the rounding of the loss's sum
    data = evaluate_cli.EvaluationData(images, labels, RANDOM_IMAGES, torch.device("cpu"))  # the reference's batch
    measured = data.draw_metrics(model, card)
    assert [m["test_loss"] for m in measured] == pytest.approx(loss, abs=apart / 10, rel=0)  # each its own draw
    assert [m["test_top1"] for m in measured] == pytest.approx(top1)
    assert summarize_draws([{"test_top1": 80.0, "test_loss": 1.0}, {"test_top1": 82.0, "test_loss": 3.0}]
                           ) == pytest.approx({"test_top1": 81.0, "test_loss": 2.0, "test_top1_std": 2**0.5})
    evaluate_cli.main([str(source), "--data-root", "unused", "--device", "cpu", "--batch-size", str(RANDOM_IMAGES)])
    row = capsys.readouterr().out.splitlines()[1]
    spread = ", ".join(f"{value:.2f}" for value in top1)
    assert (f"{statistics.mean(top1):.2f} ± {statistics.stdev(top1):.2f} over 5 draws ({spread})" in row
            and f"{statistics.mean(loss):.4f}" in row)
    out = tmp_path / "out"
    evaluate_cli.main([str(source), "--data-root", "unused", "--device", "cpu", "--save-dtype", "float32",
                       "--out", str(out)])
    saved = json.loads((out / "rnd.json").read_text())
    assert saved["metrics"] == pytest.approx({"test_top1": statistics.mean(top1), "test_loss": statistics.mean(loss),
                                              "test_top1_std": statistics.stdev(top1)}, rel=1e-5, abs=1e-9)
    assert saved["evaluation"] == {"draw_scheme": DRAW_SCHEME, "draws": 5}
