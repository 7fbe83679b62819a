"""A ResNet-18 converted by convnn.convert opens in the explorer (its card names the registered constructor and the
conversion; its cost is checked before anything is built), and the views work on its strided layers: each cell of a
stride-2 layer's input grid shows the selection of its output, whose query sits on the strided grid (METHOD §3a),
checked against a forward pass recorded here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from analysis import (
    RuleOptions,
    branch_mix,
    cell_rect_px,
    conv_equivalence,
    layer_label,
    load_model,
    model_input,
    model_view,
    neighbor_contributions,
    neighbor_table,
    page_table,
    receptive_field,
    rule_selection,
)
from convnn import CheckpointError, ModelCard, create_model, record_neighbors, save_checkpoint
from convnn.budget import check_cost
from convnn.data import CIFAR10_CLASSES
from convnn.models import CONVERTED_RESNET18, registry

STRIDED = "layer2.0.conv1"  # 3×3, stride 2, padding 1: a 16×16 input grid at 64 px, an 8×8 output
CONVERSION = dict(num_classes=10, rule="all", branch_ratio=0.5, num_neighbors=4)


def card_of(**model_args) -> ModelCard:
    return ModelCard(name="converted", model=CONVERTED_RESNET18, model_args=model_args,
                     classes=list(CIFAR10_CLASSES), input_size=64, mean=[0.5] * 3, std=[0.25] * 3)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    torch.manual_seed(0)
    model = create_model(CONVERTED_RESNET18, **CONVERSION).eval()
    path = tmp_path_factory.mktemp("converted") / "converted"
    save_checkpoint(model, path, card_of(**CONVERSION))
    return load_model(path.with_suffix(".json"))


def recorded(loaded, image) -> tuple[torch.Tensor, torch.Tensor]:
    """The strided layer's ConvNN branch in a forward pass run here: its recorded indices (64 queries × K, into the
    16×16 map) and its input."""
    inputs = {}
    branch = loaded.model.get_submodule(STRIDED)
    handle = branch.register_forward_pre_hook(lambda _, args: inputs.update(x=args[0]))
    with torch.no_grad(), record_neighbors(loaded.model) as records:
        loaded.model(model_input(image, loaded.card))
    handle.remove()
    return records[f"{STRIDED}.knn"][0].topk_idx[0, 0], inputs["x"]


def test_the_card_names_the_constructor_and_the_conversion_and_opens_with_strided_layers(loaded, image):
    assert loaded.card.model == "convnn.convert:torchvision.models.resnet18"
    assert len(loaded.layer_infos) == 16  # the hybrids; the stem and the 1×1 downsamples are not opened
    layer_info = loaded.layer_info(STRIDED)
    assert (layer_info.kind, layer_info.stride, layer_info.padding, layer_info.height, layer_info.width) == (
        "hybrid", 2, 1, 16, 16)
    assert "K=4 stride 2" in layer_label(layer_info)
    table = page_table(model_view(image, 64), neighbor_table(loaded, image, STRIDED), (20, 44), loaded.card, {})
    assert table["grid"] == [16, 16] and {rule["k"] for rule in table["rules"]} == {4}
    assert any("ConvNN layer with stride 2 and padding 1" in note for note in table["notes"])


def test_a_card_over_the_budget_or_with_an_unknown_option_is_refused_before_anything_is_built(monkeypatch):
    def never(**_):
        raise AssertionError("the constructor ran before the cost check")

    monkeypatch.setitem(registry._MODELS, CONVERTED_RESNET18, never)
    with pytest.raises(CheckpointError, match="refused before building it"):
        check_cost(card_of(**dict(CONVERSION, num_classes=100_000_000)), "card")
    with pytest.raises(CheckpointError, match="takes no option 'stride'"):
        check_cost(card_of(**CONVERSION, stride=2), "card")
    check_cost(card_of(**CONVERSION), "card")  # within the budget: nothing raised, nothing built


def test_each_cell_of_a_strided_layer_shows_its_outputs_selection_with_the_query_on_the_strided_grid(loaded,
                                                                                                    image):
    """Cell (r, c) of the 16×16 input grid shows output (r // 2, c // 2): its K cells as this forward pass recorded
    them, rank 0 the query cell (2·(r // 2), 2·(c // 2)) ("same" padding, stride 2)."""
    idx, _ = recorded(loaded, image)
    selection = rule_selection(loaded, image, STRIDED, "layer", RuleOptions())
    for r in range(16):
        for c in range(16):
            output = (r // 2) * 8 + c // 2
            expected = [divmod(int(i), 16) for i in idx[output]]
            assert [tuple(cell) for cell in selection.cells[r * 16 + c].tolist()] == expected
            assert expected[0] == (2 * (r // 2), 2 * (c // 2))


def test_one_hop_of_a_strided_layer_reaches_the_pixels_of_its_outputs_selection(loaded, image):
    """The multi-hop view: from pixel (20, 44) (cell (5, 11), output (2, 5)) one hop reaches the 4 px cells the output
    selected, the query's own cell being hop 0."""
    idx, _ = recorded(loaded, image)
    field = receptive_field(loaded, image, STRIDED, (20, 44), num_hops=1)
    layer_info = loaded.layer_info(STRIDED)
    expected = np.zeros((64, 64), bool)
    for i in idx[2 * 8 + 5].tolist():
        top, left, bottom, right = cell_rect_px(layer_info, *divmod(i, 16))
        expected[top:bottom, left:right] = True
    assert ((field.hops == 0) | (field.hops == 1)).tolist() == (expected | _cell_mask(layer_info, 5, 11)).tolist()
    assert _cell_mask(layer_info, 5, 11).tolist() == (field.hops == 0).tolist()


def _cell_mask(layer_info, row: int, col: int) -> np.ndarray:
    mask = np.zeros((64, 64), bool)
    top, left, bottom, right = cell_rect_px(layer_info, row, col)
    mask[top:bottom, left:right] = True
    return mask


def test_contributions_and_the_lambda_mix_of_a_strided_cell_are_its_outputs(loaded, image):
    """The contributions of pixel (20, 44) sum, with the bias, to the ConvNN branch's output (2, 5) computed here;
    the λ share of its cell is the share of that output, computed here from the branches and the 1×1 mix."""
    _, x = recorded(loaded, image)
    module = loaded.model.get_submodule(STRIDED)
    with torch.no_grad():
        branches = module.branches(x)  # (1, C_out, 8, 8)
        split = module.knn_channels
        parts = [F.conv2d(branches[:, :split], module.mix.weight[:, :split]).norm(dim=1)[0],
                 F.conv2d(branches[:, split:], module.mix.weight[:, split:]).norm(dim=1)[0]]
    contributions = neighbor_contributions(loaded, image, STRIDED, (20, 44))
    np.testing.assert_allclose(contributions.output, branches[0, :split, 2, 5].numpy(), rtol=1e-5, atol=1e-5)
    assert contributions.max_abs_residual < 1e-4
    mix = branch_mix(loaded, image, STRIDED)
    assert mix.share.shape == (16, 16)
    expected = (parts[0] / (parts[0] + parts[1])).numpy()
    np.testing.assert_allclose(mix.share, np.repeat(np.repeat(expected, 2, 0), 2, 1), rtol=1e-5, atol=1e-6)


def test_the_page_draws_as_much_padding_as_a_dilated_window_reaches(tmp_path, image):
    """Window selection with dilation 2 and padding 2 (METHOD §3a) reads cells 2 outside the map: the page draws two
    rings of padding cells, not the R // 2 = 1 of an undilated 3×3."""
    args = dict(widths=[8], depths=[1], branch_ratio=0.5, selection="window", dilation=2, padding=2)
    model = create_model("convnn_resnet_cifar", **args).eval()
    card = ModelCard(name="dilated", model="convnn_resnet_cifar", model_args=args, classes=list(CIFAR10_CLASSES),
                     input_size=32, mean=[0.5] * 3, std=[0.25] * 3)
    save_checkpoint(model, tmp_path / "dilated", card)
    loaded = load_model(tmp_path / "dilated.json")
    layer = loaded.layer_infos[0].name
    cells = rule_selection(loaded, image, layer, "layer", RuleOptions()).cells
    assert cells[0].tolist() == [[r, c] for r in (-2, 0, 2) for c in (-2, 0, 2)]  # cell (0, 0)'s dilated window
    table = page_table(model_view(image, 32), neighbor_table(loaded, image, layer), (0, 0), card, {})
    assert table["padding"] == 2 and len(table["row_edges_px"]) == 32 + 2 * 2 + 1


def test_the_equivalence_demo_of_a_strided_layer_is_its_own_strided_convolution(loaded, image):
    """Window selection with the conv branch's weights and geometry (stride 2, padding 1) against that branch, on the
    layer's input: an 8×8 picture, F.conv2d computed here, a difference of rounding only."""
    _, x = recorded(loaded, image)
    branch = loaded.model.get_submodule(STRIDED).conv
    result = conv_equivalence(loaded, image, STRIDED)
    assert "own 3×3, stride 2 convolution" in result.description
    with torch.no_grad():
        expected = F.conv2d(x, branch.weight, None, stride=2, padding=1)[0]
    np.testing.assert_allclose(result.reference, expected[result.channel].numpy(), rtol=1e-5, atol=1e-6)
    assert result.convnn.shape == (8, 8) and result.max_abs_diff < 1e-5
