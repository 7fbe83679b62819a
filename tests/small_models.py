"""Small random-weight checkpoints (no trained weights needed) and the example image, for analysis and app tests.

The models are tiny versions of the shipped families, so the tests run in seconds on 2 CPU cores. The conftest of
``tests/analysis`` and of ``tests/app`` import these fixtures.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from convnn import ModelCard, create_model, save_checkpoint
from convnn.data import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_IMAGE = REPO_ROOT / "examples" / "cat_0.png"
_TINY_CNN = dict(widths=[8, 16, 16], depths=[1, 1, 1], num_neighbors=9)
_TINY_VIT = dict(dim=32, depth=2, num_heads=2)
SMALL_MODELS = {
    "cnn-l0.5": ("convnn_resnet_cifar", dict(_TINY_CNN, branch_ratio=0.5)),
    "cnn-l0": ("convnn_resnet_cifar", dict(_TINY_CNN, branch_ratio=0.0)),
    "cnn-random": ("convnn_resnet_cifar", dict(_TINY_CNN, branch_ratio=0.5, selection="random", num_candidates=12)),
    "vit-convnn": ("convnn_vit_cifar", dict(_TINY_VIT, attention="convnn", num_neighbors=9)),
    "vit-mhsa": ("convnn_vit_cifar", dict(_TINY_VIT, attention="mhsa")),
}


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory) -> Path:
    """A folder holding one small random-init checkpoint per entry of :data:`SMALL_MODELS`."""
    folder = tmp_path_factory.mktemp("checkpoints")
    for index, (name, (model_name, args)) in enumerate(SMALL_MODELS.items()):
        torch.manual_seed(index)
        model = create_model(model_name, **args).eval()
        card = ModelCard(name=name, model=model_name, model_args=args, classes=list(CIFAR10_CLASSES), input_size=32,
                         mean=list(CIFAR10_MEAN), std=list(CIFAR10_STD), metrics={"test_top1": 10.0})
        save_checkpoint(model, folder / name, card)
    return folder


PLAIN_MODELS = {  # torchvision models a card may name (convnn.models.plain), opened through convnn.adapters
    "tv-resnet18": ("torchvision.models.resnet18", dict(num_classes=10)),
    "tv-vit": ("torchvision.models.VisionTransformer", dict(image_size=32, patch_size=4, num_layers=2, num_heads=4,
                                                            hidden_dim=64, mlp_dim=128, num_classes=10)),
}


@pytest.fixture(scope="session")
def plain_checkpoint_dir(tmp_path_factory) -> Path:
    """A folder holding the random-init torchvision checkpoints of :data:`PLAIN_MODELS` (the ResNet-18 in int8,
    11 MB; torchvision's zero-initialised ViT head made random, so that its prediction is not uniform)."""
    folder = tmp_path_factory.mktemp("plain")
    for index, (name, (model_name, args)) in enumerate(PLAIN_MODELS.items()):
        torch.manual_seed(index)
        model = create_model(model_name, **args).eval()
        if hasattr(model, "heads"):
            torch.nn.init.normal_(model.heads.head.weight, std=0.5)
        card = ModelCard(name=name, model=model_name, model_args=args, classes=list(CIFAR10_CLASSES), input_size=32,
                         mean=list(CIFAR10_MEAN), std=list(CIFAR10_STD))
        save_checkpoint(model, folder / name, card, dtype=torch.int8 if "resnet" in name else None)
    return folder


@pytest.fixture(scope="session")
def example_image() -> Path:
    """A 32×32 CIFAR-10 example shipped with the app."""
    return EXAMPLE_IMAGE
