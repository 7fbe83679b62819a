"""Fixtures of the analysis tests: loaded small models and the example image."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from analysis import InputImage, LoadedModel, image_from_array, load_image, load_model
from tests import small_models

checkpoint_dir = small_models.checkpoint_dir  # shared fixtures
example_image = small_models.example_image


@pytest.fixture(scope="session")
def load_small(checkpoint_dir):
    """``load_small(name) -> LoadedModel`` for a name of ``tests/conftest.py``'s ``SMALL_MODELS``."""
    def load(name: str) -> LoadedModel:
        return load_model(checkpoint_dir / f"{name}.json")
    return load


@pytest.fixture(scope="session")
def image(example_image) -> InputImage:
    return load_image(example_image)


@pytest.fixture
def fresh_image(request) -> InputImage:
    """A 32×32 noise image no other test uses (seeded by the test's name), so every per-image cache starts cold."""
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))
    return image_from_array(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
