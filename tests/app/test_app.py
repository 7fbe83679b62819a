"""The app's handlers (called directly), its API through gradio_client, and one click in a real browser."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image

import analysis as an
import app
from convnn import load_checkpoint, save_checkpoint
from convnn.budget import MAX_EXHAUSTIVE_TOKENS
from tests.image_files import png_claiming_size

CELL_LAYER = "stages.1.0.conv1"  # 16×16 cells, 2×2 px each, on the 32×32 input
NO_OVERRIDES = dict(k=0, window=0, candidates=0, seed=0, alpha=0.5, head=0)


def click(x_px: float, y_px: float) -> gr.SelectData:
    """What Gradio passes to a ``.select`` handler for a click at display pixel (x, y)."""
    return gr.SelectData(None, {"index": [x_px, y_px], "value": None})


def test_click_handler_returns_the_window_around_the_clicked_cell(explorer, checkpoint_dir, example_image):
    checkpoint = str(checkpoint_dir / "cnn-l0.5.json")
    row_px, col_px = explorer.on_click(checkpoint, click(20 * 8 + 4, 10 * 8 + 4))  # display is 8× upscaled
    assert (row_px, col_px) == (10, 20)
    shown, _, stats, data = explorer.on_neighbors(checkpoint, str(example_image), CELL_LAYER, row_px, col_px,
                                                  **NO_OVERRIDES)
    files = explorer.on_export(checkpoint, str(example_image), CELL_LAYER, row_px, col_px, **NO_OVERRIDES)
    assert data["query"]["row"] == 5 and data["query"]["col"] == 10
    window = [(n["row"], n["col"]) for n in data["rules"]["window"]["neighbors"]]
    assert window == [(r, c) for r in (4, 5, 6) for c in (9, 10, 11)]
    assert data["rules"]["window"]["neighbors"][4]["rect_px"] == [10, 20, 12, 22]
    assert shown.shape == (256, 256, 3) and "Jaccard" in stats
    assert json.loads(Path(files[1]).read_text())["query"] == data["query"]
    assert Image.open(files[0]).width > 1000


def test_bad_images_give_clear_messages(explorer, checkpoint_dir, tmp_path):
    checkpoint = str(checkpoint_dir / "cnn-l0.5.json")
    (tmp_path / "notes.png").write_text("this is text, not a picture")
    (tmp_path / "empty.png").write_bytes(b"")
    png_claiming_size(tmp_path / "huge.png", 20_000, 10_000)  # over Pillow's decompression-bomb limit
    for name, message in [("notes.png", "not an image that can be read"), ("empty.png", "empty"),
                          ("huge.png", "huge.png has too many pixels to open safely")]:
        with pytest.raises(gr.Error, match=message):
            explorer.on_image(checkpoint, str(tmp_path / name))
        with pytest.raises(gr.Error, match=message):  # the upload button refuses it before it replaces the image
            explorer.on_image_upload(str(tmp_path / name))
    with pytest.raises(gr.Error, match="Pick an example or upload an image first"):
        explorer.on_image(checkpoint, None)


def test_what_was_done_to_an_image_is_said_on_the_page(explorer, checkpoint_dir, tmp_path):
    """The image's note (here: transparency made white) is shown as a warning when the image is used."""
    Image.new("RGBA", (8, 8), (255, 0, 0, 0)).save(tmp_path / "clear.png")
    with pytest.warns(UserWarning, match="transparent pixels were composited onto white"):
        explorer.on_image(str(checkpoint_dir / "cnn-l0.5.json"), str(tmp_path / "clear.png"))


