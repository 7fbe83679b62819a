"""A researcher's ordinary models open in the app (convnn.adapters): a torchvision ResNet-18 and a small torchvision
ViT, uploaded through the checkpoint path, answer a click with the sets computed here by hand — the window a
strided convolution reads, and the K largest weights of ``nn.MultiheadAttention``'s own attention row."""

from __future__ import annotations

import json

import gradio as gr
import pytest
import torch

import analysis as an
from convnn import ModelCard, create_model, save_checkpoint
from convnn.data import CIFAR10_CLASSES
from tests import small_models
from tests.app.browser import browser_page, expect_chain, settle
from tests.app.test_app import page
from tests.app.test_browser import pixel_position, shown

plain_checkpoint_dir = small_models.plain_checkpoint_dir  # shared fixture

STRIDED = "layer2.0.conv1"  # 3×3, stride 2, padding 1, on the 8×8 map of a 32 px input
ATTENTION = "encoder.layers.encoder_layer_1.self_attention"  # 4 heads over CLS + 8×8 patches of 4 px


def strided_window(row_px: int, col_px: int) -> list[list[int]]:
    """By hand: pixel → cell of the 8×8 map (4 px each) → the stride-2 output covering it, o = cell // 2 → its 3×3
    taps 2·o − 1 + (0, 1, 2) on each axis, raster order."""
    row, col = row_px // 4, col_px // 4
    return [[2 * (row // 2) - 1 + a, 2 * (col // 2) - 1 + b] for a in range(3) for b in range(3)]


def attention_top(loaded: an.LoadedModel, image: an.InputImage, px: tuple[int, int], head: int = 0, k: int = 9):
    """By hand: the k largest weights of the query patch's row in ``nn.MultiheadAttention``'s own attention
    (``need_weights=True``, per head) on the layer's input, as cells (None for the class token)."""
    module = loaded.model.get_submodule(ATTENTION)
    captured = {}
    handle = module.register_forward_pre_hook(lambda _, args: captured.update(x=args[0]))
    with torch.no_grad():
        loaded.model(an.model_input(image, loaded.card))
        handle.remove()
        x = captured["x"]
        _, weights = module(x, x, x, need_weights=True, average_attn_weights=False)  # (1, h, N, N)
    token = 1 + (px[0] // 4) * 8 + px[1] // 4
    top = weights[0, head, token].topk(k).indices.tolist()
    return [None if t == 0 else [(t - 1) // 8, (t - 1) % 8] for t in top]


@pytest.fixture(scope="module")
def uploaded(explorer, plain_checkpoint_dir) -> dict[str, str]:
    """The two models uploaded through the app's checkpoint path: name → the model list's choice."""
    choices = {}
    for name in small_models.PLAIN_MODELS:
        files = [str(plain_checkpoint_dir / f"{name}.json"), str(plain_checkpoint_dir / f"{name}.safetensors")]
        choices[name] = explorer.on_checkpoint_upload(files, [])["uploads"][0][1]
    return choices


def test_a_torchvision_resnet18_answers_with_the_window_its_convolution_reads(explorer, uploaded, example_image):
    shown_model = explorer.on_model(uploaded["tv-resnet18"])
    assert "ResNet, plain convolutions (no ConvNN layer)" in shown_model["card"]
    assert (an.layer_label(explorer.model(uploaded["tv-resnet18"]).layer_info(STRIDED)), STRIDED) in \
        shown_model["layer"]["choices"]
    for px in ((13, 22), (0, 31), (31, 4)):
        values = page(uploaded["tv-resnet18"], example_image, STRIDED, *px)
        loaded, image = explorer.loaded(values["query"])
        got = an.query_neighbors(loaded, image, STRIDED, px).sets["layer"]
        assert got.cells.tolist() == strided_window(*px)
    stem = an.query_neighbors(loaded, image, "conv1", (5, 7)).sets["layer"]  # 7×7, stride 2, padding 3
    assert stem.cells[0].tolist() == [2 * (5 // 2) - 3, 2 * (7 // 2) - 3] and len(stem.cells) == 49
    shown_table = explorer.on_first_render(**values)  # the page's table opens too, and says why it is off-centre
    assert shown_table["layer"] == STRIDED and any("stride 2" in note for note in shown_table["notes"])


def test_a_torchvision_vit_answers_with_the_largest_weights_of_its_attention_row(explorer, uploaded, example_image):
    shown_model = explorer.on_model(uploaded["tv-vit"])
    assert "VisionTransformer, MHSA" in shown_model["card"] and shown_model["head"]["visible"]
    loaded, image = explorer.model(uploaded["tv-vit"]), explorer.image(str(example_image))
    for px, head in (((5, 27), 0), ((30, 1), 3)):
        got = an.query_neighbors(loaded, image, ATTENTION, px, an.RuleOptions(head=head)).sets["layer"]
        cells = [None if prefix else cell for cell, prefix in zip(got.cells.tolist(), got.is_prefix, strict=True)]
        assert cells == attention_top(loaded, image, px, head)


def test_a_model_with_no_layer_to_open_is_refused_at_upload(explorer, tmp_path):
    """A ViT of 1-pixel patches and no blocks has neither a window wider than one cell nor attention: refused with
    a message, not a model list entry whose every view fails."""
    args = dict(image_size=32, patch_size=1, num_layers=0, num_heads=1, hidden_dim=8, mlp_dim=8, num_classes=10)
    model = create_model("torchvision.models.VisionTransformer", **args).eval()
    card = ModelCard(name="empty", model="torchvision.models.VisionTransformer", model_args=args,
                     classes=list(CIFAR10_CLASSES), input_size=32, mean=[0.5] * 3, std=[0.25] * 3)
    weights, card_path = save_checkpoint(model, tmp_path / "empty", card)
    with pytest.raises(gr.Error, match="has no layer these views open"):
        explorer.on_checkpoint_upload([str(card_path), str(weights)], [])


@pytest.mark.browser
def test_both_open_through_the_upload_and_answer_a_click_in_the_page(app_url, explorer, uploaded,
                                                                     plain_checkpoint_dir, chromium):
    """Uploaded in the page (its own copy of the same files), after a refused pair, each answers a click with the set
    computed by hand."""
    image_file = explorer.examples[0]  # what the page shows first
    with browser_page(chromium, app_url) as tab:
        tab.get_by_text("Model card, or open your own checkpoint").click()
        tab.locator("#checkpoint_files input[type=file]").set_input_files(  # a pair that does not fit: refused
            [plain_checkpoint_dir / "tv-vit.json", plain_checkpoint_dir / "tv-resnet18.safetensors"])
        tab.wait_for_selector(".toast-body:has-text('sha256 differs from the card')", timeout=60_000)
        settle(tab)  # the refused pair is emptied from the box: the next upload is two files again
        for name, layer, px in (("tv-resnet18", STRIDED, (13, 22)), ("tv-vit", ATTENTION, (5, 27))):
            upload = expect_chain(tab, "upload", "checkpoint_files")
            tab.locator("#checkpoint_files input[type=file]").set_input_files(
                [plain_checkpoint_dir / f"{name}.json", plain_checkpoint_dir / f"{name}.safetensors"])
            tab.wait_for_function("name => [...document.querySelectorAll('#checkpoint input')].some(input => "
                                  "input.value.includes(name))", arg=name, timeout=60_000)
            settle(tab, upload)  # the model's views, its layer list among them
            tab.locator("#layer input").click()
            tab.locator("#layer input").fill(layer)
            layer_chain = expect_chain(tab, "input", "layer")
            tab.get_by_role("option").filter(has_text=layer).first.click()
            tab.wait_for_function(f"document.querySelector('.cx').dataset.layer === '{layer}'", timeout=60_000)
            settle(tab, layer_chain)
            table = explorer.on_table(**page(uploaded[name], image_file, layer))  # the same geometry
            tab.locator("#explorer .cx-canvas").first.click(position=pixel_position(tab, table, px))
            assert shown(tab)["query"] == f"{px[0]},{px[1]}"
            loaded, image = explorer.model(uploaded[name]), explorer.image(image_file)
            expected = strided_window(*px) if name == "tv-resnet18" else attention_top(loaded, image, px)
            assert json.loads(shown(tab)["neighbors"]) == expected


def test_one_broken_card_in_a_folder_leaves_out_only_itself_from_the_spectrum_of_every_model(
        plain_checkpoint_dir, tmp_path, example_image):
    """A --checkpoints folder with a card whose weights are another model's: the chart of every model places the
    others and says which one it left out (a warning, not an error for the whole chart)."""
    import shutil

    import app

    for name in ("tv-vit.json", "tv-vit.safetensors", "tv-resnet18.json"):
        shutil.copy(plain_checkpoint_dir / name, tmp_path / name)
    shutil.copy(plain_checkpoint_dir / "tv-vit.safetensors", tmp_path / "tv-resnet18.safetensors")
    explorer = app.Explorer(tmp_path, device="cpu")
    with pytest.warns(UserWarning, match="Left out, as they cannot be loaded: tv-resnet18"):
        figure = explorer.on_spectrum_models(an.Query(image_file=str(example_image)))
    assert [trace.name for trace in figure.data] == ["tv-vit"]
