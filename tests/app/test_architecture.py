"""The how-tos of docs/architecture.md, each done: a new selection rule, a new view and a new model (the knob's is
tests/app/test_toy_knob.py), each added the way the page says and nothing else changed. The toy rule is
:func:`tests.app.conftest.toy_rule` (compare mode's button for it: tests/app/test_browser.py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gradio.utils import get_upload_folder

import analysis as an
import app
from app_api import endpoint, takes
from convnn import ConvNN2d, ModelCard, save_checkpoint
from convnn.data import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD
from convnn.models import registry
from tests.app.test_app import CELL_LAYER


def test_a_registered_rule_runs_in_a_layer_and_in_the_tables(toy_rule, checkpoint_dir, example_image):
    torch.manual_seed(0)
    layer = ConvNN2d(3, 4, num_neighbors=2, selection="first", backend="reference").eval()
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        out = layer(x)
    tokens = x.flatten(2)  # (B, C, N): every output cell gathers tokens 0 and 1, ρ = "none"
    expected = torch.einsum("oct,bct->bo", layer.weight, tokens[:, :, :2]) + layer.bias
    torch.testing.assert_close(out, expected[:, :, None, None].expand(2, 4, 5, 5))

    loaded, image = an.load_model(checkpoint_dir / "cnn-l0.5.json"), an.load_image(example_image)
    table = an.neighbor_table(loaded, image, CELL_LAYER, an.RuleOptions(num_neighbors=3))
    cells = table.query((10, 20)).sets["first"].cells  # the toy rule's row beside the built-in ones
    assert [tuple(cell) for cell in np.asarray(cells)] == [(0, 0), (0, 1), (0, 2)]  # the first 3 tokens, raster


class ViewExplorer(app.Explorer):
    """The explorer with one view more: the image's mean brightness in the model's view, 0–255."""

    @takes("checkpoint", "image_file", "fit", required=["checkpoint", "image_file"])
    def api_brightness(self, query: an.Query, request=None) -> dict:
        loaded, image = self.loaded(query, request)
        return {"brightness": float(an.model_view(image, loaded.card.input_size).mean())}


def test_a_new_view_is_an_endpoint_of_the_api(checkpoint_dir, example_image, monkeypatch):
    monkeypatch.setattr(app, "API", [*app.API, "brightness"])
    explorer = ViewExplorer(checkpoint_dir, device="cpu")
    demo = app.build_demo(explorer)
    assert "/brightness" in {f"/{fn.api_name}" for fn in demo.fns.values() if fn.api_name}
    stored = Path(get_upload_folder()) / "architecture-test" / "cat_0.png"  # an upload in Gradio's cache
    stored.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(example_image, stored)
    answer = endpoint(explorer.api_brightness)("cnn-l0.5", {"path": str(stored)})
    view = an.model_view(an.load_image(example_image), 32)
    assert answer == {"brightness": pytest.approx(float(view.mean()))}
    assert 0 < answer["brightness"] < 255


PLUGIN = '''"""A toy model family, registered where the explorer is started with --import."""
from torch import nn

from convnn import ConvNN2d
from convnn.models.registry import register_model


@register_model
def toy_mean_colour(num_classes: int = 10) -> nn.Module:
    """A 3×3 ConvNN layer (the window rule) and a linear head over the mean colour."""
    return nn.Sequential(ConvNN2d(3, 3, kernel_size=3, selection="window"), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(3, num_classes))
'''


@pytest.fixture
def toy_plugin(tmp_path, monkeypatch):
    """A module ``toy_models`` in the current folder that registers a model (forgotten again afterwards)."""
    (tmp_path / "toy_models.py").write_text(PLUGIN, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    sys.modules.pop("toy_models", None)
    registry._MODELS.pop("toy_mean_colour", None)


def test_a_registered_model_opens_in_the_explorer(toy_plugin, example_image):
    app.import_plugins(["toy_models"])  # what `python app.py --import toy_models` does before building the explorer
    torch.manual_seed(0)
    model = registry.create_model("toy_mean_colour").eval()
    card = ModelCard(name="toy", model="toy_mean_colour", model_args={}, classes=list(CIFAR10_CLASSES), input_size=32,
                     mean=list(CIFAR10_MEAN), std=list(CIFAR10_STD))
    save_checkpoint(model, toy_plugin / "checkpoints" / "toy", card)
    explorer = app.Explorer(toy_plugin / "checkpoints", device="cpu")
    assert explorer.shipped() == ["toy"] and explorer.left_out() == []  # the model list offers it
    loaded = an.load_model(toy_plugin / "checkpoints" / "toy.json")
    assert [info.name for info in loaded.layer_infos] == ["0"]  # its ConvNN layer is a layer the views open
    image = an.load_image(example_image)
    with torch.no_grad():
        expected = torch.softmax(model(an.model_input(image, loaded.card))[0], 0)
    top = an.top_classes(loaded, image)
    best = max(top, key=top.get)
    assert best == CIFAR10_CLASSES[int(expected.argmax())]
    assert top[best] == pytest.approx(float(expected.max()), abs=1e-6)


def test_a_module_that_cannot_be_imported_is_named(toy_plugin):
    with pytest.raises(ImportError, match="no_such_models"):
        app.import_plugins(["no_such_models"])