def test_bad_checkpoints_and_options_give_clear_messages(explorer, checkpoint_dir, example_image, tmp_path):
    card = tmp_path / "mine.json"
    shutil.copyfile(checkpoint_dir / "cnn-l0.json", card)
    (tmp_path / "mine.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(gr.Error, match="sha256"):
        explorer.on_checkpoint_upload([str(card), str(tmp_path / "mine.safetensors")], [])
    with pytest.raises(gr.Error, match="upload exactly two files"):
        explorer.on_checkpoint_upload([str(card)], [])
    with pytest.raises(gr.Error, match="unknown checkpoint"):
        explorer.on_model("/etc/some.json")
    with pytest.raises(gr.Error, match="Choose a model first"):
        explorer.on_model(None)
    checkpoint = str(checkpoint_dir / "cnn-l0.5.json")
    with pytest.raises(gr.Error, match=r"K \(neighbours per query\) must be in \[1, 256\]"):
        explorer.on_neighbors(checkpoint, str(example_image), CELL_LAYER, 3, 3, **{**NO_OVERRIDES, "k": 999})


@pytest.mark.parametrize(("call", "message"), [
    (lambda ex, ck, im: ex.on_neighbors(ck, im, CELL_LAYER, float("inf"), 3, **NO_OVERRIDES),
     "query row must be a whole number, got inf"),
    (lambda ex, ck, im: ex.on_neighbors(ck, im, CELL_LAYER, 3, 3, **{**NO_OVERRIDES, "k": float("inf")}),
     r"K \(neighbours per query\) must be a whole number, got inf"),
    (lambda ex, ck, im: ex.on_neighbors(ck, im, CELL_LAYER, 3, 3, **{**NO_OVERRIDES, "k": 2.7}),
     r"K \(neighbours per query\) must be a whole number, got 2.7"),
    (lambda ex, ck, im: ex.on_neighbors(ck, im, CELL_LAYER, 3, 3, **{**NO_OVERRIDES, "seed": 2**63}),
     r"seed must be in \[0, 9223372036854775807\], got 9223372036854775808"),
    (lambda ex, ck, im: ex.on_neighbors(ck, im, CELL_LAYER, 3, 3, **{**NO_OVERRIDES, "head": 1e20}),
     r"head must be in \[0, 0\] for stages.1.0.conv1 \(1 head\), got 1\.00e\+20"),  # 21 digits: abbreviated
    (lambda ex, ck, im: ex.on_neighbors(ck, im, CELL_LAYER, 3, 3, **{**NO_OVERRIDES, "window": 101}),
     r"R must be odd with R² ≥ K = 9 and at most 17 \(as wide as the 16×16 grid of stages.1.0.conv1\), got R = 101"),
    (lambda ex, ck, im: ex.on_neighbors(ck, im, CELL_LAYER, 3, 3, **{**NO_OVERRIDES, "window": 19}),
     "at most 17"),
    (lambda ex, ck, im: ex.on_multihop(ck, im, CELL_LAYER, 3, 3, float("inf"), 0),
     "num_hops must be a whole number, got inf"),
    (lambda ex, ck, im: ex.on_pixels(im, 3, 3, 1e9, 1.0), r"K must be in \[1, 1024\], got 1000000000"),
    (lambda ex, ck, im: ex.on_pixels(im, 3, 3, 5, float("nan")), r"position_weight must be in \[0, 100.0\], got nan"),
])
def test_impossible_numbers_are_messages_before_any_work(explorer, checkpoint_dir, example_image, call, message):
    """inf, fractions, a seed past 2⁶⁴ − 1 or a window wider than the map: each a message naming the field (they
    were an OverflowError, an RNG overflow, or allocations growing with R²: 1.5 GB at R = 301, 24 GB at 2001)."""
    with pytest.raises(gr.Error, match=message):
        call(explorer, str(checkpoint_dir / "cnn-l0.5.json"), str(example_image))


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: you tried to "
                 "allocate 1536000000000 bytes. Error code 12 (Cannot allocate memory)"),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), MemoryError()], ids=repr)
