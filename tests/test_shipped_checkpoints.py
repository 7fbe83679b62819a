"""The checkpoints shipped in checkpoints/: they load, their cards are complete, and the weights score what the
cards say on a fixed 500-image subset of the CIFAR-10 test split (tests/data/)."""

import fcntl
import functools
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from convnn import load_checkpoint
from convnn.data import normalize
from convnn.presets import PRESETS
from kernels import record_backends
from tests.conftest import ROOT

CARDS = sorted((ROOT / "checkpoints").glob("*.json"))
CARD_FIELDS = {"epochs", "seed", "train_time_s", "hardware", "date", "versions"}
SHIPPED = {"cnn-l0", "cnn-l0.25", "cnn-l0.5", "cnn-l0.75", "cnn-l1", "cnn-l0.5-random32", "cnn-l0.5-blend0.5",
           "vit-mhsa", "vit-kvt16", "vit-convnn16", "vit-convnn16-random32", "vit-mhsa-e180", "vit-convnn16-e180"}
MAX_CHECKPOINT_BYTES = 3_000_000
MAX_TOTAL_BYTES = 20_000_000


def test_checkpoints_are_shipped_and_small():
    assert {card.stem for card in CARDS} == SHIPPED  # the README's results table
    sizes = [card.with_suffix(".safetensors").stat().st_size for card in CARDS]
    assert max(sizes) <= MAX_CHECKPOINT_BYTES and sum(sizes) <= MAX_TOTAL_BYTES


TEST_SUBSET = ROOT / "tests" / "data" / "cifar10-test-every20th"  # .png mosaic + .json labels (500 images)
# |accuracy on the subset − the card's on the 10,000|, ≈ 3 std of a binomial at 85 %: 250 images (every other one of
# the 500) for every card, std 2.3 points (measured offsets −0.7 … +4.8); all 500 for the hybrid pair, std 1.6.
CARD_SUBSET, CARD_TOLERANCE = 250, 6.5
PAIR_SUBSET, PAIR_TOLERANCE = 500, 4.5


@functools.cache
def _subset() -> tuple[torch.Tensor, torch.Tensor]:
    """The 500 test images (every 20th of CIFAR-10's test split) as uint8 (500, 32, 32, 3), and their labels."""
    meta = json.loads(TEST_SUBSET.with_suffix(".json").read_text())
    rows, cols = meta["tiles"]
    mosaic = np.asarray(Image.open(TEST_SUBSET.with_suffix(".png")).convert("RGB"))
    images = mosaic.reshape(rows, 32, cols, 32, 3).transpose(0, 2, 1, 3, 4).reshape(-1, 32, 32, 3)
    assert hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest() == meta["pixels_sha256"]
    return torch.from_numpy(np.ascontiguousarray(images)), torch.tensor(meta["labels"])


PAIR = ("cnn-l0", "cnn-l0.5")  # the hybrid pair: scored on all 500 images
# Images per forward pass: the dense (N, N) scores of a 32×32 map (4 MB a sample) stay in the CPU's caches for a
# couple of samples; 100 at a time ran 2.5× slower. Eval-mode predictions do not depend on the batch.
BATCH = 2


@pytest.fixture(scope="session")
def predictions_dir(tmp_path_factory) -> Path:
    """Where the predictions of this run are kept: one folder for all pytest-xdist workers."""
    root = tmp_path_factory.getbasetemp()
    folder = (root.parent if "PYTEST_XDIST_WORKER" in os.environ else root) / "shipped-predictions"
    folder.mkdir(exist_ok=True)
    return folder


