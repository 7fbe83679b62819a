"""A model's layer infos, checkpoint listing and loading, image intake and display mapping
(layer infos/checkpoints/images)."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from analysis import (
    attribution_map,
    card_summary,
    compute_path,
    display_factor,
    display_image,
    display_to_input_px,
    image_from_array,
    list_checkpoints,
    load_image,
    load_model,
    model_input,
    query_neighbors,
    top_classes,
)
from convnn import CheckpointError, load_checkpoint, save_checkpoint
from convnn.budget import MAX_EXHAUSTIVE_TOKENS
from convnn.data import normalize
from tests.image_files import png_claiming_size
from tests.small_models import REPO_ROOT


def test_resnet_layer_infos_in_forward_order_with_their_grids(load_small):
    layer_infos = load_small("cnn-l0.5").layer_infos
    assert [layer_info.name for layer_info in layer_infos] == [
        "stages.0.0.conv1", "stages.0.0.conv2", "stages.0.1.0", "stages.1.0.conv1", "stages.1.0.conv2", "stages.1.1.0",
        "stages.2.0.conv1", "stages.2.0.conv2"]
    assert [layer_info.height for layer_info in layer_infos] == [32, 32, 32, 16, 16, 16, 8, 8]
    assert {(layer_info.kind, layer_info.record_name is not None, layer_info.num_neighbors)
            for layer_info in layer_infos} == {("hybrid", True, 9)}


def test_vit_layer_infos_are_the_attention_blocks(load_small):
    for name, mixer in (("vit-convnn", "convnn"), ("vit-mhsa", "mhsa")):
        layer_infos = load_small(name).layer_infos
        assert [layer_info.name for layer_info in layer_infos] == ["blocks.0.attn", "blocks.1.attn"]
        assert {(layer_info.kind, layer_info.mixer, layer_info.height, layer_info.width, layer_info.num_prefix_tokens,
                 layer_info.num_heads) for layer_info in layer_infos} == {("attention", mixer, 8, 8, 1, 2)}


def test_listing_and_cards(checkpoint_dir):
    listed = list_checkpoints(checkpoint_dir)
    assert [path.stem for _, path in listed.found] == ["cnn-l0", "cnn-l0.5", "cnn-random", "vit-convnn", "vit-mhsa"]
    assert listed.refused == []
    summary = card_summary(load_model(checkpoint_dir / "cnn-random.json").card)
    assert "hybrid λ=0.5, K=9, random (r=12)" in summary and "10.00%" in summary
    assert compute_path("cpu") == "PyTorch reference on cpu"


def test_listing_leaves_out_what_cannot_be_opened_and_says_why(checkpoint_dir, tmp_path, deadline):
    """A researcher's runs folder holds half-written cards: each file that cannot be opened is left out with why
    (no folder named), the others are listed. A FIFO named like a card hung the listing (and the app's startup); a
    card name with a lone surrogate, or a file name that is not UTF-8, broke every reply that carried the list; a
    link to a file that is no card was not a reason shown anywhere; an integer of 5,000 digits raised past the
    listing. Only cards and weights' headers are read."""
    card = json.loads((checkpoint_dir / "cnn-l0.json").read_text())
    weights = (checkpoint_dir / "cnn-l0.safetensors").read_bytes()
    files = {"good": json.dumps(card), "bad": json.dumps(card | {"metrics": [1]}), "broken": "{not json",
             "deep": "[" * 100_000 + "]" * 100_000, "half": json.dumps(card), "args": json.dumps(
                 card | {"model_args": card["model_args"] | {"widths": "x"}}),
             "surrogate": json.dumps(card | {"name": "\ud800"}), "lonely": json.dumps(card),
             "digits": json.dumps(card)[:-1] + ', "seed": ' + "9" * 5000 + "}"}
    for stem, text in files.items():
        (tmp_path / f"{stem}.json").write_text(text)
        if stem != "lonely":
            (tmp_path / f"{stem}.safetensors").write_bytes(weights[:len(weights) // 2] if stem == "half" else weights)
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "fifo.safetensors").write_bytes(weights)
    (tmp_path / "notes.txt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "passwd.json").symlink_to(tmp_path / "notes.txt")
    (tmp_path / "passwd.safetensors").write_bytes(weights)
    (tmp_path / os.fsdecode(b"name\xff.json")).write_text(json.dumps(card))
    (tmp_path / os.fsdecode(b"name\xff.safetensors")).write_bytes(weights)
    deadline(30)
    listed = list_checkpoints(tmp_path)
    assert listed.found == [("good · cnn-l0: ResNet, hybrid λ=0.0", tmp_path / "good.json")]  # the file's name first,
    #                                                      as links and lessons name it, then what its card says
    assert listed.refused == [
        ("args.json", "cannot build model 'convnn_resnet_cifar' (widths must be a non-empty list of integers, got "
                      "'x')"),
        ("bad.json", "metrics must be a JSON object, got [1]"),
        ("broken.json", "not a readable JSON model card (JSONDecodeError: Expecting property name enclosed in "
                        "double quotes: line 1 column 2 (char 1))"),
        ("deep.json", "not a readable JSON model card (RecursionError: maximum recursion depth exceeded while "
                      "decoding a JSON array from a unicode string)"),
        ("digits.json", "the model card holds an integer of more than 4,300 digits: no field needs one"),
        ("fifo.json", "not a regular file"),
        ("half.json", "half.safetensors: not a whole safetensors file (Error while deserializing header: incomplete "
                      "metadata, file not fully covered)"),
        ("lonely.json", "no lonely.safetensors next to it"),
        ("name\\xff.json", "the file name is not UTF-8 text, which the page cannot show"),
        ("passwd.json", "not a readable JSON model card (JSONDecodeError: Expecting value: line 1 column 1 (char 0))"),
        ("surrogate.json", "the model card holds text that is not valid Unicode (a lone surrogate, such as \\ud800 "
                           "in its JSON)")]


def test_a_card_that_is_a_link_loads_with_the_weights_beside_the_link(checkpoint_dir, tmp_path):
    """A card linked into a folder (``ln -s ../runs/a.json a.json``) was loaded with the weights beside its target,
    and a link to anything else was reported as "does not exist"."""
    (tmp_path / "run").mkdir()
    shutil.copyfile(checkpoint_dir / "cnn-l0.json", tmp_path / "run" / "best.json")
    (tmp_path / "a.json").symlink_to(tmp_path / "run" / "best.json")
    shutil.copyfile(checkpoint_dir / "cnn-l0.safetensors", tmp_path / "a.safetensors")
    assert load_model(tmp_path / "a.json").card.name == "cnn-l0"
    (tmp_path / "passwd.json").symlink_to("/etc/passwd")
    shutil.copyfile(checkpoint_dir / "cnn-l0.safetensors", tmp_path / "passwd.safetensors")
    with pytest.raises(CheckpointError, match=re.escape("passwd.json: not a readable JSON model card")):
        load_model(tmp_path / "passwd.json")


def test_card_summary_tolerates_odd_metrics(checkpoint_dir):
    card = load_model(checkpoint_dir / "cnn-l0.json").card
    for metrics, shown in [({"test_top1": float("nan")}, "n/a"), ({"test_top1": "93%"}, "n/a"),
                           ([1], "not recorded"), ({}, "not recorded"), ({"test_top1": 93.1}, "93.10%")]:
        summary = card_summary(dataclasses.replace(card, metrics=metrics))
        assert summary.splitlines()[5] == f"test accuracy (top-1): {shown}"


def test_card_summary_gives_a_random_candidate_models_accuracy_over_its_draws(checkpoint_dir):
    """A card with test_top1_std and an evaluation block says mean ± std over how many draws and by which scheme
    (METHOD §3b); a card with only one of them shows the number alone."""
    card = load_model(checkpoint_dir / "cnn-random.json").card
    drawn = dataclasses.replace(card, metrics={"test_top1": 90.97, "test_top1_std": 0.164},
                                evaluation={"draw_scheme": "input-bits-splitmix64/v2", "draws": 5})
    assert card_summary(drawn).splitlines()[5] == ("test accuracy (top-1): 90.97% ± 0.16 (mean ± std over 5 eval "
                                                   "draws, input-bits-splitmix64/v2)")
    for odd in (dataclasses.replace(drawn, evaluation={}), dataclasses.replace(drawn, metrics={"test_top1": 90.97}),
                dataclasses.replace(drawn, metrics={"test_top1": 90.97, "test_top1_std": float("nan")})):
        assert card_summary(odd).splitlines()[5] == "test accuracy (top-1): 90.97%"


def test_card_summary_shows_how_the_weights_are_stored(checkpoint_dir):
    card = load_model(checkpoint_dir / "cnn-l0.json").card
    assert card_summary(card).splitlines()[-1] == "weights stored as: float32"
    int8 = dataclasses.replace(card, weights_dtype="int8", metrics={"test_top1": 90.0,
                                                                     "test_top1_before_quantization": 90.5})
    assert card_summary(int8).splitlines()[-1] == (
        "weights stored as: int8 (per-channel scales; before quantisation: 90.50%)")
    assert card_summary(dataclasses.replace(int8, metrics={})).splitlines()[-1].endswith(
        "before quantisation: not recorded)")


def test_load_model_is_cached_and_refuses_corrupt_weights(checkpoint_dir, tmp_path):
    assert load_model(checkpoint_dir / "cnn-l0.json") is load_model(checkpoint_dir / "cnn-l0.safetensors")
    card = json.loads((checkpoint_dir / "cnn-l0.json").read_text())
    (tmp_path / "bad.json").write_text(json.dumps(card))
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="sha256"):
        load_model(tmp_path / "bad.json")
    with pytest.raises(CheckpointError, match="needs both"):
        load_model(tmp_path / "missing.json")


def test_load_model_reloads_an_edited_card(checkpoint_dir, tmp_path):
    """The cache key held only the weights' size and mtime: an edited card (here a class renamed) was not read."""
    for suffix in (".json", ".safetensors"):
        shutil.copyfile(checkpoint_dir / f"cnn-l0{suffix}", tmp_path / f"mine{suffix}")
    card_path = tmp_path / "mine.json"
    first = load_model(card_path)
    card = json.loads(card_path.read_text())
    card["classes"][3] = "kitten"
    mtime_ns = card_path.stat().st_mtime_ns
    card_path.write_text(json.dumps(card))
    os.utime(card_path, ns=(mtime_ns + 10**9, mtime_ns + 10**9))  # a new mtime even on a coarse clock
    second = load_model(card_path)
    assert (first.card.classes[3], second.card.classes[3]) == ("cat", "kitten")
    assert second is not first and load_model(card_path) is second


def test_a_model_with_a_layer_over_the_token_budget_is_refused_at_load(checkpoint_dir, tmp_path):
    """Random selection passes convnn's budget (which guards exhaustive layers only), but the explorer's "all" rule
    scores every token of a layer against every other: at 72 px the first stage has 72² = 5184 > 4096 tokens."""
    model, card = load_checkpoint(checkpoint_dir / "cnn-random.json")
    for side in (64, 72):
        save_checkpoint(model, tmp_path / f"side{side}", dataclasses.replace(card, input_size=side))
    assert load_model(tmp_path / "side64.json").layer_infos[0].num_tokens == 4096 == MAX_EXHAUSTIVE_TOKENS  # the limit
    with pytest.raises(CheckpointError) as refused:
        load_model(tmp_path / "side72.json")
    assert str(refused.value) == (
        "side72.json: at input_size 72, layer stages.0.0.conv1 has N = 5184 tokens (72×72); the explorer compares "
        "every token with every other, so it opens models of at most 4096 tokens per layer: use a smaller input_size")


def test_a_card_naming_another_number_of_classes_is_an_error_not_an_index_error(load_small, image):
    """convnn refuses such a checkpoint at load; a LoadedModel built by hand gets a ValueError, never classes[i]
    past the end of the card's list."""
    loaded = load_small("vit-convnn")
    three = dataclasses.replace(loaded, card=dataclasses.replace(loaded.card, classes=loaded.card.classes[:3]))
    message = "vit-convnn: the model gives 10 class scores but its card names 3 classes"
    with pytest.raises(ValueError, match=message):
        top_classes(three, image)
    with pytest.raises(ValueError, match=message):
        attribution_map(three, image, "saliency", "airplane")  # a class the card does name


def test_top_classes_equal_the_model_softmax(load_small, image):
    loaded = load_small("vit-convnn")
    probabilities = torch.softmax(loaded.model(model_input(image, loaded.card)), dim=1)[0]
    top = top_classes(loaded, image)
    values, indices = probabilities.topk(5)
    assert list(top) == [loaded.card.classes[i] for i in indices.tolist()]
    np.testing.assert_allclose(list(top.values()), values.detach().numpy(), rtol=1e-5)


def test_a_model_whose_output_is_not_finite_is_a_clear_error(load_small, image):
    loaded = load_small("cnn-l0.5")
    broken = copy.deepcopy(loaded.model)
    broken.head.bias.data.fill_(float("inf"))
    with pytest.raises(ValueError, match=r"gives numbers that are not finite \(inf or NaN\) on this image, in the "
                                         "class scores: its weights or its card's mean/std overflow"):
        top_classes(dataclasses.replace(loaded, model=broken, layer_infos=()), image)


def test_image_intake_errors(tmp_path):
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "empty.png").write_bytes(b"")
    png_claiming_size(tmp_path / "huge.png", 20_000, 10_000)  # over Pillow's decompression-bomb limit
    with pytest.raises(ValueError, match="not an image that can be read"):
        load_image(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match="empty"):
        load_image(tmp_path / "empty.png")
    with pytest.raises(ValueError, match=r"^huge\.png has too many pixels to open safely"):
        load_image(tmp_path / "huge.png")
    with pytest.raises(ValueError, match="empty"):
        image_from_array(np.zeros((0, 5, 3), np.uint8))


def test_image_from_array_accepts_unambiguous_pixels():
    red_row = image_from_array(np.full((1, 5, 3), (255, 0, 0), np.uint8))
    assert red_row.pixels.shape == (1, 5, 3) and (red_row.pixels == (255, 0, 0)).all()  # was squeezed to 5×3 grey
    grey = image_from_array(np.full((4, 4, 1), 7, np.uint8))
    assert grey.pixels.shape == (4, 4, 3) and (grey.pixels == 7).all()
    ramp = np.linspace(0, 1, 8)
    floats = image_from_array(np.tile(ramp, (8, 1)))  # was black: floats in [0, 1] cast to uint8
    np.testing.assert_array_equal(floats.pixels[0, :, 0], np.rint(ramp * 255))
    mask = image_from_array(np.eye(4, dtype=bool))  # was near-black (1/255)
    np.testing.assert_array_equal(mask.pixels[..., 1], np.eye(4) * 255)
    sixteen = image_from_array(np.full((4, 4, 3), (65535, 100 * 257, 300), np.uint16))  # wrapped mod 256
    assert (sixteen.pixels == (255, 100, 1)).all() and sixteen.note == "a 16-bit image, reduced to 8 bits per pixel"
    rgba = image_from_array(np.full((4, 4, 4), (10, 20, 30, 0), np.uint8))
    assert (rgba.pixels == 255).all()  # transparent: white, not the colour hidden under alpha 0


def test_a_16_bit_array_reads_as_the_same_16_bit_png(tmp_path):
    values = (np.arange(64, dtype=np.uint32).reshape(8, 8) * 1031).astype(np.uint16)
    Image.fromarray(values).save(tmp_path / "gray16.png")
    from_file, from_array = load_image(tmp_path / "gray16.png"), image_from_array(values)
    np.testing.assert_array_equal(from_array.pixels, from_file.pixels)
    assert from_array.note == from_file.note


@pytest.mark.parametrize(("pixels", "message"), [
    (np.full((4, 4, 3), np.nan), "the image has NaN or infinite values"),
    (np.full((4, 4), np.inf, np.float32), "the image has NaN or infinite values"),
    (np.full((4, 4, 3), 200.0),
     r"a float image must hold values in \[0, 1\] \(they are scaled to 0–255\), got 200…200"),
    (np.zeros((4, 4, 2), np.uint8), r"got shape \(4, 4, 2\)"),
    (np.zeros((2, 4, 4, 3), np.uint8), r"got shape \(2, 4, 4, 3\)"),
    (np.zeros((4, 4, 3), np.int64), r"an image array must be uint8, uint16, bool or float in \[0, 1\], got int64"),
    (np.broadcast_to(np.uint8(0), (20_000, 10_000, 3)), r"the image is 10000×20000 px \(200 MP\); images of up to"),
])
def test_image_from_array_refuses_ambiguous_pixels(pixels, message):
    with pytest.raises(ValueError, match=message):
        image_from_array(pixels)


def test_large_images_are_downscaled_with_a_note(tmp_path):
    Image.new("RGB", (2048, 1024), (10, 20, 30)).save(tmp_path / "wide.png")
    image = load_image(tmp_path / "wide.png")
    assert image.pixels.shape == (512, 1024, 3)
    assert "downscaled from 2048×1024 to 1024×512 px" in image.note
    assert load_image(tmp_path / "wide.png") == image_from_array(np.full((512, 1024, 3), (10, 20, 30), np.uint8))


def test_16_bit_and_float_images_keep_their_gradient(tmp_path):
    """convert("RGB") clips 16-bit and float pixels to white; they are rescaled to 8 bits first."""
    ramp = np.arange(256)
    Image.fromarray(np.tile(ramp * 257, (128, 1)).astype(np.uint16)).save(tmp_path / "gray16.png")
    Image.fromarray(np.tile(ramp * 4.0 + 1.0, (128, 1)).astype(np.float32), "F").save(tmp_path / "float.tiff")
    sixteen = load_image(tmp_path / "gray16.png")
    np.testing.assert_array_equal(sixteen.pixels, np.tile(ramp.astype(np.uint8)[None, :, None], (128, 1, 3)))
    assert sixteen.note == "a 16-bit image, reduced to 8 bits per pixel"
    floating = load_image(tmp_path / "float.tiff")
    np.testing.assert_array_equal(floating.pixels, sixteen.pixels)  # 1…1021 stretched to 0…255
    assert floating.note == "a floating-point image: its values 1…1021 were stretched to 8 bits (0–255)"


def test_exif_orientation_is_applied(tmp_path):
    """EXIF orientation 6 (rotate 90° clockwise to show): a stored 64×32 image is shown 32 wide, 64 tall."""
    stored = np.zeros((32, 64, 3), np.uint8)
    stored[:, :32] = (255, 0, 0)  # left half red → top half once upright
    stored[:, 32:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation tag
    Image.fromarray(stored).save(tmp_path / "phone.jpg", exif=exif, quality=95)
    pixels = load_image(tmp_path / "phone.jpg").pixels.astype(int)
    assert pixels.shape == (64, 32, 3)
    assert pixels[:28, :, 0].min() > 200 and pixels[:28, :, 2].max() < 60
    assert pixels[36:, :, 2].min() > 200 and pixels[36:, :, 0].max() < 60


def test_display_mapping_round_trips_every_pixel_centre():
    factor = display_factor(32)
    assert factor == 8
    for row, col in [(0, 0), (10, 20), (31, 31)]:
        assert display_to_input_px(col * factor + 3.6, row * factor + 7.9, factor, 32, 32) == (row, col)
    with pytest.raises(ValueError, match="outside"):
        display_to_input_px(256, 0, factor, 32, 32)
    shown = display_image(np.zeros((32, 32, 3), np.uint8), factor, (10, 20))
    assert shown.shape == (256, 256, 3)
    assert shown[78, 158:170].min() == 255  # white outline just above the query pixel's block (rows 80..87)


@pytest.mark.parametrize("card_path", sorted((REPO_ROOT / "checkpoints").glob("*.json")), ids=lambda p: p.stem)
def test_shipped_checkpoints_open_and_answer_a_click(card_path, image, example_image):
    """Every shipped checkpoint (if any) loads, predicts what its model answers on the example (computed here: the
    checkpoint's model on the PNG's pixels normalised with its card's mean and std, softmax) and shows a window
    around a click in every layer."""
    loaded = load_model(card_path)
    model, card = load_checkpoint(card_path)
    pixels = torch.from_numpy(np.asarray(Image.open(example_image).convert("RGB")).copy())[None]  # (1, 32, 32, 3)
    with torch.no_grad():
        probabilities = torch.softmax(model(normalize(pixels, tuple(card.mean), tuple(card.std)))[0], 0)
    expected = dict(zip(card.classes, probabilities.tolist(), strict=True))
    answered = top_classes(loaded, image, count=len(card.classes))
    assert next(iter(answered)) == card.classes[probabilities.argmax()]
    assert answered == pytest.approx(expected, abs=1e-5)
    for layer_info in loaded.layer_infos:
        result = query_neighbors(loaded, image, layer_info.name, (16, 16))
        assert result.sets["window"].window_share == 1.0 and "layer" in result.sets
