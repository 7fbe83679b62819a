"""The app's handlers (called directly), its wiring (the refresh policy), and its API through gradio_client.

The browser tests are in ``test_browser.py``.
"""

from __future__ import annotations

import base64
import dataclasses
import inspect
import json
import shutil
import socket
import threading
from pathlib import Path
from urllib.parse import parse_qsl

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image

import analysis as an
import app
import app_limits
import app_texts
import server
import server.guards as guards
from convnn import load_checkpoint, save_checkpoint
from convnn.budget import MAX_EXHAUSTIVE_TOKENS
from tests.image_files import png_claiming_size
from tests.loops import run_coroutine

CELL_LAYER = "stages.1.0.conv1"  # 16×16 cells, 2×2 px each, on the 32×32 input
KNOBS = dict(num_neighbors=0, window_size=0, num_candidates=0, seed=0, blend_alpha=0.5, head=0)  # the layer's own


def page(checkpoint, image_file, layer=CELL_LAYER, row_px=16, col_px=16, fit="crop", **knobs) -> dict:
    """The page's values a table is made from, as the handlers take them: one query (an.Query)."""
    return {"query": an.Query(checkpoint=str(checkpoint), image_file=image_file and str(image_file), fit=fit,
                              layer=layer, row_px=row_px, col_px=col_px, **{**KNOBS, **knobs})}


def view(checkpoint, tab=None, compare_models=None, compare_depth=0.5, **query) -> an.ViewState:
    """The view shown (what a link opens from, or is copied from): ``query``'s fields and the model."""
    return an.ViewState(an.Query(checkpoint=checkpoint, **query), tab=tab, compare_models=compare_models,
                        compare_depth=compare_depth)


def click(x_px: float, y_px: float) -> gr.SelectData:
    """What Gradio passes to a ``.select`` handler for a click at display pixel (x, y)."""
    return gr.SelectData(None, {"index": [x_px, y_px], "value": None})


def cells(payload: dict, rule: str, row: int) -> list[list[int] | None]:
    """The packed neighbour cells of one table row under ``rule`` (None for CLS), as the page decodes them."""
    entry = next(e for e in payload["rules"] if e["name"] == rule)
    packed = np.frombuffer(base64.b64decode(entry["cells"]), "<i2").reshape(-1, entry["k"], 2)[row]
    return [None if r == an.rendering.page.PREFIX_CELL else [int(r), int(c)] for r, c in packed]


def test_the_explorer_gets_every_query_s_neighbours_and_the_prediction(explorer, checkpoint_dir, example_image):
    checkpoint = "cnn-l0.5"
    payload = explorer.on_first_render(**page(checkpoint, example_image, row_px=10, col_px=20))
    assert payload["query_px"] == [10, 20] and not payload["keep_query"] and payload["queries"] is None
    assert cells(payload, "window", 5 * 16 + 10) == [[r, c] for r in (4, 5, 6) for c in (9, 10, 11)]
    loaded = an.load_model(checkpoint_dir / "cnn-l0.5.json")
    with torch.no_grad():
        probabilities = torch.softmax(loaded.model(an.model_input(an.load_image(example_image), loaded.card)), 1)[0]
    values, indices = probabilities.topk(5)
    assert [name for name, _ in payload["prediction"]] == [loaded.card.classes[i] for i in indices.tolist()]
    np.testing.assert_allclose([p for _, p in payload["prediction"]], values.numpy(), rtol=1e-5)
    assert explorer.on_table(**page(checkpoint, example_image))["keep_query"]  # a knob's table keeps the page's
    files = explorer.on_export(**page(checkpoint, example_image, row_px=10, col_px=20))
    data = files["neighbors_data"]
    assert data["query"]["row"] == 5 and data["query"]["col"] == 10
    assert data["rules"]["window"]["neighbors"][4]["rect_px"] == [10, 20, 12, 22]
    written = json.loads(Path(files["exports"][1]).read_text())
    assert written["query"] == data["query"]
    assert written["options"]["seed"] > 2**53 and data["options"]["seed"] == str(written["options"]["seed"])
    assert Image.open(files["exports"][0]).width > 1000


def test_a_k_above_the_table_s_bound_is_answered_one_clicked_query_at_a_time(explorer, checkpoint_dir,
                                                                               example_image):
    """K = 1024 on a 32×32 map: random needs r = N, which is the all rule (METHOD §3), instead of an error."""
    values = page("cnn-l0.5", example_image, "stages.0.0.conv1", num_neighbors=1024)
    payload = explorer.on_table(**values)
    assert payload["queries"] == [16 * 32 + 16] and payload["options"]["num_candidates"] == 1024
    assert any("the random rule draws every token, so it equals the all-tokens rule" in n for n in payload["notes"])
    row = explorer.on_table_row(**values, evt=gr.SelectData(None, {"index": [3, 30], "value": None}))
    assert row["queries"] == [3 * 32 + 30] and len(cells(row, "all", 0)) == 1024


def test_bad_images_give_clear_messages(explorer, tmp_path):
    checkpoint = "cnn-l0.5"
    (tmp_path / "notes.png").write_text("this is text, not a picture")
    (tmp_path / "empty.png").write_bytes(b"")
    png_claiming_size(tmp_path / "huge.png", 20_000, 10_000)  # over Pillow's decompression-bomb limit
    for name, message in [("notes.png", "not an image that can be read"), ("empty.png", "empty"),
                          ("huge.png", "huge.png has too many pixels to open safely")]:
        with pytest.raises(gr.Error, match=message):
            explorer.on_first_render(**page(checkpoint, tmp_path / name))
        with pytest.raises(gr.Error, match=message):  # the upload button refuses it before it replaces the image
            explorer.on_image_upload(str(tmp_path / name))
    with pytest.raises(gr.Error, match="Pick an example or upload an image first"):
        explorer.on_first_render(**page(checkpoint, None))


def test_what_was_done_to_an_image_is_said_on_the_page(explorer, checkpoint_dir, tmp_path):
    """The image's note (transparency made white, the crop of a wide photo) reaches the explorer with the table."""
    Image.new("RGBA", (80, 40), (255, 0, 0, 0)).save(tmp_path / "clear.png")
    payload = explorer.on_first_render(**page("cnn-l0.5", tmp_path / "clear.png"))
    assert payload["image_note"] == ("transparent pixels were composited onto white (the model sees white there); "
                                     "the model sees the centre 40×40 px of the 80×40 px image (crop)")