def _half_predictions(folder: Path, card_path: Path, half: int) -> tuple[torch.Tensor, set[str]]:
    """The checkpoint's predictions on every other image of the 500 (half 0 the even ones, half 1 the odd ones),
    and the aggregation paths it ran: computed once per run, by the first test to ask (the other pytest-xdist
    worker waits on the file lock, then reads them)."""
    saved = folder / f"{card_path.stem}-{half}.json"
    with open(saved.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not saved.exists():
            model, card = load_checkpoint(card_path)
            x = normalize(_subset()[0][half::2], tuple(card.mean), tuple(card.std))
            with torch.no_grad(), record_backends() as used:
                predicted = torch.cat([model(batch).argmax(1) for batch in x.split(BATCH)])
            saved.write_text(json.dumps({"predicted": predicted.tolist(), "used": sorted(used)}))
    result = json.loads(saved.read_text())
    return torch.tensor(result["predicted"]), set(result["used"])


def _measured(folder: Path, card_path: Path, count: int) -> tuple[float, set[str]]:
    """Top-1 accuracy (percent) on ``count`` of the 500 images: the CARD_SUBSET (every other one) or all of them,
    and the aggregation paths run."""
    # All 500: the odd half first, since the card's test (the even half) may be running on the other worker.
    halves = (0,) if count == CARD_SUBSET else (1, 0)
    predicted, used = zip(*(_half_predictions(folder, card_path, half) for half in halves), strict=True)
    labels = torch.cat([_subset()[1][half::2] for half in halves])
    assert len(labels) == count
    return 100 * (torch.cat(predicted) == labels).float().mean().item(), set().union(*used)


@pytest.mark.parametrize("card_path", CARDS, ids=[c.stem for c in CARDS])
def test_shipped_checkpoint_scores_its_cards_accuracy_on_250_test_images(card_path: Path, predictions_dir: Path):
    """The weights, not the card: their accuracy on a fixed 250-image test subset agrees with the card's."""
    card = load_checkpoint(card_path)[1]
    assert CARD_FIELDS <= card.training.keys() and card.data["train_sha256"] and card.data["test"] == 10_000
    accuracy, used = _measured(predictions_dir, card_path, CARD_SUBSET)
    assert accuracy == pytest.approx(card.metrics["test_top1"], abs=CARD_TOLERANCE)
    # The card names the aggregation path training took: "none (...)" exactly for models that run no aggregation.
    assert card.training["backend"].startswith("none") == (not used)


@pytest.mark.parametrize("name", PAIR)
def test_the_hybrid_pair_reaches_90_percent_on_cifar10_test(name, predictions_dir: Path):
    """The card says ≥ 90 % on the 10,000 test images, and the weights agree on all 500 images of the subset."""
    card_path = ROOT / "checkpoints" / f"{name}.json"
    accuracy, _ = _measured(predictions_dir, card_path, PAIR_SUBSET)
    claimed = json.loads(card_path.read_text())["metrics"]["test_top1"]
    assert claimed >= 90.0 and accuracy == pytest.approx(claimed, abs=PAIR_TOLERANCE)


SEED_CARDS = sorted((ROOT / "checkpoints" / "logs").glob("*.card.json"))


@pytest.mark.parametrize("card_path", CARDS + SEED_CARDS, ids=[c.name for c in CARDS + SEED_CARDS])
def test_each_zoo_run_used_its_presets_recipe_unchanged(card_path: Path):
    """One recipe per family, identical but for the named change: every field a preset sets is what the run used;
    runs are named PRESET (seed 0), PRESET-sSEED (python -m convnn.zoo) or PRESET-eEPOCHS (the longer-budget runs,
    whose only change is ``--epochs``)."""
    card = json.loads(card_path.read_text())
    recipe = card["recipe"]
    seed = recipe["seed"]
    name = recipe["name"].removesuffix(f"-s{seed}") if seed else recipe["name"]
    name, longer, epochs = name.rpartition("-e") if re.fullmatch(r".+-e\d+", name) else (name, "", "")
    expected = dict(PRESETS[name], epochs=int(epochs)) if longer else PRESETS[name]
    assert {key: recipe[key] for key in expected} == expected and card["model"] == expected["model"]
    assert card["training"]["seed"] == seed and card["training"]["epochs"] == expected["epochs"]


def test_every_shipped_model_is_placed_on_one_spectrum_axis():
    """The Spectrum tab's chart of every model: each shipped model a row, its layers at their selection_spectrum
    distances in input pixels; λ = 0 (convolutions only) at the conv end: every layer 100% inside its window, the
    smallest mean distance of all models, the bottom row."""
    import analysis as an
    import app

    explorer = app.Explorer(ROOT / "checkpoints", device="cpu")
    image = explorer.examples[0]
    figure = explorer.on_spectrum_models(image, "crop")
    assert {trace.name for trace in figure.data} == SHIPPED
    rows = an.selection_spectrum(an.load_model(ROOT / "checkpoints" / "cnn-l0.json"), an.load_image(image))
    conv = next(trace for trace in figure.data if trace.name == "cnn-l0")
    cells = {16: 2, 32: 1, 8: 4}  # input pixels per cell of a 32, 16 and 8 cell grid on the 32 px input
    assert list(conv.x) == pytest.approx([r.mean_distance * cells[r.grid_side] for r in rows])
    assert list(conv.marker.color) == [100.0] * len(rows)
    means = {trace.name: float(np.mean(trace.x)) for trace in figure.data}
    assert min(means, key=means.get) == "cnn-l0" == figure.data[0].name
    assert means["vit-mhsa"] > 3 * means["cnn-l0"]  # attention spreads over the image
