"""The checkpoints shipped in checkpoints/: they load, their cards are complete, and they classify the samples."""

import json
import re
from pathlib import Path

import pytest
import torch
from PIL import Image

from convnn import load_checkpoint
from convnn.data import preprocess_image
from convnn.presets import PRESETS
from kernels import record_backends
from tests.conftest import ROOT

CARDS = sorted((ROOT / "checkpoints").glob("*.json"))
SAMPLES = sorted((ROOT / "examples").glob("*_[01].png"))  # CIFAR-10 test images, 2 per class, named CLASS_i.png
CARD_FIELDS = {"epochs", "seed", "train_time_s", "hardware", "date", "versions"}
SHIPPED = {"cnn-l0", "cnn-l0.25", "cnn-l0.5", "cnn-l0.75", "cnn-l1", "cnn-l0.5-random32", "cnn-l0.5-blend0.5",
           "vit-mhsa", "vit-kvt16", "vit-convnn16", "vit-convnn16-random32", "vit-mhsa-e180", "vit-convnn16-e180"}
MAX_CHECKPOINT_BYTES = 3_000_000
MAX_TOTAL_BYTES = 20_000_000


def test_checkpoints_are_shipped_and_small():
    assert {card.stem for card in CARDS} == SHIPPED  # the README's results table
    sizes = [card.with_suffix(".safetensors").stat().st_size for card in CARDS]
    assert max(sizes) <= MAX_CHECKPOINT_BYTES and sum(sizes) <= MAX_TOTAL_BYTES


@pytest.mark.parametrize("card_path", CARDS, ids=[c.stem for c in CARDS])
def test_shipped_checkpoint_classifies_at_least_17_of_the_20_samples(card_path: Path):
    model, card = load_checkpoint(card_path)
    assert CARD_FIELDS <= card.training.keys() and card.data["train_sha256"] and card.metrics["test_top1"] > 0
    images = torch.cat([preprocess_image(Image.open(path), card.input_size, tuple(card.mean), tuple(card.std))
                        for path in SAMPLES])
    truth = torch.tensor([card.classes.index(path.stem.rsplit("_", 1)[0]) for path in SAMPLES])
    with torch.no_grad(), record_backends() as used:
        predicted = model(images).argmax(1)
    assert len(SAMPLES) == 20 and (predicted == truth).sum() >= 17
    # The card names the aggregation path training took: "none (...)" exactly for models that run no aggregation.
    assert card.training["backend"].startswith("none") == (not used)


@pytest.mark.parametrize("name", ["cnn-l0", "cnn-l0.5"])
def test_the_hybrid_pair_reaches_90_percent_on_cifar10_test(name):
    card = json.loads((ROOT / "checkpoints" / f"{name}.json").read_text())
    assert card["metrics"]["test_top1"] >= 90.0 and card["data"]["test"] == 10_000


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