def test_bad_checkpoints_and_options_give_clear_messages(explorer, checkpoint_dir, example_image, tmp_path):
    card = tmp_path / "mine.json"
    shutil.copyfile(checkpoint_dir / "cnn-l0.json", card)
    (tmp_path / "mine.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(gr.Error, match="sha256"):
        explorer.on_checkpoint_upload([str(card), str(tmp_path / "mine.safetensors")], [])
    with pytest.raises(gr.Error, match="upload exactly two files"):
        explorer.on_checkpoint_upload([str(card)], [])
    for typed in ("/etc/some.json", str(checkpoint_dir / "cnn-l0.json"), "checkpoints/cnn-l0.json", "./cnn-l0",
                  "cnn-l0.json", "cnn-l0.safetensors", "../checkpoints/cnn-l0", "CNN-L0"):
        with pytest.raises(gr.Error, match="unknown checkpoint") as refused:  # a name from the list, never a path
            explorer.on_model(typed)
        assert str(checkpoint_dir) not in refused.value.message
        if "/" in typed:  # a path is not echoed: shortened to its last part, it could read as a model's name
            assert refused.value.message == ("unknown checkpoint: a model is named as the list names it (e.g. "
                                             "'cnn-l0'), never by a path")
    assert explorer.on_model("cnn-l0")["card"].startswith("cnn-l0: ResNet")
    with pytest.raises(gr.Error, match="Choose a model first"):
        explorer.on_model(None)
    with pytest.raises(gr.Error, match=r"K \(neighbours per query\) must be from 1 to 256 for the 16×16 grid"):
        explorer.on_table(**page("cnn-l0.5", example_image, num_neighbors=999))
    with pytest.raises(gr.Error, match=r"the fit must be one of \('crop', 'letterbox', 'stretch'\), got 'zoom'"):
        explorer.on_table(**page("cnn-l0.5", example_image, fit="zoom"))


def test_a_negative_k_typed_is_refused_with_the_range_the_layer_allows(explorer, example_image):
    """K = −1 typed in its box was refused as "K (0 = layer's) must be in [0, ∞], got -1": no K is infinite, and 0
    is the layer's own. K runs from 1 to the layer's H·W, which the box cannot know: it takes any whole number, and
    the table's check names the layer's range."""
    demo = app.build_demo(explorer)
    blocks = blocks_by_id(demo)
    values = {block._id: getattr(block, "value", None) for block in demo.blocks.values()}
    values |= {blocks["checkpoint"]._id: "cnn-l0.5", blocks["layer"]._id: CELL_LAYER,
               blocks["image_file"]._id: str(example_image),
               blocks["num_neighbors"]._id: blocks["num_neighbors"].preprocess(-1)}  # the box's value, as sent
    with pytest.raises(gr.Error) as refused:
        run_event(demo, values, blocks["num_neighbors"], "blur")
    assert refused.value.message == ("K (neighbours per query) must be from 1 to 256 for the 16×16 grid of "
                                     "stages.1.0.conv1, got -1")


@pytest.mark.parametrize(("knob", "out_of_range"), [("num_neighbors", 999), ("window_size", 4),
                                                    ("num_candidates", 2), ("seed", 2**64)])
def test_each_knob_s_refusals_name_it_as_its_label_does(explorer, example_image, knob, out_of_range):
    """K's box was labelled "K (0 = layer's)" and its refusals named it "K (neighbours per query)" (R: "window R (0 =
    auto)" and "the window side R"; r: "random r (0 = layer's / 32)" and "r (random candidates)"). Each knob's label
    is its name, its "0 = …" hint shown under it, and its box's refusals and the layer's name it as its label does."""
    control = server.control(an.Query, knob)
    assert control.info.startswith("0 = ")
    with pytest.raises(gr.Error) as by_the_box:
        control.preprocess(2.5)
    with pytest.raises(gr.Error) as by_the_layer:
        explorer.on_table(**page("cnn-l0.5", example_image, **{knob: out_of_range}))
    assert by_the_box.value.message.startswith(f"{control.label} must be a whole number")
    assert by_the_layer.value.message.startswith(f"{control.label} must be ")


@pytest.mark.parametrize(("call", "message"), [
    (lambda ex, ck, im: ex.on_table(**page(ck, im, row_px=float("inf"))), "query row must be a whole number, got inf"),
    (lambda ex, ck, im: ex.on_table(**page(ck, im, num_neighbors=float("inf"))),
     r"K \(neighbours per query\) must be a whole number, got inf"),
    (lambda ex, ck, im: ex.on_table(**page(ck, im, num_neighbors=2.7)),
     r"K \(neighbours per query\) must be a whole number, got 2.7"),
    (lambda ex, ck, im: ex.on_table(**page(ck, im, seed=2**63)),
     r"seed must be from 0 to 9223372036854775807, got 9223372036854775808"),
    (lambda ex, ck, im: ex.on_table(**page(ck, im, head=1e20)),
     r"attention head must be from 0 to 0 for stages.1.0.conv1 \(1 head\), got 1\.00e\+20"),  # 21 digits: abbreviated
    (lambda ex, ck, im: ex.on_table(**page(ck, im, window_size=101)),
     r"R must be odd with R² ≥ K = 9 and at most 17 \(as wide as the 16×16 grid of stages.1.0.conv1\), got R = 101"),
    (lambda ex, ck, im: ex.on_table(**page(ck, im, window_size=19)), "at most 17"),
    (lambda ex, ck, im: ex.on_hops(**page(ck, im), hops=float("inf")),
     "num_hops must be a whole number, got inf"),
    (lambda ex, ck, im: ex.on_pixels(str(im), 3, 3, 1e9, 1.0), r"K must be from 1 to 4096, got 1000000000"),
    (lambda ex, ck, im: ex.on_pixels(str(im), 3, 3, 5, float("nan")),
     r"position_weight must be a finite number, got nan"),
])
def test_impossible_numbers_are_messages_before_any_work(explorer, checkpoint_dir, example_image, call, message):
    """inf, fractions, a seed past 2⁶⁴ − 1 or a window wider than the map: each a message naming the field (they
    were an OverflowError, an RNG overflow, or allocations growing with R²: 1.5 GB at R = 301, 24 GB at 2001)."""
    with pytest.raises(gr.Error, match=message):
        call(explorer, "cnn-l0.5", example_image)


def test_the_input_level_view_of_a_one_pixel_photo_shows_its_pixel(explorer, tmp_path):
    """A 1×1 photo's input-level view, at the view's default K = 64, was the message "K must be from 1 to 1, got 64",
    naming no view (found by an adversary): it shows the one pixel, the title saying K = 1 of 1."""
    photo = tmp_path / "dot.png"
    Image.new("RGB", (1, 1), (200, 40, 40)).save(photo)
    figure = explorer.on_pixels(str(photo), 0, 0, 64, 0.0)
    assert "K=1 of 1 pixels" in figure.layout.title.text.replace("<br>", " ")


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: you tried to "
                 "allocate 1536000000000 bytes. Error code 12 (Cannot allocate memory)"),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), MemoryError()], ids=repr)
def test_running_out_of_memory_is_a_message(explorer, checkpoint_dir, example_image, monkeypatch, error):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(an, "neighbor_table", fail)
    with pytest.raises(gr.Error) as refused:
        explorer.on_table(**page("cnn-l0.5", example_image))
    assert refused.value.message == ("Not enough memory for this request: choose a smaller K, window R or r, another "
                                     "layer, or a smaller image or model, and try again.")


