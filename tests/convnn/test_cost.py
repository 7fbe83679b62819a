"""A model's cost from its arguments alone (convnn.models.cost) against the model itself, built on the meta device."""

import pytest
import torch

from convnn import CheckpointError, ModelCard
from convnn.budget import MAX_ACTIVATIONS, MAX_FLOPS, MAX_MODULES, MAX_PARAMETERS, build_on_meta
from convnn.models import create_model, model_cost
from convnn.presets import PRESETS

CASES = [
    ("convnn_resnet_cifar", 32, dict(widths=[64, 128, 176], depths=[1, 1, 1], num_neighbors=9)),
    ("convnn_resnet_cifar", 32, dict(widths=[8, 16], depths=[2, 0], branch_ratio=0.0)),
    ("convnn_resnet_cifar", 16, dict(widths=[8, 16, 16], depths=[1, 2, 1], branch_ratio=1.0, qk_dim=4,
                                     weighting="softmax", coord_channels=True, groups=8)),
    ("convnn_resnet_cifar", 32, dict(widths=[8, 12], depths=[1, 1], branch_ratio=0.25, selection="random",
                                     num_candidates=16, in_chans=1, num_classes=3)),
    ("convnn_vit_cifar", 32, dict(attention="mhsa")),
    ("convnn_vit_cifar", 32, dict(dim=32, depth=2, num_heads=2, attention="kvt", num_neighbors=9)),
    ("convnn_vit_cifar", 16, dict(img_size=16, dim=24, depth=3, num_heads=3, mlp_ratio=2.5, attention="convnn",
                                  num_neighbors=5, selection="random", num_candidates=8)),
    ("convnn_resnet50", 224, dict()),
    ("convnn_resnet50", 224, dict(branch_ratio=0.0, num_classes=10)),
    ("convnn_vit_b16", 224, dict()),
    ("torchvision.models.resnet18", 224, dict()),
    ("torchvision.models.resnet18", 17, dict(num_classes=3)),  # odd sides through every stride
    ("convnn.convert:torchvision.models.resnet18", 224, dict()),
    ("convnn.convert:torchvision.models.resnet18", 65, dict(num_classes=3, branch_ratio=0.0)),
    ("convnn.convert:torchvision.models.resnet18", 64, dict(num_classes=10, rule="random", num_candidates=12,
                                                            branch_ratio=0.25, stride_form="pool")),
    ("convnn.convert:torchvision.models.resnet18", 64, dict(rule="window", qk_dim=4, weighting="softmax",
                                                            candidate_padding=False, num_neighbors=5)),
    ("torchvision.models.VisionTransformer", 224, dict()),  # ViT-B/16
    ("torchvision.models.VisionTransformer", 32, dict(image_size=32, patch_size=4, num_layers=2, num_heads=4,
                                                      hidden_dim=64, mlp_dim=128, num_classes=10)),
]


@pytest.mark.parametrize("name, input_size, args", CASES)
def test_the_cost_counts_exactly_the_state_dict_values_and_modules_of_the_built_model(name, input_size, args):
    cost = model_cost(name, input_size, **args)
    with torch.device("meta"):
        model = create_model(name, **args)
    assert cost.values == sum(t.numel() for t in model.state_dict().values())
    assert cost.modules == len(list(model.modules()))


def test_the_multiply_adds_of_a_plain_cnn_are_its_convolutions_and_its_head():
    """λ = 0, one stage of 8 channels at 32×32: stem 3·8·9, two hybrids of a 3×3 (8·8·9) and a 1×1 mix (8·8) per
    pixel, BatchNorm and the 8 → 10 head."""
    cost = model_cost("convnn_resnet_cifar", 32, widths=[8], depths=[1], branch_ratio=0.0)
    pixels = 32 * 32
    convolutions = (3 * 8 * 9 + 2 * (8 * 8 * 9 + 8 * 8)) * pixels
    assert cost.flops == convolutions + 3 * 8 * pixels + 8 * 10  # three BatchNorms, the head


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_within_the_card_budget(name):
    preset = PRESETS[name]
    size = 224 if name.startswith("imagenet") else 32
    cost = model_cost(preset["model"], size, **preset["model_args"])
    assert cost.values <= MAX_PARAMETERS and cost.modules <= MAX_MODULES
    assert cost.flops <= MAX_FLOPS and cost.activations <= MAX_ACTIVATIONS


@pytest.mark.parametrize("args, message", [(dict(mlp_ratio=1e308), "cannot convert float infinity to integer"),
                                           (dict(drop_path_rate=10**30), "int too big to convert")])
def test_arguments_that_overflow_are_refused_as_a_card_error(args, message):
    """A card's mlp_ratio of 1e308 overflowed int() in the cost function: an OverflowError, not a card error."""
    card = ModelCard(name="x", model="convnn_vit_cifar", model_args=dict(dim=32, depth=1, num_heads=2, **args),
                     classes=[str(i) for i in range(10)], input_size=32, mean=[0.5] * 3, std=[0.25] * 3)
    with pytest.raises(CheckpointError, match=f"x: cannot build model 'convnn_vit_cifar' \\({message}"):
        build_on_meta(card, "x")
