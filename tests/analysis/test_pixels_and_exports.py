"""Input-level view, JSON/PNG exports and figures."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import ImageDraw

from analysis import (
    RuleOptions,
    Workspace,
    export_query,
    image_from_array,
    model_view,
    neighbors_summary,
    neighbors_to_dict,
    overlay_png,
    page_json,
    pixel_neighbors,
    pixel_view,
    query_neighbors,
    trace_image,
)
from analysis.rendering.figures import pixel_figure
from analysis.rendering.overlay import ranks_labelled


def test_pixels_like_this_one_stay_in_the_same_colour_region():
    pixels = np.zeros((20, 20, 3), np.uint8)
    pixels[:, :10] = (200, 30, 30)  # red left half
    pixels[:, 10:] = (30, 30, 200)  # blue right half
    pixels[5, 3] = (250, 0, 0)  # the reddest pixel: the query
    result = pixel_neighbors(image_from_array(pixels), (5, 3), num_neighbors=25)
    assert result.like.sum() == 25 and result.like[:, 10:].sum() == 0
    assert result.near.sum() == 25 and result.near[3:8, 1:6].all()
    assert result.window_size == 5
    offsets = np.mgrid[-2:3, -2:3]
    assert result.near_distance == pytest.approx(np.hypot(*offsets).mean())  # the 5×5 window around the query
    titles = [a.text for a in pixel_figure(pixel_view(image_from_array(pixels)), result, (5, 3)).layout.annotations]
    assert titles[1] == f"near (5×5): {result.near_distance:.1f} px away"


def test_input_level_view_refuses_impossible_k_and_takes_every_pixel_of_a_tiny_image():
    image = image_from_array(np.zeros((4, 4, 3), np.uint8))
    for k in (17, 64):  # more than the 16 pixels (the view's default 64 on a tiny photo was an error): all of them
        assert pixel_neighbors(image, (1, 2), num_neighbors=k).like.sum() == 16
    assert pixel_neighbors(image_from_array(np.zeros((1, 1, 3), np.uint8)), (0, 0)).like.sum() == 1
    with pytest.raises(ValueError, match="K must be from 1 to 4096, got 4097"):
        pixel_neighbors(image, (0, 0), num_neighbors=4097)
    with pytest.raises(ValueError, match="K must be from 1 to 4096, got 0"):
        pixel_neighbors(image, (0, 0), num_neighbors=0)
    with pytest.raises(ValueError, match=r"K must be a whole number, got 2\.5"):
        pixel_neighbors(image, (0, 0), num_neighbors=2.5)
    for weight in (-1.0, 1e308):  # 1e308 overflowed the scores
        with pytest.raises(ValueError, match=re.escape(f"position_weight must be from 0 to 100.0, got {weight}")):
            pixel_neighbors(image, (0, 0), num_neighbors=4, position_weight=weight)
    for weight in (float("nan"), [1], {}, None, True, "abc"):  # NaN gave NaN scores; the others a TypeError
        with pytest.raises(ValueError, match=re.escape(f"position_weight must be a finite number, got {weight!r}")):
            pixel_neighbors(image, (0, 0), num_neighbors=4, position_weight=weight)
    assert pixel_neighbors(image, (0, 0), num_neighbors=4.0, position_weight=100).like.sum() == 4


def test_exports_describe_the_overlay(load_small, image):
    loaded = load_small("cnn-random")
    result = query_neighbors(loaded, image, "stages.1.0.conv1", (10, 20))
    data = json.loads(json.dumps(neighbors_to_dict(result)))
    assert data["query"] == {"row_px": 10, "col_px": 20, "row": 5, "col": 10}
    assert set(data["rules"]) == {"window", "all", "random", "blend", "layer"}
    first = data["rules"]["window"]["neighbors"][0]
    # The layer scores its input features by cosine: the query cell (5, 10) against the window's first cell (4, 9).
    features = trace_image(loaded, image).inputs["stages.1.0.conv1"][0].double()  # (C, H, W)
    query, neighbor = features[:, 5, 10], features[:, 4, 9]
    cosine = float(query @ neighbor / (query.norm() * neighbor.norm()))
    assert first == {"rank": 0, "row": 4, "col": 9, "is_cls": False, "rect_px": [8, 18, 10, 20],
                     "similarity": pytest.approx(cosine, abs=1e-5)}
    assert len(data["rules"]["random"]["candidates"]) == 12
    png = overlay_png(model_view(image, 32), result)
    assert png.mode == "RGB" and png.width > 5 * 320 and png.height > 320


@pytest.mark.parametrize(("num_neighbors", "labelled"), [(9, True), (64, False)])
def test_the_png_writes_rank_numbers_for_few_neighbours_on_wide_cells(load_small, image, monkeypatch, num_neighbors,
                                                                      labelled):
    """overlay.ranks_labelled: K ≤ 32 on cells ≥ 2 px; K = 64 on 2-px cells is shown by colour only."""
    result = query_neighbors(load_small("cnn-l0.5"), image, "stages.1.0.conv1", (10, 20),
                             RuleOptions(num_neighbors=num_neighbors))
    assert ranks_labelled(result.layer, num_neighbors) is labelled
    written = []
    draw_text = ImageDraw.ImageDraw.text
    monkeypatch.setattr(ImageDraw.ImageDraw, "text",
                        lambda draw, xy, text, **kwargs: written.append(text) or draw_text(draw, xy, text, **kwargs))
    overlay_png(model_view(image, 32), result, ("window",))
    assert written[1:] == ([str(t) for t in range(num_neighbors)] if labelled else [])  # after the caption


def test_the_exported_png_says_what_it_shows_in_letters_its_font_has(load_small, image, tmp_path, monkeypatch):
    """The PNG's first line names the model, layer, query and knobs; the blend panel its α; Pillow's default font
    has no α, × or −, so the PNG spells them (a newcomer's export read "blend (☒)")."""
    loaded = load_small("cnn-l0.5")
    result = query_neighbors(loaded, image, "stages.1.0.conv1", (10, 20), RuleOptions(blend_alpha=0.25))
    written = []
    draw_text = ImageDraw.ImageDraw.text
    monkeypatch.setattr(ImageDraw.ImageDraw, "text",
                        lambda draw, xy, text, **kwargs: written.append(text) or draw_text(draw, xy, text, **kwargs))
    png, _ = export_query(Workspace(tmp_path / "work", max_bytes=10**7, max_age_s=60), "s", loaded, image, result)
    assert png.suffix == ".png" and png.stat().st_size > 0
    options = result.options
    assert written[-1] == (f"{loaded.card.name} · stages.1.0.conv1 · query pixel (10, 20) · K = 9, R = 3, "
                           f"r = {options.num_candidates}, seed = {options.seed}, alpha = 0.25")  # drawn last
    blend = next(text for text in written if text.startswith("blend"))
    assert blend == f"blend (alpha = 0.25): {result.sets['blend'].mean_distance:.2f} cells"
    assert all(ord(char) < 256 for text in written for char in text)


def test_the_summary_says_that_plain_attention_selects_nothing(load_small, image):
    """MHSA has no K: its "what the layer used" panel shows its K largest attention weights, and the page says so."""
    result = query_neighbors(load_small("vit-mhsa"), image, "blocks.0.attn", (10, 20))
    assert "plain multi-head attention: it attends to every one of its 65 tokens and selects none" in (
        neighbors_summary(result))


def test_the_page_preview_holds_a_64_bit_seed_exactly():
    """JavaScript's numbers round integers beyond 2⁵³: the preview showed seed 3125381696000609300 for the file's
    3125381696000609166; the page gets such integers as their decimal strings, at any depth."""
    record = {"seed": 3125381696000609166, "options": [{"seed": -(2**60)}, 2**53 - 1], "alpha": 0.5, "fixed": True,
              "name": "x", "none": None}
    assert page_json(record) == {"seed": "3125381696000609166", "options": [{"seed": "-1152921504606846976"},
                                 9007199254740991], "alpha": 0.5, "fixed": True, "name": "x", "none": None}
    assert record["seed"] == 3125381696000609166  # the record itself (the downloaded file) keeps its integers