def test_a_bug_is_not_disguised_as_a_user_error(explorer, checkpoint_dir, example_image, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(an, "neighbor_table", fail)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        explorer.on_table(**page("cnn-l0.5", example_image))


def stored_files(work_dir: Path) -> list[Path]:
    """The files an explorer's work dir holds (uploads and exports, in per-session folders)."""
    return [path for path in work_dir.rglob("*")  # not the run folders' locks beside them (analysis.claim_run_dir)
            if path.is_file() and not (path.parent == work_dir and path.suffix == ".lock")]


def test_an_upload_with_more_tokens_than_the_budget_is_refused(checkpoint_dir, tmp_path, monkeypatch):
    """A 40 KB random-selection checkpoint at input_size 128 has a 128×128 = 16384-token layer: the "all" rule
    would have asked for 7 GB on the first click. It is refused at upload, and leaves nothing behind."""
    monkeypatch.setattr(app_limits, "WORK_DIR", tmp_path / "work")
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
    monkeypatch.setattr(app_limits, "WORK_DIR", tmp_path)
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
    shown = explorer.on_model("good")["card"]
    assert "test accuracy (top-1): n/a" in shown and "nan%" not in shown


def test_a_head_outside_the_layer_is_a_message(explorer, checkpoint_dir, example_image):
    checkpoint, image = "vit-convnn", example_image
    message = r"attention head must be from 0 to 1 for blocks.0.attn \(2 heads\), got 2"
    with pytest.raises(gr.Error, match=message):
        explorer.on_hops(**page(checkpoint, image, "blocks.0.attn", head=2), hops=2)
    with pytest.raises(gr.Error, match=message):
        explorer.on_table(**page(checkpoint, image, "blocks.0.attn", head=2))


def test_a_layer_whose_fields_fit_no_table_sends_the_clicked_query_s_field(explorer, example_image, monkeypatch):
    """An uploaded 504 px ViT (3,969 queries × 254,016 pixels) took over 7 GB for the multi-hop view of every
    query. Past the table's bound the view gets the explorer's query's field, and a new click's when the page asks:
    the pixels two hops reach from it, as the API's /multihop gives them with the bound as shipped."""
    image = an.fit_image(an.load_image(example_image), "crop")
    loaded = explorer.model("cnn-l0.5")
    whole = {px: an.receptive_field(loaded, image, CELL_LAYER, px, 2, 0) for px in ((10, 20), (3, 30))}
    monkeypatch.setattr(an.views.spectrum, "MAX_FIELD_TABLE", 32 * 32)
    assert not an.fits_field_table(loaded.layer_info(CELL_LAYER))  # 256 queries × 1,024 pixels
    shown = explorer.on_hops(**page("cnn-l0.5", example_image, CELL_LAYER, 10, 20), hops=2)
    clicked = explorer.on_hops_row(**page("cnn-l0.5", example_image, CELL_LAYER), hops=2,
                                   evt=gr.SelectData(None, {"index": [3, 30], "value": None}))
    for value, px in ((shown, (10, 20)), (clicked, (3, 30))):
        assert value["queries"] == [(px[0] // 2) * 16 + px[1] // 2]  # the one query cell of the 16×16 layer
        hops = np.frombuffer(base64.b64decode(value["hops"]), "<i1").reshape(1, 32, 32)
        np.testing.assert_array_equal(hops[0], whole[px].hops)
        assert np.frombuffer(base64.b64decode(value["pixel_counts"]), "<i4").tolist() == whole[px].pixel_counts
    for index, message in (("ab", r"a clicked pixel is \[row, col\], got 'ab'"), ([1, 2, 3], r"got \[1, 2, 3\]"),
                           ([40, 3], r"query pixel \(row=40, col=3\) is outside the 32×32 model input"),
                           ([1.5, 3], "query row must be a whole number, got 1.5")):
        with pytest.raises(gr.Error, match=message) as refused:  # one message, not a message quoted in another
            explorer.on_hops_row(**page("cnn-l0.5", example_image, CELL_LAYER), hops=2,
                                 evt=gr.SelectData(None, {"index": index, "value": None}))
        assert not refused.value.message.startswith(("'", '"'))
    monkeypatch.undo()  # the table holds every query again: a click's field is not sent a second time
    assert explorer.on_hops_row(**page("cnn-l0.5", example_image, CELL_LAYER), hops=2,
                                evt=gr.SelectData(None, {"index": [3, 30], "value": None})) == gr.skip()


def test_vit_notes_explain_that_padding_cells_do_not_exist_there(explorer, checkpoint_dir, example_image):
    payload = explorer.on_table(**page("vit-convnn", example_image, "blocks.0.attn", 0, 0))
    assert cells(payload, "window", 0)[0] == [-1, -1]  # the window at the corner reaches a padding cell
    assert any("A ViT has no zero padding" in note for note in payload["notes"])
    assert not any("exactly as in a zero-padded convolution" in note for note in payload["notes"])
    assert len(payload["heads"]) == 2  # the layer's own selection of each head, as small multiples


def test_uploaded_checkpoint_becomes_selectable(explorer, checkpoint_dir):
    done = explorer.on_checkpoint_upload(
        [str(checkpoint_dir / "vit-mhsa.json"), str(checkpoint_dir / "vit-mhsa.safetensors")], [])
    update, uploads = done["checkpoint"], done["uploads"]
    label, choice = uploads[0]
    assert update["value"] == choice and label == "uploaded: vit-mhsa: ViT, MHSA" and uploads[0] in update["choices"]
    shown = explorer.on_model(choice)
    assert "MHSA" in shown["card"] and shown["layer"]["value"] == "blocks.0.attn" and shown["head"]["visible"]


def test_an_int8_upload_says_so_and_a_too_deep_card_is_a_message(checkpoint_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(app_limits, "WORK_DIR", tmp_path / "work")
    explorer = app.Explorer(checkpoint_dir, device="cpu")
    model, card = load_checkpoint(checkpoint_dir / "vit-mhsa.json")
    weights, card_path = save_checkpoint(model, tmp_path / "mine8", card, dtype=torch.int8)
    uploads = explorer.on_checkpoint_upload([str(card_path), str(weights)], [])["uploads"]
    assert "weights stored as: int8 (per-channel scales" in explorer.on_model(uploads[0][1])["card"]
    card_path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(gr.Error) as refused:
        explorer.on_checkpoint_upload([str(card_path), str(weights)], [])
    assert refused.value.message.startswith("mine8.json: not a readable JSON model card (RecursionError")
    assert len(stored_files(tmp_path / "work")) == 2  # the first upload's two files: the refused one left nothing


# -- the refresh policy -------------------------------------------------------------------------------------------
def chain_steps(demo: gr.Blocks, component: gr.components.Component, event: str) -> list:
    """The handlers one event runs when each succeeds, in order: the one it triggers, then each ``.then`` after it
    (not a ``.failure`` or ``.success`` step: the knobs' keep and restore, run in the page)."""
    steps = list(demo.fns.values())
    step = next(f for f in steps if (component._id, event) in f.targets and f.fn is not None)
    chain = [step]
    while (step := next((f for f in steps if f.trigger_after == step._id and not f.trigger_only_on_failure
                         and not f.trigger_only_on_success), None)) is not None:
        chain.append(step)
    return chain


def blocks_by_id(demo: gr.Blocks) -> dict:
    return {getattr(block, "elem_id", None): block for block in demo.blocks.values() if getattr(block, "elem_id",
                                                                                                   None)}


def test_the_page_runs_the_refresh_policy_as_written(explorer):
    demo = app.build_demo(explorer)
    blocks = blocks_by_id(demo) | {"demo": demo}
    for (source, trigger), views in app.REFRESH.items():
        target = blocks[source]
        names = [step.name for step in chain_steps(demo, target, trigger)]  # a step of several views: "a+b"
        assert [part for name in names for part in name.split("+")] == [app.VIEWS[view][0] for view in views], \
            (source, trigger)
        assert names[0] == app.VIEWS[views[0]][0]  # the event's own view, alone; so are the explorer's first render
        assert all(app.VIEWS[view][0] in names for view in app.ALONE & set(views))  # and the slow views' reset
    for control in ("checkpoint", "layer", "head", "num_neighbors", "window_size", "num_candidates", "seed"):
        # the user's choice only (.input): a link or a lesson's step sets them all at once
        assert not any((blocks[control]._id, "change") in step.targets for step in demo.fns.values() if step.fn)


def test_the_refresh_policy_leaves_no_view_stale_and_runs_nothing_slow():
    """What a view shows is redrawn whenever a control it reads changes (by it, or by a view of the same outputs or
    more: a lesson's start writes the text that the note on a user's own image writes); a chain runs only views that
    read its control, or what an earlier step of the chain wrote (or the action's own views: a button, a tab
    opened); no chain runs attribution or the equivalence demo (they run when asked)."""
    writers = {name for _, _, outputs in app.VIEWS.values() for name in outputs}
    for _, inputs, outputs in app.VIEWS.values():
        for control in set(inputs) - {"row_px", "col_px"} - writers:  # the page owns the query (no server call)
            redrawn = [key for key, views in app.REFRESH.items() if key[0] == control
                       and any(set(app.VIEWS[v][2]) >= set(outputs) and control in app.VIEWS[v][1] for v in views)]
            assert redrawn, (outputs, control)
    for (source, trigger), views in app.REFRESH.items():
        written = {source}
        for view in views:
            fn, inputs, outputs = app.VIEWS[view]
            opened = trigger == "click" or source.endswith("_tab")  # a button pressed, a tab opened: an action
            assert not inputs or written & set(inputs) or source == "demo" or opened, (source, view)
            assert fn not in ("on_attribution", "on_equivalence")
            written |= set(outputs)
    for key in (("examples", "select"), ("image_upload", "upload")):
        assert app.REFRESH[key][1] == "first_render"  # what the page shows first, first
    assert app.REFRESH[("checkpoint", "input")][:2] == ["model", "first_render"]
    for key in (("demo", "load"), ("lesson", "input"), ("lesson_next", "click")):  # a link or a lesson's step
        assert app.REFRESH[key][1:] == app.VIEW_CHAIN and set(app.VIEW_CHAIN) >= set(app.MODEL_CHAIN)


def test_an_open_lesson_says_when_the_image_or_model_shown_is_the_user_s_own(explorer):
    """A photo uploaded (or an example, a model picked) during a lesson left its step's text narrating what the
    screen no longer showed; now the text says the step is about the lesson's, and how to go on, once the pick was
    taken (its chain's first step succeeded: a refused upload leaves the lesson's image, and its text). No lesson:
    no change."""
    demo = app.build_demo(explorer)
    blocks = blocks_by_id(demo)
    for (source, trigger), view in app.OWN_PICKS.items():
        first = next(fn for fn in demo.fns.values() if (blocks[source]._id, trigger) in fn.targets)
        after = [fn for fn in demo.fns.values() if fn.trigger_after == first._id and fn.trigger_only_on_success]
        assert [fn.name for fn in after] == [app.VIEWS[view][0]], (source, trigger)
    lessons = {app.VIEWS[chain[0]][0] for chain in app.REFRESH.values() if chain[0].startswith(("link", "lesson"))}
    assert not any(fn.name.startswith("on_own_") for fn in demo.fns.values()
                   if any(step.name in lessons for step in demo.fns.values() if step._id == fn.trigger_after))
    assert explorer.on_own_image(None, 0) == gr.skip()
    assert explorer.on_own_image("Lesson 1", 2) == ("**Step 3** is about the lesson's image; the view now shows "
                                                        "the image you picked. **◀ Back** or **Next step ▶** "
                                                        "returns to the lesson, on its image and model.")
    assert explorer.on_own_model("Lesson 1", None).startswith("**Step 1** is about the lesson's model; the view "
                                                                  "now shows the model you picked.")


def test_only_the_step_that_opens_a_model_reads_the_model_list(explorer):
    """A model picked, then an unknown name typed in the list and Enter before the pick was answered: the pick's
    next steps read the unknown name and changed nothing, and the refusal put the list back to the model the
    explorer showed, not the pick (test_browser.py). The list is read by the step that opens what it names, which
    sets the model opened; every other step reads that, and a refused name goes back to it, in the page."""
    demo = app.build_demo(explorer)
    blocks = blocks_by_id(demo)
    steps = [fn for fn in demo.fns.values() if fn.fn is not None]
    assert {fn.name for fn in steps if blocks["checkpoint"] in fn.inputs} == {"on_model"}
    assert {"on_first_render", "on_weights", "on_table", "on_link", "on_lesson_next", "on_link_copy"} <= {
        view for fn in steps if blocks["opened_model"] in fn.inputs for view in fn.name.split("+")}  # (a+b: merged)
    assert all(blocks["opened_model"] in fn.outputs for fn in steps if fn.name in ("on_model", "on_lesson_start"))
    restore = [(fn.inputs, fn.outputs) for fn in demo.fns.values() if fn.js == app_texts.RESTORE_MODEL_JS]
    assert restore == [([blocks["opened_model"]], [blocks["checkpoint"]])]
    assert explorer.on_model("cnn-l0")["opened_model"] == "cnn-l0"


def test_a_click_in_the_explorer_reaches_no_server_handler_but_a_k_above_the_bound(explorer):
    """The explorer's own events: a clicked query's row for a K above the table's bound, and the α animation's
    frames (its ▶ button); a click on a cell of a table the page holds triggers neither (test_browser.py)."""
    demo = app.build_demo(explorer)
    explorer_block = blocks_by_id(demo)["explorer"]
    events = [(trigger, step) for step in demo.fns.values() for block_id, trigger in step.targets
              if block_id == explorer_block._id]
    assert [(trigger, step.name) for trigger, step in events if step.fn] == [("row", "on_table_row"),
                                                                              ("sweep", "on_sweep")]
    in_page = [(trigger, step.js) for trigger, step in events if not step.fn]  # a new table keeps its knobs' values,
    #                                                                            a new view clears a copied link
    assert in_page == [("change", app_texts.KEEP_KNOBS_JS), ("view", app_texts.CLEAR_LINK_JS)]


def run_event(demo: gr.Blocks, values: dict, component, event: str) -> None:
    """Run an event's chain as the page does: each step reads its inputs from ``values`` (component id → value)
    and writes its outputs back (the ``value`` of a ``gr.update``); no request (the one local session)."""
    for step in chain_steps(demo, component, event):
        args = ([{block: values[block._id] for block in step.inputs}] if step.inputs_as_dict
                else [values[block._id] for block in step.inputs])
        if "request" in inspect.signature(step.fn).parameters:
            args.append(None)
        result = step.fn(*args)
        if inspect.isawaitable(result):  # a coroutine step, in a loop of its own (Playwright's may run in this thread)
            result = run_coroutine(result)
        if isinstance(result, dict) and len(step.outputs) > 1:
            result = [result[block] for block in step.outputs]
        for block, value in zip(step.outputs, result if len(step.outputs) > 1 else (result,), strict=True):
            is_update = isinstance(value, dict) and value.get("__type__") == "update"
            values[block._id] = value.get("value", values[block._id]) if is_update else value


def test_switching_to_a_model_with_the_same_layer_names_shows_the_new_model_everywhere(explorer, checkpoint_dir,
                                                                                        example_image, tmp_path):
    """cnn-l0.5 → cnn-random (same layer names), then another image: every view equals its handler's output for
    the new values, and the slow views are back at their prompts."""
    demo = app.build_demo(explorer)
    blocks = blocks_by_id(demo)
    values = {block._id: getattr(block, "value", None) for block in demo.blocks.values()}
    old, new = "cnn-l0.5", "cnn-random"
    values[blocks["checkpoint"]._id], values[blocks["image_file"]._id] = old, str(example_image)
    run_event(demo, values, blocks["checkpoint"], "input")
    layer, before = values[blocks["layer"]._id], values[blocks["explorer"]._id]
    values[blocks["equivalence_text"]._id] = "a result for the old model"
    values[blocks["checkpoint"]._id] = new
    run_event(demo, values, blocks["checkpoint"], "input")
    assert values[blocks["layer"]._id] == layer == "stages.1.0.conv1"
    expected = explorer.on_first_render(**page(new, example_image, layer))
    assert values[blocks["explorer"]._id] == expected != before and expected["model"] == "cnn-random"
    hops = explorer.on_hops(**page(new, example_image, layer), hops=2)
    assert values[blocks["hop_view"]._id] == hops
    assert values[blocks["equivalence_text"]._id] == app_texts.EQUIVALENCE_PROMPT
    assert values[blocks["attribution_plot"]._id] is None

    image = tmp_path / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(image)
    values[blocks["pixel_row"]._id], values[blocks["pixel_col"]._id] = 30, 5  # row 30 lies outside the 20×24 image
    values[blocks["image_upload"]._id] = str(image)
    run_event(demo, values, blocks["image_upload"], "upload")
    assert (values[blocks["pixel_row"]._id], values[blocks["pixel_col"]._id]) == (19, 5)  # the nearest pixel inside
    assert values[blocks["pixel_plot"]._id].to_json() == explorer.on_pixels(str(image), 19, 5, 64, 0).to_json()
    assert values[blocks["explorer"]._id] == explorer.on_first_render(**page(new, image, layer))


def test_compare_mode_opened_from_another_tab_opens_where_the_explorer_is(explorer, example_image):
    """Opening compare mode opened each column at the depth last set (0.5), so the explorer's own model showed
    another layer than the one being explored: opened from another tab, the depth is now the explorer's layer's, and
    that model's column opens at that very layer, the others as far through theirs. Opened by a link or a lesson's
    step, which set the open tab to compare mode with its own depth before the tab's select fires, that depth stays
    (a depth set from the explorer's layer raced the link's)."""
    demo = app.build_demo(explorer)
    blocks = blocks_by_id(demo)
    values = {block._id: getattr(block, "value", None) for block in demo.blocks.values()}
    tab = next(block for block in chain_steps(demo, blocks["compare_tab"], "select")[0].inputs
               if isinstance(block, gr.State))  # the open tab (a State has no elem_id)
    models = ["cnn-l0", "cnn-l0.5", "vit-mhsa"]
    layers = [layer_info.name for layer_info in explorer.model("cnn-l0.5").layer_infos]
    values |= {blocks["checkpoint"]._id: "cnn-l0.5", blocks["layer"]._id: layers[1], blocks["compare_models"]._id:
               models, blocks["image_file"]._id: str(example_image)}
    assert values[tab._id] == "weights"
    run_event(demo, values, blocks["compare_tab"], "select")
    depth = an.layer_depth(explorer.model("cnn-l0.5"), layers[1])
    assert values[blocks["compare_depth"]._id] == depth == round(1 / (len(layers) - 1), 2)
    assert values[tab._id] == "compare"
    assert [values[blocks[name]._id] for name in app.COMPARE_LAYERS[:3]] == [
        layers[1] if name == "cnn-l0.5" else an.layer_at_depth(explorer.model(name), depth).name for name in models]
    values[blocks["compare_depth"]._id] = 0.25  # a link's depth, the open tab set to compare mode with it
    run_event(demo, values, blocks["compare_tab"], "select")
    assert values[blocks["compare_depth"]._id] == 0.25
    assert [values[blocks[name]._id] for name in app.COMPARE_LAYERS[:3]] == [
        an.layer_at_depth(explorer.model(name), 0.25).name for name in models]


def test_tab_handlers_explain_layers_they_do_not_apply_to(explorer, checkpoint_dir, example_image):
    checkpoint = "vit-mhsa"
    weights = explorer.on_weights(an.Query(checkpoint=checkpoint, layer="blocks.0.attn"))
    assert "no rank-slot kernel" in weights["weights_note"]
    assert [(weights[p].value, weights[p].visible) for p in ("kernel_plot", "slot_plot")] == [(None, False)] * 2
    mix = explorer.on_mix(**page(checkpoint, example_image, "blocks.0.attn"))
    assert mix["mix_plot"] is None and "not a hybrid layer" in mix["mix_note"]


def test_closing_the_model_list_on_the_same_model_keeps_the_layer(explorer):
    """Opening the model list and closing it without a choice sent the same model again, which reset the layer to
    the model's first: the shown layer is kept when the model has it, and a model without it shows its first."""
    assert explorer.on_model("cnn-l0.5", "stages.2.0.conv2")["layer"]["value"] == "stages.2.0.conv2"
    first = explorer.on_model("cnn-l0.5")["layer"]["value"]
    assert explorer.on_model("cnn-l0.5", "blocks.0.attn")["layer"]["value"] == first != "blocks.0.attn"


def test_attribution_methods_are_shown_by_their_names(explorer, example_image):
    """The method list and the chart's title showed the identifier "integrated_gradients"."""
    blocks = blocks_by_id(app.build_demo(explorer))
    assert blocks["method"].choices == [("Saliency", "saliency"), ("Integrated Gradients", "integrated_gradients"),
                                        ("Occlusion", "occlusion")]
    figure = explorer.on_attribution(**page("cnn-l0.5", example_image), method="integrated_gradients", target="cat")
    assert figure["attribution_plot"].layout.title.text.startswith("Integrated Gradients, class 'cat'")


def test_the_occlusion_progress_bar_counts_the_passes_made(explorer, example_image):
    """It showed Captum's totals ("1/238", "65/190513"), followed through tqdm: now the passes made of the 65."""
    shown = []

    def progress(value, desc=None, unit="steps"):
        shown.append((value, unit))

    explorer.on_attribution(**page("cnn-l0", example_image, fit="letterbox"), method="occlusion", target="ship",
                            progress=progress)
    assert shown[0] == ((0, 65), "passes") and shown[-1] == ((65, 65), "passes")
    done = [value[0] for value, _ in shown]
    assert done == sorted(done) and {value[1] for value, _ in shown} == {65}


def test_a_dropped_occlusion_stops_after_the_batch_it_is_in(explorer, example_image, monkeypatch):
    """A cancelled occlusion computed its 65 passes to the end. The run's stop is read after each batch of passes
    (server.check_dropped): dropped while its first batch of occluded images computes, it stops when that batch
    ends, with 1 + 8 of the 65 passes made."""
    monkeypatch.setattr("analysis.views.attribution._BATCH", 8)  # Captum's unoccluded pass, then batches of 8
    stop, done = threading.Event(), []

    def progress(value, desc=None, unit="steps"):
        done.append(value[0])
        if value[0] == 1:  # the unoccluded pass made: the run is dropped while the first batch computes
            stop.set()

    token = guards._STOP.set(stop)  # the run's stop, as SlowRuns sets it in the computation's thread
    try:
        with pytest.raises(server.RunDropped):
            explorer.on_attribution(**page("cnn-l0", example_image), method="occlusion", target="cat",
                                    progress=progress)
    finally:
        guards._STOP.reset(token)
    assert done == [0, 1]  # that batch's end raised before the bar moved on to 9; no further batch ran


# -- the API --------------------------------------------------------------------------------------------------------
KNOB_PARAMETERS = [("num_neighbors", 0), ("window_size", 0), ("num_candidates", 0), ("seed", 0), ("blend_alpha", 0.5),
                   ("head", 0), ("fit", "crop"), ("draw", 0)]
DOCUMENTED_API = {  # each endpoint's parameters: a name (required) or (name, default); every endpoint has one output
    "/layers": ["checkpoint"], "/predict": ["checkpoint", "image", ("fit", "crop"), ("draw", 0)],
    "/neighbors": ["checkpoint", "image", "layer", "row_px", "col_px", *KNOB_PARAMETERS],
    "/table": ["checkpoint", "image", "layer", ("row_px", 16), ("col_px", 16), *KNOB_PARAMETERS],
    "/export": ["checkpoint", "image", "layer", "row_px", "col_px", *KNOB_PARAMETERS],
    "/spectrum": ["checkpoint", "image", ("fit", "crop"), ("draw", 0)],
    "/multihop": ["checkpoint", "image", "layer", "row_px", "col_px", ("num_hops", 2), ("head", 0), ("fit", "crop"),
                  ("draw", 0)],
    "/weights": ["checkpoint", "layer"], "/mix": ["checkpoint", "image", "layer", ("fit", "crop"), ("draw", 0)],
    "/pixels": ["image", "row_px", "col_px", ("num_neighbors", 64), ("position_weight", 0.0)],
    "/compare": ["checkpoints", "image", "row_px", "col_px", ("depth", 0.5), ("layers", None), ("fit", "crop")],
    "/attribution": ["checkpoint", "image", ("method", "saliency"), ("target", ""), ("fit", "crop"), ("draw", 0)],
    "/equivalence": ["checkpoint", "image", "layer", ("fit", "crop"), ("draw", 0)],
}


def test_the_documented_api_keeps_its_parameters_whatever_makes_them(explorer):
    """The api_* methods take the Query (app_api.endpoint makes their parameters from its fields); what a client
    sees stays as documented: the names, order, defaults and types, and one output each (/export's two files are one
    list: a return annotation evaluated by endpoint() made them two outputs, two MCP answers)."""
    info = app.build_demo(explorer).get_api_info()["named_endpoints"]
    assert set(info) == set(DOCUMENTED_API)
    types = {"checkpoint": "str", "checkpoints": "list[str]", "image": "filepath", "layer": "str", "row_px": "int",
             "col_px": "int", "blend_alpha": "float", "depth": "float", "position_weight": "float", "fit": "str",
             "layers": "None | list[str]", "method": "str", "target": "str"}
    for name, parameters in DOCUMENTED_API.items():
        got = [(p["parameter_name"], p["parameter_default"]) if p["parameter_has_default"] else p["parameter_name"]
               for p in info[name]["parameters"]]
        assert got == parameters, name
        assert all(p["python_type"]["type"] == types.get(p["parameter_name"], "int")
                   for p in info[name]["parameters"]), name
        assert len(info[name]["returns"]) == 1, name
    assert info["/neighbors"]["returns"][0]["python_type"]["type"] == "Any"  # as the method's annotation reads
    assert info["/layers"]["description"].startswith("The layers a model's views open")


def test_the_api_answers_with_plain_named_values(app_url, checkpoint_dir, example_image):
    from gradio_client import Client, handle_file

    client = Client(app_url, verbose=False)
    checkpoint, image = "vit-convnn", handle_file(str(example_image))
    info = client.view_api(return_format="dict")["named_endpoints"]
    for name in ("/layers", "/predict", "/neighbors", "/table", "/export", "/spectrum", "/multihop", "/attribution",
                 "/equivalence", "/weights", "/mix", "/pixels"):
        assert name in info
    assert [p["parameter_name"] for p in info["/neighbors"]["parameters"]] == [
        "checkpoint", "image", "layer", "row_px", "col_px", "num_neighbors", "window_size", "num_candidates", "seed",
        "blend_alpha", "head", "fit", "draw"]
    layers = client.predict(checkpoint, api_name="/layers")
    assert [layer["name"] for layer in layers] == ["blocks.0.attn", "blocks.1.attn"]
    assert layers[0]["height"] == 8 and layers[0]["num_heads"] == 2 and layers[0]["label"].startswith("blocks.0.attn")
    label = client.predict(checkpoint, image, api_name="/predict")
    loaded = an.load_model(checkpoint_dir / "vit-convnn.json")
    with torch.no_grad():
        probabilities = torch.softmax(loaded.model(an.model_input(an.load_image(example_image), loaded.card)), 1)[0]
    values, indices = probabilities.topk(5)
    assert list(label) == [loaded.card.classes[i] for i in indices.tolist()]
    np.testing.assert_allclose(list(label.values()), values.numpy(), rtol=1e-5)
    record = client.predict(checkpoint, image, "blocks.0.attn", 10, 20, api_name="/neighbors")
    assert record["query"] == {"row_px": 10, "col_px": 20, "row": 2, "col": 5} and record["checkpoint"] == "vit-convnn"
    table = client.predict(checkpoint, image, "blocks.0.attn", 10, 20, api_name="/table")
    assert cells(table, "layer", 2 * 8 + 5) == [
        None if n["is_cls"] else [n["row"], n["col"]] for n in record["rules"]["layer"]["neighbors"]]
    field = client.predict(checkpoint, image, "blocks.1.attn", 10, 20, 2, 1, api_name="/multihop")
    expected = an.receptive_field(loaded, an.load_image(example_image), "blocks.1.attn", (10, 20), 2, 1)
    assert field["hops"] == expected.hops.tolist() and field["pixel_counts"] == expected.pixel_counts
    weights = client.predict(checkpoint, "blocks.0.attn", api_name="/weights")  # depthwise: one tap per channel
    np.testing.assert_allclose(weights["kernel"], loaded.model.get_submodule("blocks.0.attn").weight[:, 0].detach(),
                               rtol=1e-6)
    hybrid = "cnn-l0.5"
    mix = client.predict(hybrid, image, CELL_LAYER, api_name="/mix")
    assert mix["branch_ratio"] == 0.5 and np.asarray(mix["share"]).shape == (16, 16)
    pixels = client.predict(image, 3, 4, 9, api_name="/pixels")
    assert np.asarray(pixels["near"]).sum() == 9 and pixels["near"][3][4] and pixels["like"][3][4]
    columns = client.predict([checkpoint, hybrid], image, 10, 20, 1.0, api_name="/compare")  # the last layers
    for column, (model, layer) in zip(columns, ((checkpoint, "blocks.1.attn"), (hybrid, "stages.2.0.conv2")),
                                      strict=True):
        alone = client.predict(model, image, layer, 10, 20, api_name="/neighbors")
        assert column["layer"] == layer and column["rules"] == alone["rules"] and column["query"] == alone["query"]


def test_uploads_over_the_size_limit_are_refused(app_url):
    import httpx

    too_big = b"\0" * (app_limits.MAX_UPLOAD_MB * 1024 * 1024 + 1)
    response = httpx.post(f"{app_url}gradio_api/upload", files={"files": ("big.png", too_big)})
    assert response.status_code == 413
    cap = app_limits.MAX_UPLOAD_MB * 1024 * 1024
    assert response.text == f"File size exceeded maximum allowed size of {cap} bytes."


def test_the_upload_cap_is_a_flag(monkeypatch):
    launched = []
    monkeypatch.setattr(app, "launch", lambda demo, port, workspace, max_upload_mb, mcp_schema, host,
                        trusted_proxies: launched.append(max_upload_mb))
    monkeypatch.setattr(app, "build_demo", lambda explorer: launched.append(explorer.max_upload_mb))
    monkeypatch.setattr("sys.argv", ["app.py", "--max-upload-mb", "120", "--port", "7999"])
    app.main()
    assert launched == [120, 120]
    monkeypatch.setattr("sys.argv", ["app.py", "--max-upload-mb", "0"])
    with pytest.raises(SystemExit):
        app.main()


def test_a_port_taken_is_one_line_naming_it_and_how_to_choose_another(monkeypatch):
    """On a port another server holds, the app ended in Gradio's traceback, which named Gradio's own option
    (``server_port``), not the app's: it now says which port, how to choose another, and exits non-zero."""
    with socket.create_server(("127.0.0.1", 0)) as held:  # another server, listening
        port = held.getsockname()[1]
        monkeypatch.setattr("sys.argv", ["app.py", "--port", str(port)])
        with pytest.raises(SystemExit) as exited:
            app.main()
    assert exited.value.code == (f"Port {port} of 127.0.0.1 is taken (another server, or this app already running): "
                                 "choose another with --port N or PORT=N.")  # sys.exit: printed, exit status 1


@pytest.mark.parametrize(("host", "port", "said"), [
    ("127.0.0.1", 70000, "Port 70000 is not a port: choose one from 1 to 65535"),
    ("127.0.0.1", -1, "Port -1 is not a port"),
    ("foo.invalid", 7999, "Cannot listen on foo.invalid port 7999 ("),
    ("192.0.2.1", 7999, "Cannot listen on 192.0.2.1 port 7999 ("),  # TEST-NET-1: no address of this machine
])
def test_a_port_or_host_that_cannot_be_listened_on_is_one_line_saying_why(monkeypatch, host, port, said):
    """A port out of range ended in a traceback (OverflowError) and a host that does not resolve, or an address of
    another machine, was called "taken"; each is now one line saying what is wrong, and the app exits non-zero."""
    monkeypatch.setattr("sys.argv", ["app.py", "--host", host, "--port", str(port)])
    with pytest.raises(SystemExit) as exited:
        app.main()
    assert str(exited.value.code).startswith(said) and "taken" not in str(exited.value.code)


def test_a_rule_registered_in_the_library_is_a_selection_of_the_layer_every_view_and_the_app(
        explorer, checkpoint_dir, example_image, monkeypatch):
    """One registry (convnn.selection): adding a rule there makes ConvNN2d select with it, query_neighbors compute
    it and the page's table carry it, with nothing else changed."""
    import torch.nn.functional as F

    from convnn import ConvNN2d
    from convnn.selection import SELECTION_RULES, SelectionRule, select_all

    def nearest_in_colour(q, k, grid, options):  # the 'all' rule scored on the first 3 feature channels only
        return select_all(q[..., :3], k[..., :3], grid, options)

    monkeypatch.setitem(SELECTION_RULES, "colour", SelectionRule("colour", "nearest in colour only", nearest_in_colour))
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
    payload = explorer.on_table(**page("cnn-l0.5", example_image, row_px=10, col_px=20))
    colour_entry = next(e for e in payload["rules"] if e["name"] == "colour")
    assert colour_entry["title"] == "nearest in colour only"
    assert cells(payload, "colour", 5 * 16 + 10) == result.sets["colour"].cells.tolist()


# -- links and lessons ---------------------------------------------------------------------------------------------
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "checkpoints"


@pytest.fixture(scope="module")
def shipped():
    """An Explorer on the shipped checkpoints, its link checks bound to the page's controls (as build_demo does)."""
    explorer = app.Explorer(SHIPPED_DIR, device="cpu")
    app.build_demo(explorer)
    return explorer


def test_a_link_that_could_not_set_everything_says_so_until_the_message_is_closed(shipped, monkeypatch):
    """The link's warning went after Gradio's 10 s: on a loaded server the page took longer than that to open, so
    neither a person nor the browser test (3 of 6 runs of tests/app/test_browser.py at load 10) saw it."""
    warned = []
    monkeypatch.setattr(gr, "Warning", lambda message, **kwargs: warned.append(kwargs))
    request = gr.Request(session_hash="link")
    request.query_params = {"model": "nope"}
    assert shipped.on_link(view("cnn-l0.5"), request)["link_note"]
    assert warned == [{"duration": None}]


def test_a_link_sets_what_it_names_and_names_what_it_refuses(shipped):
    out = shipped.view({"model": "vit-convnn16", "layer": "blocks.2.attn", "image": "dog_0", "row": "5",
                        "col": "40", "k": "-1", "alpha": "2", "head": "3", "tab": "spectrum", "zzz": "1"},
                       view("cnn-l0.5"))
    assert out["checkpoint"] == "vit-convnn16" and out["layer"]["value"] == "blocks.2.attn"
    assert Path(out["image_file"]).name == "dog_0.png" and out["row_px"] == 5 and out["tab"] == "spectrum"
    assert shipped.examples[out["examples"].selected_index] == out["image_file"]  # its thumbnail, not the last one
    assert out["head"]["value"] == 3 and out["head"]["maximum"] == 3  # 4 heads
    # 40 ≥ 32 px, K < 0, α > 1 are refused: those controls take their defaults, as for a knob the link leaves out
    assert (out["col_px"], out["num_neighbors"], out["blend_alpha"], out["seed"]) == (16, 0, 0.5, 0)
    for named in ("col must be below 32", "K (neighbours per query) must be from 1 to 64 for the 8×8 grid of "
                  "blocks.2.attn, got -1", "blend α", "`zzz`"):
        assert named in out["link_note"], named
    bad = shipped.view({"model": "../../etc/passwd", "layer": "nope", "image": "x", "tab": "secret"}, view("cnn-l0.5"))
    assert "checkpoint" not in bad or bad["checkpoint"] == gr.update()
    assert all(word in bad["link_note"] for word in ("model", "layer", "image", "tab"))
    assert str(SHIPPED_DIR) not in bad["link_note"]
    too_many = shipped.view({"k": "999999999999", "layer": "stages.2.0.conv1"}, view("cnn-l0.5"))  # K > the 8×8 grid
    assert "K (neighbours per query) must be from 1 to 64" in too_many["link_note"] and too_many["num_neighbors"] == 0
    ruled = shipped.view({"rule": "window"}, view("cnn-l0.5"))  # the rule shown large goes to the page's hidden box
    assert ruled["focus_rule"].startswith("window@") and ruled["link_note"] == ""
    assert "rule `nope`" in shipped.view({"rule": "nope"}, view("cnn-l0.5"))["link_note"]
    many = shipped.view({"model": "cnn-l1", "image": "cat_9", "layer": "bogus", "row": "abc", "col": "40",
                         "k": "100000", "tab": "multihop", "rule": "foo", "depth": "7", "compare": "cnn-l0"},
                        view("cnn-l0.5"))["link_note"]  # every value it could not set is named (it stopped at six)
    assert all(name in many for name in ("`bogus`", "row", "col", "`multihop`", "`foo`", "depth", "compare"))
    assert ".;" not in many and "…" not in many and many.endswith(".")
    plain = shipped.view({}, view("cnn-l0.5"))  # a plain address: the model's default view, no note
    assert plain["link_note"] == "" and plain["layer"]["value"] == "stages.1.0.conv1"
    assert plain["compare_models"] == gr.update() and plain["compare_depth"] == gr.update()  # compare stays as is
    assert plain["examples"] == gr.update()  # the image too, and its thumbnail


def test_a_link_sets_compare_modes_models_and_depth(shipped):
    out = shipped.view({"tab": "compare", "compare": "cnn-l0,vit-mhsa", "depth": "0.25"}, view("cnn-l0.5"))
    assert (out["compare_models"], out["compare_depth"], out["tab"], out["link_note"]) == (
        ["cnn-l0", "vit-mhsa"], 0.25, "compare", "")
    once = "Pick 2 to 4 models to compare, each once"
    for params, named in (({"compare": "cnn-l0"}, once), ({"compare": "cnn-l0,cnn-l0"}, once),
                          ({"compare": "cnn-l0,cnn-l1,cnn-l0.5,vit-mhsa,vit-kvt16"}, once),
                          ({"compare": "cnn-l0,nope"}, "shipped models only"),
                          ({"compare": "cnn-l0,../../etc"}, "names separated by commas"),
                          ({"compare": "cnn-l0,,cnn-l1"}, "names separated by commas"),
                          ({"depth": "1.5"}, "the link's depth"), ({"depth": "nan"}, "the link's depth")):
        refused = shipped.view(params, view("cnn-l0.5"))
        assert named in refused["link_note"], params
        assert refused["compare_models"] == gr.update() and refused["compare_depth"] == gr.update(), params


def test_a_link_that_opens_compare_mode_without_a_depth_opens_it_where_the_tab_opens_by_hand(shipped):
    """``?tab=compare`` opened compare mode at depth 0.5, the depth box's first value, where the tab opened by hand
    opens at the explorer's layer's depth (cnn-l0.5's stages.1.0.conv1: 0.43 of its 8 layers): now at that depth,
    the link's layer's when it names one; a link's own depth stays, and a link to another tab leaves it alone."""
    by_hand = {layer: shipped.on_compare_open("cnn-l0.5", layer, "weights")["compare_depth"]
               for layer in ("stages.1.0.conv1", "stages.2.0.conv1")}
    assert by_hand == {"stages.1.0.conv1": 0.43, "stages.2.0.conv1": 0.86}
    out = shipped.view({"tab": "compare"}, view("cnn-l0.5"))
    assert (out["tab"], out["compare_depth"], out["link_note"]) == ("compare", 0.43, "")
    assert shipped.view({"tab": "compare", "layer": "stages.2.0.conv1"}, view("cnn-l0.5"))["compare_depth"] == 0.86
    assert shipped.view({"tab": "compare", "depth": "0.25"}, view("cnn-l0.5"))["compare_depth"] == 0.25
    assert shipped.view({"tab": "spectrum"}, view("cnn-l0.5", "compare"))["compare_depth"] == gr.update()


def test_a_copied_link_reopens_the_same_view(shipped):
    image = next(path for path in shipped.examples if Path(path).stem == "ship_1")
    copied = shipped.on_link_copy(view("cnn-l0.5-random32", "hops", image_file=image, layer="stages.2.0.conv1",
                                       row_px=3, col_px=30, num_neighbors=4, num_candidates=64, seed=7,
                                       blend_alpha=0.25))
    query = copied["link"]
    assert copied["link_note"] == ""
    assert query == ("model=cnn-l0.5-random32&image=ship_1&layer=stages.2.0.conv1&row=3&col=30&k=4&r=64&seed=7"
                     "&alpha=0.25&tab=hops")
    out = shipped.view(dict(pair.split("=") for pair in query.split("&")), view("cnn-l0.5"))
    assert out["link_note"] == ""
    assert (out["checkpoint"], out["layer"]["value"], Path(out["image_file"]).stem) == ("cnn-l0.5-random32",
                                                                                         "stages.2.0.conv1", "ship_1")
    assert [out[name] for name in ("row_px", "col_px", "num_neighbors", "num_candidates", "seed", "blend_alpha")] == [
        3, 30, 4, 64, 7, 0.25]
    upload = Path(shipped.workspace.root) / "upload.png"  # an upload with an example's bytes is that example
    upload.parent.mkdir(parents=True, exist_ok=True)
    upload.write_bytes(Path(image).read_bytes())
    assert shipped.example_name(str(upload)) == "ship_1"
    upload.write_bytes(Path(image).read_bytes() + b"x")
    assert shipped.example_name(str(upload)) is None  # another image: a link leaves it out, and says so
    files = [str(SHIPPED_DIR / f"cnn-l0.5{suffix}") for suffix in (".json", ".safetensors")]
    model = shipped.on_checkpoint_upload(files, [])["checkpoint"]["value"]  # an uploaded model
    copied = shipped.on_link_copy(view(model, "hops", image_file=str(upload), layer="stages.2.0.conv1", row_px=3,
                                       col_px=30, blend_alpha=1e-5))
    assert "uploaded model and the uploaded photo" in copied["link_note"] and "image=" not in copied["link"]
    values, problems = an.parse_link(dict(pair.split("=") for pair in copied["link"].split("&")))
    assert problems == [] and values["alpha"] == 1e-5  # what repr writes reads back
    compared = ["cnn-l0", "cnn-l0.5", "cnn-l1"]  # compare mode open: its models and depth travel too
    copied = shipped.on_link_copy(view("cnn-l0.5", "compare", compared, 0.75, image_file=image,
                                       layer="stages.2.0.conv1", row_px=3, col_px=30))
    assert copied["link"].endswith("&tab=compare&compare=cnn-l0,cnn-l0.5,cnn-l1&depth=0.75")
    out = shipped.view(dict(parse_qsl(copied["link"])), view("vit-mhsa"))
    assert (out["compare_models"], out["compare_depth"], out["link_note"]) == (compared, 0.75, "")
    hidden = shipped.on_link_copy(view("cnn-l0.5", "hops", compared, 0.75, image_file=image,
                                       layer="stages.2.0.conv1", row_px=3, col_px=30))
    assert "compare=" not in hidden["link"] and "depth=" not in hidden["link"]  # only the open tab's view
    uploaded = shipped.on_link_copy(view("cnn-l0.5", "compare", ["cnn-l0", "upload:abc"], 0.75, image_file=image,
                                         layer="stages.2.0.conv1", row_px=3, col_px=30))
    assert "uploaded models compared" in uploaded["link_note"] and "compare=" not in uploaded["link"]


def test_no_link_is_written_for_a_pixel_outside_the_model_input(explorer):
    """A row typed past the image (99 on a 32 px input) was written into the copied link, which opened with a note
    that it could not set it; an empty row box was left out of it, so the link opened at row 16. Both are refused
    with a message, and no link is written (the page moves a typed row onto the image first: test_browser.py)."""
    for row, message in ((99, "query pixel (row=99, col=3) is outside the 32×32 model input"),
                         (None, "query row is empty: type a whole number")):
        with pytest.raises(gr.Error) as refused:
            explorer.on_link_copy(view("cnn-l0.5", "hops", layer=CELL_LAYER, row_px=row, col_px=3))
        assert refused.value.message == message
    assert explorer.on_link_copy(view("cnn-l0.5", "hops", layer=CELL_LAYER, row_px=31, col_px=3))["link"] == (
        f"model=cnn-l0.5&layer={CELL_LAYER}&row=31&col=3&tab=hops")
    copy = next(step for step in app.build_demo(explorer).fns.values() if step.js == app_texts.COPY_LINK_JS)
    assert copy.trigger_only_on_success  # a refusal puts no address on the clipboard, nor in the box


def test_an_empty_row_or_col_box_is_named_empty(explorer, example_image):
    """The input-level view's row or col box left empty was refused with "query row must be a whole number, got
    None": the message says the box is empty and what it needs."""
    for row, col, message in ((None, 3, "query row is empty: type a whole number"),
                              (3, None, "query col is empty: type a whole number")):
        for refused_by in (explorer.on_pixel_query, lambda *args: explorer.on_pixels(*args, 64, 0.0)):
            with pytest.raises(gr.Error) as refused:
                refused_by(str(example_image), row, col)
            assert refused.value.message == message


def test_every_lesson_step_opens_on_the_shipped_models(shipped):
    """Each step's link names a shipped model, one of its layers, an example, a pixel and a tab that exist; the
    step's text is numbered; stepping past either end stays on the first or the last step."""
    assert len(shipped.lessons) >= 4
    for lesson in shipped.lessons:
        steps = lesson["steps"]
        for index, step in enumerate(steps):
            out = shipped.lesson_step(lesson["title"], index, view("cnn-l0.5"))
            link = dict(pair.split("=") for pair in step["link"].split("&"))
            assert out["link_note"] == "", (lesson["title"], index, out["link_note"])
            assert out["checkpoint"] == link["model"] and out["layer"]["value"] == link["layer"]
            assert Path(out["image_file"]).stem == link["image"]
            assert (out["row_px"], out["col_px"]) == (int(link["row"]), int(link["col"]))
            assert out["lesson_text"].startswith(f"**Step {index + 1} of {len(steps)}.**")
            assert out["lesson_step"] == index
            assert out["lesson_text"].endswith("explore from here.*") == (index == len(steps) - 1)  # the end, said
        for asked, shown in ((len(steps), len(steps) - 1), (-1, 0)):  # Next on the last step, Back on the first:
            out = shipped.lesson_step(lesson["title"], asked, view("cnn-l0.5"))  # the step stays, and the view too
            assert out["lesson_step"] == shown and out["lesson_text"].startswith(f"**Step {shown + 1} of")
            assert out["layer"] == gr.skip() and out["row_px"] == gr.skip()  # (Next applied the last step again,
            #                                                                   undoing what the user did since)
    unpicked = shipped.lesson_step("Lesson 99", 0, view("cnn-l0.5"))  # Next before a lesson: a note, no error
    assert unpicked["lesson_text"].startswith("Pick a lesson first") and unpicked["layer"] == gr.skip()
    words = " ".join(step["text"] for lesson in shipped.lessons for step in lesson["steps"])
    for term in ("mean distance", "Jaccard overlap", "What the layer used", "in R×R"):  # the terms the page uses
        assert term.lower() in words.lower(), term


# -- compare mode -------------------------------------------------------------------------------------------------
def test_compare_mode_opens_each_model_at_the_same_depth_and_refuses_what_it_cannot_show(explorer, example_image):
    models = ["cnn-l0", "cnn-l0.5", "vit-mhsa"]
    updates = explorer.on_compare_layers(models, 1.0)  # the last layer of each
    assert [updates[name]["value"] for name in app.COMPARE_LAYERS[:3]] == [
        explorer.model(name).layer_infos[-1].name for name in models]
    assert updates[app.COMPARE_LAYERS[3]]["visible"] is False and updates[app.COMPARE_LAYERS[0]]["label"].startswith(
        "cnn-l0: layer")
    layers = [updates[name].get("value") for name in app.COMPARE_LAYERS]
    value = explorer.on_compare(models, *layers, **page("cnn-l0.5", example_image, row_px=31, col_px=0))
    assert [column["model"] for column in value["columns"]] == models
    assert [column["layer"] for column in value["columns"]] == layers[:3]
    assert all(column["query_px"] == [31, 0] for column in value["columns"])
    assert value["query_size"] == 32  # the explorer's model's input, in which the page holds the query
    shown = page("cnn-l0.5", example_image, row_px=31, col_px=0)
    assert explorer.on_compare_if_open(models, *layers, **shown, tab="weights") == gr.skip()
    opened = explorer.on_compare_layers_if_open(models, 1.0, "compare")  # a link or a step opening compare mode
    assert [opened[name]["value"] for name in app.COMPARE_LAYERS[:3]] == layers[:3]
    assert explorer.on_compare_layers_if_open(models, 1.0, "hops")[app.COMPARE_LAYERS[0]] == gr.skip()
    for picked in ([], ["cnn-l0"]):  # the user removing models: no columns and a note, not an error
        assert all(update == gr.update(visible=False) for update in explorer.on_compare_layers(picked, 0.5).values())
        value = explorer.on_compare(picked, *layers, **page("cnn-l0.5", example_image, row_px=31, col_px=0))
        assert value == {"columns": [], "note": "Pick 2 to 4 models to compare."}
    for picked, message in ((["cnn-l0"] * 5, "Pick 2 to 4 models"), ("cnn-l0", "Pick 2 to 4 models"),
                            (["cnn-l0", "../../etc/passwd"], "")):
        with pytest.raises(gr.Error, match=message):
            explorer.on_compare_layers(picked, 0.5)
    with pytest.raises(gr.Error, match="depth must be a fraction from 0 to 1"):
        explorer.on_compare_layers(models, 1.5)
    with pytest.raises(gr.Error, match="is not a layer of cnn-l0"):  # a column's layer of another model
        explorer.on_compare(models, "blocks.0.attn", *layers[1:], **page("cnn-l0.5", example_image))


@pytest.mark.parametrize(("knob", "checkpoint", "layer", "out_of_range"), [
    ("head", "vit-convnn", "blocks.0.attn", 2), ("blend_alpha", "cnn-l0.5", CELL_LAYER, 2.0),
    ("draw", "cnn-random", CELL_LAYER, an.MAX_DRAW + 1)])
def test_the_head_alpha_and_draw_refusals_name_them_as_their_labels_do(explorer, example_image, knob, checkpoint,
                                                                        layer, out_of_range):
    """As K's, R's, r's and the seed's (test_each_knob_s_refusals_name_it_as_its_label_does): the head's box was
    labelled "attention head" and the layer's refusal named it "head"; α's slider "blend α (0 = window, 1 =
    features)" and its refusals "blend α"; the draw's box "eval draw (random candidates)", ◀ ▶'s refusals "eval draw"
    and the model's "the eval draw". Each knob's label is its name (α's "0 = …" hint shown under it), and its own
    refusal, the layer's or the model's, and ◀ ▶'s name it as its label does."""
    control = server.control(an.Query, knob)
    assert control.label == an.KNOB_NAMES[knob] and (knob != "blend_alpha" or (control.info or "").startswith("0 = "))
    with pytest.raises(gr.Error) as by_the_box:
        control.preprocess(2.5)
    with pytest.raises(gr.Error) as by_the_layer:
        explorer.on_table(**page(checkpoint, example_image, layer, **{knob: out_of_range}))
    refusals = [by_the_box.value.message, by_the_layer.value.message]
    for step in (explorer.on_draw_back, explorer.on_draw_next) if knob == "draw" else ():
        with pytest.raises(gr.Error) as by_the_step:
            step(2.5)
        refusals.append(by_the_step.value.message)
    assert all(refusal.startswith(f"{control.label} must be ") for refusal in refusals), refusals