def test_running_out_of_memory_is_a_message(explorer, checkpoint_dir, example_image, monkeypatch, error):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(an, "query_neighbors", fail)
    with pytest.raises(gr.Error) as refused:
        explorer.on_neighbors(str(checkpoint_dir / "cnn-l0.5.json"), str(example_image), CELL_LAYER, 3, 3,
                              **NO_OVERRIDES)
    assert refused.value.message == ("Not enough memory for this request: choose a smaller K, window R or r, another "
                                     "layer, or a smaller image or model, and try again.")


def test_a_bug_is_not_disguised_as_a_user_error(explorer, checkpoint_dir, example_image, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(an, "query_neighbors", fail)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        explorer.on_neighbors(str(checkpoint_dir / "cnn-l0.5.json"), str(example_image), CELL_LAYER, 3, 3,
                              **NO_OVERRIDES)


def stored_files(work_dir: Path) -> list[Path]:
    """The files an explorer's work dir holds (uploads and exports, in per-session folders)."""
    return [path for path in work_dir.rglob("*") if path.is_file()]


def test_an_upload_with_more_tokens_than_the_budget_is_refused(checkpoint_dir, tmp_path, monkeypatch):
    """A 40 KB random-selection checkpoint at input_size 128 has a 128×128 = 16384-token layer: the "all" rule
    would have asked for 7 GB on the first click. It is refused at upload, and leaves nothing behind."""
    monkeypatch.setattr(app, "WORK_DIR", tmp_path / "work")
    explorer = app.Explorer(checkpoint_dir, device="cpu")
    model, card = load_checkpoint(checkpoint_dir / "cnn-random.json")
    weights, card_path = save_checkpoint(model, tmp_path / "big", dataclasses.replace(card, input_size=128))
    with pytest.raises(gr.Error) as refused:
        explorer.on_checkpoint_upload([str(card_path), str(weights)], [])
    assert refused.value.message == (
        f"big.json: at input_size 128, layer stages.0.0.conv1 has N = 16384 tokens (128×128); the explorer compares "
        f"every token with every other, so it opens models of at most {MAX_EXHAUSTIVE_TOKENS} tokens per layer: use a "
        f"smaller input_size")
    assert stored_files(tmp_path / "work") == []


def test_a_card_naming_fewer_classes_than_the_model_outputs_is_refused_at_upload(explorer, checkpoint_dir, tmp_path):
    """It used to load and hit an IndexError in the prediction and the attribution (classes[i], i ≥ 5)."""
    card = json.loads((checkpoint_dir / "cnn-l0.json").read_text())
    (tmp_path / "five.json").write_text(json.dumps(card | {"classes": card["classes"][:5]}))
    shutil.copyfile(checkpoint_dir / "cnn-l0.safetensors", tmp_path / "five.safetensors")
    with pytest.raises(gr.Error, match=r"five.json: the card names 5 classes, but the model built from it outputs "
                                       r"\(1, 10\)"):
        explorer.on_checkpoint_upload([str(tmp_path / "five.json"), str(tmp_path / "five.safetensors")], [])


def test_a_refused_checkpoint_upload_leaves_no_folder_behind(checkpoint_dir, tmp_path, monkeypatch):
    """Whatever the validation raises (here an unexpected RuntimeError), the copied files are removed."""
    monkeypatch.setattr(app, "WORK_DIR", tmp_path)
    explorer = app.Explorer(checkpoint_dir, device="cpu")

    def fail(*args, **kwargs):
        raise RuntimeError("unexpected")

    monkeypatch.setattr(an.session.models, "load_model", fail)
    files = [str(checkpoint_dir / "cnn-l0.json"), str(checkpoint_dir / "cnn-l0.safetensors")]
    with pytest.raises(RuntimeError, match="unexpected"):
        explorer.on_checkpoint_upload(files, [])
    assert stored_files(tmp_path) == []


def test_a_refused_checkpoint_upload_names_the_file_not_the_server_folder(explorer, checkpoint_dir, tmp_path):
    card = json.loads((checkpoint_dir / "cnn-l0.json").read_text())
    (tmp_path / "mine.json").write_text(json.dumps(card | {"metrics": [1]}))
    shutil.copyfile(checkpoint_dir / "cnn-l0.safetensors", tmp_path / "mine.safetensors")
    with pytest.raises(gr.Error) as refused:
        explorer.on_checkpoint_upload([str(tmp_path / "mine.json"), str(tmp_path / "mine.safetensors")], [])
    assert refused.value.message.startswith("mine.json: metrics must be a JSON object")


def test_app_starts_with_a_malformed_card_in_the_folder(checkpoint_dir, tmp_path):
    """A card that cannot be read is skipped at startup; a NaN accuracy is shown as n/a, not nan%."""
    card = json.loads((checkpoint_dir / "cnn-l0.json").read_text())
    (tmp_path / "good.json").write_text(json.dumps(card | {"metrics": {"test_top1": float("nan")}}))
    (tmp_path / "bad.json").write_text(json.dumps(card | {"metrics": [1]}))
    for stem in ("good", "bad"):
        shutil.copyfile(checkpoint_dir / "cnn-l0.safetensors", tmp_path / f"{stem}.safetensors")
    explorer = app.Explorer(tmp_path, device="cpu")
    demo = app.build_demo(explorer)
    dropdown = next(block for block in demo.blocks.values() if getattr(block, "elem_id", None) == "checkpoint")
    assert [choice[1] for choice in dropdown.choices] == ["good"]  # a stem: no server path in the page
    shown, _, _ = explorer.on_model(str(tmp_path / "good.json"))
    assert "test accuracy (top-1): n/a" in shown and "nan%" not in shown


def test_a_head_outside_the_layer_is_a_message(explorer, checkpoint_dir, example_image):
    checkpoint, image = str(checkpoint_dir / "vit-convnn.json"), str(example_image)
    message = r"head must be in \[0, 1\] for blocks.0.attn \(2 heads\), got 2"
    with pytest.raises(gr.Error, match=message):
        explorer.on_weights(checkpoint, image, "blocks.0.attn", 5, 5, 2)
    with pytest.raises(gr.Error, match=message):
        explorer.on_multihop(checkpoint, image, "blocks.0.attn", 5, 5, 2, 2)
    with pytest.raises(gr.Error, match=message):
        explorer.on_neighbors(checkpoint, image, "blocks.0.attn", 5, 5, **{**NO_OVERRIDES, "head": 2})


def test_k_equal_to_n_shows_every_rule_and_explains_the_random_fallback(explorer, checkpoint_dir, example_image):
    """K = 1024 on a 32×32 map: random needs r = N, which is the all rule (METHOD §3), instead of an error."""
    checkpoint = str(checkpoint_dir / "cnn-l0.5.json")
    _, figure, stats, data = explorer.on_neighbors(checkpoint, str(example_image), "stages.0.0.conv1", 16, 16,
                                                      **{**NO_OVERRIDES, "k": 1024})
    assert data["options"]["num_candidates"] == 1024 and len(data["rules"]["random"]["neighbors"]) == 1024
    assert "the random rule draws every token, so it equals the all-tokens rule" in stats
    assert "… 992 more (in the JSON export)" in stats  # 32 cells listed per rule
    assert "(r ≥ N: same as all)" in figure.layout.annotations[2].text


def test_vit_stats_explain_that_padding_cells_do_not_exist_there(explorer, checkpoint_dir, example_image):
    _, _, stats, data = explorer.on_neighbors(str(checkpoint_dir / "vit-convnn.json"), str(example_image),
                                                 "blocks.0.attn", 0, 0, **NO_OVERRIDES)
    first = data["rules"]["window"]["neighbors"][0]
    assert (first["row"], first["col"]) == (-1, -1)  # the window at the corner reaches a padding cell
    assert "A ViT has no zero padding" in stats and "exactly as in a zero-padded convolution" not in stats


def test_uploaded_checkpoint_becomes_selectable(explorer, checkpoint_dir):
    update, uploads = explorer.on_checkpoint_upload(
        [str(checkpoint_dir / "vit-mhsa.json"), str(checkpoint_dir / "vit-mhsa.safetensors")], [])
    label, choice = uploads[0]
    assert update["value"] == choice and label == "uploaded: vit-mhsa: ViT, MHSA" and uploads[0] in update["choices"]
    card, layers, head = explorer.on_model(choice)
    assert "MHSA" in card and layers["value"] == "blocks.0.attn" and head["visible"]


def test_an_int8_upload_says_so_and_a_too_deep_card_is_a_message(checkpoint_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(app, "WORK_DIR", tmp_path / "work")
    explorer = app.Explorer(checkpoint_dir, device="cpu")
    model, card = load_checkpoint(checkpoint_dir / "vit-mhsa.json")
    weights, card_path = save_checkpoint(model, tmp_path / "mine8", card, dtype=torch.int8)
    _, uploads = explorer.on_checkpoint_upload([str(card_path), str(weights)], [])
    shown, _, _ = explorer.on_model(uploads[0][1])
    assert "weights stored as: int8 (per-channel scales" in shown
    card_path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(gr.Error) as refused:
        explorer.on_checkpoint_upload([str(card_path), str(weights)], [])
    assert refused.value.message.startswith("mine8.json: not a readable JSON model card (RecursionError")
    assert len(stored_files(tmp_path / "work")) == 2  # the first upload's two files: the refused one left nothing


def chain_steps(demo: gr.Blocks, component: gr.components.Component, event: str) -> list:
    """The handlers one event runs, in order: the one it triggers, then each ``.then`` after it."""
    steps = list(demo.fns.values())
    step = next(f for f in steps if (component._id, event) in f.targets)
    chain = [step]
    while (step := next((f for f in steps if f.trigger_after == step._id), None)) is not None:
        chain.append(step)
    return chain


def event_chain(demo: gr.Blocks, component: gr.components.Component, event: str) -> list[str]:
    return [step.name for step in chain_steps(demo, component, event)]


def run_event(demo: gr.Blocks, values: dict, component: gr.components.Component, event: str) -> None:
    """Run an event's chain as the page does: each step reads its inputs from ``values`` (component id → value)
    and writes its outputs back (the ``value`` of a ``gr.update``)."""
    for step in chain_steps(demo, component, event):
        result = step.fn(*[values[block._id] for block in step.inputs])
        for block, value in zip(step.outputs, result if len(step.outputs) > 1 else (result,), strict=True):
            is_update = isinstance(value, dict) and value.get("__type__") == "update"
            values[block._id] = value.get("value", values[block._id]) if is_update else value


def test_a_control_refreshes_only_the_tabs_that_read_it(explorer):
    demo = app.build_demo(explorer)
    controls = {getattr(block, "label", None): block for block in demo.blocks.values()}
    query = ["on_neighbors", "on_weights", "on_mix", "on_multihop"]
    assert event_chain(demo, controls["Layer"], "input") == [*query, "on_equivalence_reset"]
    assert event_chain(demo, controls["attention head"], "input") == ["on_neighbors", "on_weights", "on_multihop"]
    # The panel reads the typed query cell, so whatever redraws it redraws the tabs that read that cell: typing a
    # row and then changing K left the λ mix and the contributions at the old cell (a newcomer found it).
    for knob in ("K (0 = layer's)", "window R (0 = auto)", "random r ≥ K (0 = layer's / 32; ≥ N = all)",
                 "seed (0 = the layer's)"):
        assert event_chain(demo, controls[knob], "change") == query
    assert event_chain(demo, controls["blend α (0 = window, 1 = features)"], "release") == query
    for box in ("query row (px)", "query col (px)"):
        for trigger in ("submit", "blur"):  # a typed cell counts once entered, like a click
            assert event_chain(demo, controls[box], trigger) == query
    for box in ("row", "col"):  # the input-level view's cell (its boxes did nothing)
        assert event_chain(demo, controls[box], "submit") == ["on_pixels"]
    assert event_chain(demo, controls["hops (towards the input)"], "release") == ["on_multihop"]
    query_image = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "query_image")
    assert event_chain(demo, query_image, "select") == ["on_click", *query]


def test_a_new_model_or_image_refreshes_every_view(explorer):
    """Whatever the layer's value: a new model's default layer often has the old one's name, and then the layer
    dropdown fires no event. So a model or image change runs every view itself, and the layer and head controls
    listen to the user only (.input), never to a programmatic change (no .change: no second, racing run)."""
    demo = app.build_demo(explorer)
    blocks = {getattr(block, "elem_id", None) or getattr(block, "label", None): block
              for block in demo.blocks.values()}
    views = ["on_neighbors", "on_weights", "on_mix", "on_multihop", "on_equivalence_reset", "on_attribution"]
    assert event_chain(demo, blocks["checkpoint"], "change") == [
        "on_model", "on_query_px", "on_image", "on_spectrum", *views]
    assert event_chain(demo, blocks["image_file"], "change") == [
        "on_image", "on_spectrum", "on_pixel_image", "on_pixel_query", "on_pixels", *views]
    for control in (blocks["layer"], blocks["attention head"]):
        assert not any((control._id, "change") in step.targets for step in demo.fns.values() if step.fn)


def test_switching_to_a_model_with_the_same_layer_names_shows_the_new_model_everywhere(explorer, checkpoint_dir,
                                                                                        example_image, tmp_path):
    """cnn-l0.5 → cnn-random (same layer names), then another image: every view equals its handler's output for
    the new values. Before, the neighbour panel and the tabs kept the old model's, the input-level plot, the
    attribution and the equivalence text the old image's."""
    demo = app.build_demo(explorer)
    blocks = {getattr(block, "elem_id", None): block for block in demo.blocks.values()}
    values = {block._id: getattr(block, "value", None) for block in demo.blocks.values()}
    old, new = (str(checkpoint_dir / f"{name}.json") for name in ("cnn-l0.5", "cnn-random"))
    values[blocks["checkpoint"]._id], values[blocks["image_file"]._id] = old, str(example_image)
    run_event(demo, values, blocks["checkpoint"], "change")
    layer, before = values[blocks["layer"]._id], values[blocks["stats"]._id]
    values[blocks["equivalence_text"]._id] = "a result for the old model"
    values[blocks["checkpoint"]._id] = new
    run_event(demo, values, blocks["checkpoint"], "change")
    assert values[blocks["layer"]._id] == layer == "stages.1.0.conv1"
    _, _, stats, data = explorer.on_neighbors(new, str(example_image), layer, 16, 16, **NO_OVERRIDES)
    assert values[blocks["stats"]._id] == stats != before and values[blocks["neighbors_data"]._id] == data
    assert data["checkpoint"] == "cnn-random"
    hop_plot = next(step for step in demo.fns.values() if step.name == "on_multihop").outputs[0]
    expected_hops = explorer.on_multihop(new, str(example_image), layer, 16, 16, 2, 0)[0]
    assert values[hop_plot._id].to_json() == expected_hops.to_json()
    assert values[blocks["equivalence_text"]._id] == app.EQUIVALENCE_PROMPT
    expected = explorer.on_attribution(new, str(example_image), "saliency", "")[0]
    assert values[blocks["attribution_plot"]._id].to_json() == expected.to_json()

    image = tmp_path / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(image)
    pixel_row, pixel_col = next(step for step in demo.fns.values() if step.name == "on_pixel_query").outputs
    values[pixel_row._id], values[pixel_col._id] = 30, 5  # row 30 lies outside the new 20×24 image
    values[blocks["image_file"]._id] = str(image)
    run_event(demo, values, blocks["image_file"], "change")
    assert (values[pixel_row._id], values[pixel_col._id]) == (19, 5)  # the nearest pixel inside
    expected_pixels = explorer.on_pixels(str(image), 19, 5, 64, 0)
    assert values[blocks["pixel_plot"]._id].to_json() == expected_pixels.to_json()
    assert values[blocks["stats"]._id] == explorer.on_neighbors(new, str(image), layer, 16, 16, **NO_OVERRIDES)[2]
    expected = explorer.on_attribution(new, str(image), "saliency", "")[0]
    assert values[blocks["attribution_plot"]._id].to_json() == expected.to_json()


def test_tab_handlers_explain_layers_they_do_not_apply_to(explorer, checkpoint_dir, example_image):
    checkpoint = str(checkpoint_dir / "vit-mhsa.json")
    heat, _, _, note = explorer.on_weights(checkpoint, str(example_image), "blocks.0.attn", 5, 5, 0)
    assert heat is None and "no rank-slot kernel" in note
    figure, note = explorer.on_mix(checkpoint, str(example_image), "blocks.0.attn", 5, 5)
    assert figure is None and "not a hybrid layer" in note


def test_app_starts_and_predicts_through_gradio_client(app_url, checkpoint_dir, example_image):
    from gradio_client import Client, handle_file

    client = Client(app_url, verbose=False)
    checkpoint = str(checkpoint_dir / "vit-convnn.json")
    _, label = client.predict(checkpoint, handle_file(str(example_image)), api_name="/predict")
    loaded = an.load_model(checkpoint)
    with torch.no_grad():
        probabilities = torch.softmax(loaded.model(an.model_input(an.load_image(example_image), loaded.card)), 1)[0]
    values, indices = probabilities.topk(5)
    assert label["label"] == loaded.card.classes[int(indices[0])]
    got = {c["label"]: c["confidence"] for c in label["confidences"]}
    expected = {loaded.card.classes[i]: v for i, v in zip(indices.tolist(), values.tolist(), strict=True)}
    assert list(got) == list(expected)
    np.testing.assert_allclose(list(got.values()), list(expected.values()), rtol=1e-5)


def test_uploads_over_the_size_limit_are_refused(app_url):
    import httpx

    too_big = b"\0" * (app.MAX_UPLOAD_MB * 1024 * 1024 + 1)
    response = httpx.post(f"{app_url}gradio_api/upload", files={"files": ("big.png", too_big)})
    assert response.status_code == 413
    assert response.text == f"File size exceeded maximum allowed size of {app.MAX_UPLOAD_MB * 1024 * 1024} bytes."


@contextlib.contextmanager
def browser_page(url: str):
    """A headless Chromium page on ``url``, the default query's panel drawn (skips without /usr/bin/chromium)."""
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("needs /usr/bin/chromium (apt-get install -y chromium)")
    from playwright.sync_api import expect, sync_playwright

    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-quic", "--no-first-run"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=args)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(url)
            expect(page.locator("#neighbor_plot .gtitle")).to_contain_text("cell (8, 8)", timeout=60_000)
            yield page  # the default query, pixel (16, 16)
        finally:
            browser.close()


@pytest.mark.browser
def test_clicking_the_image_updates_the_overlay(app_url):
    from playwright.sync_api import expect

    with browser_page(app_url) as page:
        title = page.locator("#neighbor_plot .gtitle")
        image = page.locator("#query_image img")
        scale = image.bounding_box()["width"] / image.evaluate("img => img.naturalWidth")
        image.click(position={"x": (20 * 8 + 4) * scale, "y": (10 * 8 + 4) * scale})  # pixel (10, 20)
        expect(title).to_contain_text("cell (5, 10)", timeout=30_000)
        expect(page.locator("#row_px input")).to_have_value("10")
        expect(page.locator("#col_px input")).to_have_value("20")


@pytest.mark.browser
def test_switching_to_a_model_with_the_same_layer_names_updates_the_page(app_url, explorer, checkpoint_dir):
    """cnn-l0.5 → cnn-random: the default layer keeps its name, so the layer dropdown fires no change; the
    neighbour statistics must still become the new model's (they stayed the old model's, byte for byte). Then a
    layer picked by the user redraws the panel."""
    from playwright.sync_api import expect

    def jaccard_line(name: str) -> str:
        stats = explorer.on_neighbors(str(checkpoint_dir / f"{name}.json"), explorer.examples[0], CELL_LAYER, 16, 16,
                                      **NO_OVERRIDES)[2]
        return next(line for line in stats.splitlines() if line.startswith("**Jaccard")).replace("**", "")

    old, new = jaccard_line("cnn-l0.5"), jaccard_line("cnn-random")
    assert old != new
    with browser_page(app_url) as page:
        stats = page.locator("#stats")
        expect(stats).to_contain_text(old, timeout=30_000)
        page.locator("#checkpoint input").click()
        page.locator("#checkpoint input").fill("cnn-random")
        page.get_by_role("option").filter(has_text="cnn-random").first.click()
        expect(page.locator("#card textarea")).to_have_value(re.compile("^cnn-random: "), timeout=30_000)
        expect(stats).to_contain_text(new, timeout=60_000)
        page.locator("#layer input").click()  # a layer the user picks still updates the panel (.input)
        page.get_by_role("option").filter(has_text="stages.0.0.conv1 ·").first.click()
        expect(page.locator("#neighbor_plot .gtitle")).to_contain_text("cell (16, 16) in stages.0.0.conv1",
                                                                       timeout=30_000)


def _nearest_in_colour(q, k, grid, options):
    """A toy rule: the 'all' rule scored on the first 3 feature channels only ("nearest in colour")."""
    from convnn.selection import select_all

    return select_all(q[..., :3], k[..., :3], grid, options)


def test_a_rule_registered_in_the_library_is_a_selection_of_the_layer_every_view_and_the_app(
        explorer, checkpoint_dir, example_image, monkeypatch):
    """One registry (convnn.selection): adding a rule there makes ConvNN2d select with it, query_neighbors compute
    it and the app's page show it, with nothing else changed."""
    import torch.nn.functional as F

    from convnn import ConvNN2d
    from convnn.selection import SELECTION_RULES, SelectionRule

    rule = SelectionRule("colour", "nearest in colour only", _nearest_in_colour)
    monkeypatch.setitem(SELECTION_RULES, "colour", rule)
    torch.manual_seed(0)
    x = torch.randn(2, 5, 4, 6)
    layer = ConvNN2d(5, 3, num_neighbors=4, selection="colour")
    tokens = x.flatten(2).transpose(1, 2)  # (B, N, 5)
    colour = F.normalize(tokens[..., :3], dim=-1)
    scores = colour @ colour.transpose(1, 2)
    scores.diagonal(dim1=1, dim2=2).fill_(float("inf"))  # the query first
    idx = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :4]  # (B, N, K)
    gathered = torch.stack([tokens[b, idx[b]] for b in range(2)])  # (B, N, K, 5)
    expected = F.conv1d(gathered.permute(0, 3, 1, 2).reshape(2, 5, -1), layer.weight, layer.bias, stride=4)
    torch.testing.assert_close(layer(x), expected.view(2, 3, 4, 6), rtol=1e-5, atol=1e-5)

    loaded, image = an.load_model(checkpoint_dir / "cnn-l0.5.json"), an.load_image(example_image)
    result = an.query_neighbors(loaded, image, CELL_LAYER, (10, 20))
    assert list(result.sets) == ["window", "all", "random", "blend", "colour", "layer"]
    assert result.sets["colour"].cells.shape == (9, 2)  # the layer's K
    _, figure, stats, data = explorer.on_neighbors(str(checkpoint_dir / "cnn-l0.5.json"), str(example_image),
                                                   CELL_LAYER, 10, 20, **NO_OVERRIDES)
    assert "nearest in colour only" in stats and "colour" in data["rules"]
    assert any("nearest in colour only" in a.text for a in figure.layout.annotations)
