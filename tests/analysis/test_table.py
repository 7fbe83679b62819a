"""The page's neighbour table (analysis/views/table.py), its packing (rendering/page.py), every query's receptive
field (views/spectrum.py) and the crop/letterbox fit of photos (session/image_display.py)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from analysis import (
    FITS,
    LETTERBOX_RGB,
    MAX_TABLE_NEIGHBORS,
    RuleOptions,
    blend_sweep,
    cell_rect_px,
    contribution_norms,
    fit_image,
    image_from_array,
    jaccard,
    model_view,
    neighbor_contributions,
    neighbor_table,
    page_hops,
    page_sweep,
    page_table,
    query_neighbors,
    receptive_field,
    receptive_fields,
    rule_selection,
    top_classes,
)
from analysis.rendering.page import PREFIX_CELL
from analysis.session.selections import LAYER_RULE


def unpack(text: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.dtype(dtype).newbyteorder("<"))


@pytest.mark.parametrize(("name", "layer", "options"), [
    ("cnn-l0.5", "stages.1.0.conv1", RuleOptions()),
    ("cnn-random", "stages.0.0.conv1", RuleOptions(num_neighbors=5, blend_alpha=0.25)),
    ("vit-convnn", "blocks.1.attn", RuleOptions(head=1)),
    ("vit-mhsa", "blocks.0.attn", RuleOptions(num_neighbors=4, window_size=5)),
])
def test_every_row_of_the_table_is_what_a_query_of_its_cell_gets(load_small, image, name, layer, options):
    """All H·W rows, every rule: cells, prefix flags, scores, distances and the Jaccard overlaps of the sets."""
    loaded = load_small(name)
    table = neighbor_table(loaded, image, layer, options)
    layer_info = table.layer
    for row in range(layer_info.height):
        for col in range(layer_info.width):
            px = cell_rect_px(layer_info, row, col)[:2]
            expected, got = query_neighbors(loaded, image, layer, px, options), table.query(px)
            assert got.query_cell == expected.query_cell == (row, col)
            for rule, nset in expected.sets.items():
                np.testing.assert_array_equal(got.sets[rule].cells, nset.cells)
                np.testing.assert_array_equal(got.sets[rule].is_prefix, nset.is_prefix)
                np.testing.assert_array_equal(got.sets[rule].scores, nset.scores)
                np.testing.assert_equal(got.sets[rule].mean_distance, nset.mean_distance)
                assert got.sets[rule].window_share == nset.window_share
            for (a, b), value in expected.overlaps.items():  # jaccard() of Python sets, per query
                assert got.overlaps[(a, b)] == pytest.approx(jaccard(got.sets[a].keys(), got.sets[b].keys()))
                assert got.overlaps[(a, b)] == pytest.approx(value)


def test_the_jaccard_rows_count_repeated_and_cls_neighbours_once(load_small, image):
    """A ViT's window rule picks padding cells and its layer picks CLS; the overlap is |A ∩ B| / |A ∪ B| of sets."""
    loaded = load_small("vit-convnn")
    table = neighbor_table(loaded, image, "blocks.0.attn")
    layer_sets = table.rules[LAYER_RULE].selection
    assert layer_sets.is_prefix.any()  # CLS is selected somewhere
    for index in np.flatnonzero(layer_sets.is_prefix.any(1))[:5]:
        a = {"CLS" if p else tuple(c) for c, p in zip(layer_sets.cells[index].tolist(), layer_sets.is_prefix[index],
                                                       strict=True)}
        window = table.rules["window"].selection
        b = {"CLS" if p else tuple(c) for c, p in zip(window.cells[index].tolist(), window.is_prefix[index],
                                                       strict=True)}
        assert table.overlaps[("window", LAYER_RULE)][index] == pytest.approx(len(a & b) / len(a | b))


def test_a_k_above_the_bound_gets_a_table_of_the_one_query(load_small, image):
    loaded = load_small("cnn-l0.5")
    options = RuleOptions(num_neighbors=MAX_TABLE_NEIGHBORS + 1)
    with pytest.raises(ValueError, match="K ≤ 64; for K = 65 name the query pixel"):
        neighbor_table(loaded, image, "stages.0.0.conv1", options)
    table = neighbor_table(loaded, image, "stages.0.0.conv1", options, (10, 20))
    assert table.queries.tolist() == [10 * 32 + 20] and table.rules["all"].selection.cells.shape == (1, 65, 2)
    expected = query_neighbors(loaded, image, "stages.0.0.conv1", (10, 20), options)
    np.testing.assert_array_equal(table.query((10, 20)).sets["all"].cells, expected.sets["all"].cells)
    with pytest.raises(ValueError, match=r"holds the queries at cells \[340\] of stages.0.0.conv1, not cell \(0, 0\)"):
        table.query((0, 0))


def test_contribution_norms_of_all_queries_are_the_norms_of_each_query(load_small, image):
    for name, layer, head in (("cnn-l0.5", "stages.1.0.conv2", 0), ("vit-convnn", "blocks.1.attn", 1)):
        loaded = load_small(name)
        norms = contribution_norms(loaded, image, layer, head)
        layer_info = loaded.layer_info(layer)
        assert norms.shape == (layer_info.height * layer_info.width, layer_info.num_neighbors)
        for row, col in ((0, 0), (layer_info.height - 1, 3), (2, layer_info.width - 1)):
            one = neighbor_contributions(loaded, image, layer, cell_rect_px(layer_info, row, col)[:2], head)
            np.testing.assert_allclose(norms[row * layer_info.width + col], np.linalg.norm(one.vectors, axis=1),
                                       rtol=1e-5, atol=1e-6)
            assert one.max_abs_residual < 1e-4  # Σ contributions + bias = the layer's own output


def test_the_page_receives_the_table_packed_and_decodes_it_exactly(load_small, image):
    loaded = load_small("vit-convnn")
    table = neighbor_table(loaded, image, "blocks.0.attn", RuleOptions(num_candidates=20))
    payload = json.loads(json.dumps(page_table(model_view(image, 32), table, (7, 9), loaded.card,
                                               top_classes(loaded, image), image)))
    assert payload["grid"] == [8, 8] and payload["query_px"] == [7, 9] and payload["queries"] is None
    assert payload["row_cell_of_px"][7] == 1 and payload["col_edges_px"][:3] == [-4, 0, 4]  # padding 1: from −1
    assert payload["classes"] == loaded.card.classes and payload["image_sha256"] == image.digest
    assert [name for name, _ in payload["prediction"]] == list(top_classes(loaded, image))
    for entry in payload["rules"]:
        sel = table.rules[entry["name"]].selection
        cells = unpack(entry["cells"], "int16").reshape(sel.cells.shape)
        np.testing.assert_array_equal(cells[..., 0] == PREFIX_CELL, sel.is_prefix)
        np.testing.assert_array_equal(cells[~sel.is_prefix], sel.cells[~sel.is_prefix])
        np.testing.assert_array_equal(unpack(entry["scores"], "float32").reshape(sel.scores.shape), sel.scores)
        np.testing.assert_array_equal(unpack(entry["window_share"], "float32"),
                                      table.rules[entry["name"]].window_share.astype(np.float32))
    random = next(entry for entry in payload["rules"] if entry["name"] == "random")
    assert len(unpack(random["candidates"], "int16")) == 2 * 20
    np.testing.assert_array_equal(unpack(payload["contributions"], "float32").reshape(64, 9),
                                  contribution_norms(loaded, image, "blocks.0.attn"))
    assert len(payload["heads"]) == 2 and len(payload["colors"]) == 9


def test_a_32x32_table_of_k_9_stays_small(load_small, image):
    loaded = load_small("cnn-l0.5")
    table = neighbor_table(loaded, image, "stages.0.0.conv1")
    size = len(json.dumps(page_table(model_view(image, 32), table, (0, 0), loaded.card, {})))
    assert 300_000 < size < 800_000  # five rules × 1024 queries × 9 neighbours, base64


def _receptive_field_by_hand(loaded, image, layer, query_px, num_hops, head):
    """Hop by hop, one query, with Python sets: each hop's pixels are those of the neighbours of every cell of
    the next layer (towards the input) that covers a pixel of the hop before."""
    layer_infos = list(loaded.layer_infos)
    start = next(i for i, layer_info in enumerate(layer_infos) if layer_info.name == layer)
    size = layer_infos[start].input_size

    def pixels(layer_info, cells):
        out = set()
        for row, col in cells:
            if 0 <= row < layer_info.height and 0 <= col < layer_info.width:
                top, left, bottom, right = cell_rect_px(layer_info, row, col)
                out |= {(y, x) for y in range(top, bottom) for x in range(left, right)}
        return out

    layer_info = layer_infos[start]
    frontier = pixels(layer_info, [(query_px[0] * layer_info.height // size, query_px[1] * layer_info.width // size)])
    hops = np.full((size, size), -1)
    for y, x in frontier:
        hops[y, x] = 0
    for hop, index in enumerate(range(start, max(start - num_hops, -1), -1), start=1):
        layer_info = layer_infos[index]
        sel = rule_selection(loaded, image, layer_info.name, LAYER_RULE, RuleOptions(head=head))
        touched = [(r, c) for r in range(layer_info.height) for c in range(layer_info.width)
                   if pixels(layer_info, [(r, c)]) & frontier]
        frontier = pixels(layer_info, [tuple(cell) for r, c in touched for cell, prefix in
                                       zip(sel.cells[r * layer_info.width + c].tolist(),
                                           sel.is_prefix[r * layer_info.width + c], strict=True) if not prefix])
        for y, x in frontier:
            if hops[y, x] < 0:
                hops[y, x] = hop
    return hops


@pytest.mark.parametrize(("name", "layer", "num_hops", "head"), [
    ("cnn-l0.5", "stages.2.0.conv1", 3, 0), ("cnn-random", "stages.1.0.conv1", 2, 0),
    ("vit-convnn", "blocks.1.attn", 2, 1)])
def test_every_query_s_receptive_field_is_the_one_found_hop_by_hop(load_small, image, name, layer, num_hops, head):
    loaded = load_small(name)
    fields = receptive_fields(loaded, image, layer, num_hops, head)
    layer_info = loaded.layer_info(layer)
    for row, col in ((0, 0), (layer_info.height // 2, layer_info.width - 1), (layer_info.height - 1, 1)):
        px = cell_rect_px(layer_info, row, col)[:2]
        expected = _receptive_field_by_hand(loaded, image, layer, px, num_hops, head)
        np.testing.assert_array_equal(fields.hops[row * layer_info.width + col], expected)
        field = receptive_field(loaded, image, layer, px, num_hops, head)
        np.testing.assert_array_equal(field.hops, expected)
        assert field.pixel_counts == [int(((expected >= 0) & (expected <= h)).sum()) for h in range(num_hops + 1)]
    payload = page_hops(model_view(image, 32), fields, layer_info)
    np.testing.assert_array_equal(unpack(payload["hops"], "int8").reshape(fields.hops.shape), fields.hops)
    assert payload["layers"] == fields.layers and len(payload["colors"]) == len(fields.layers) + 1


def test_a_photo_is_cropped_letterboxed_or_stretched_as_chosen():
    pixels = np.random.default_rng(0).integers(0, 256, (40, 100, 3), dtype=np.uint8)
    photo = image_from_array(pixels)
    crop = fit_image(photo, "crop")
    np.testing.assert_array_equal(crop.pixels, pixels[:, 30:70])  # the centred 40×40
    assert crop.note == "the model sees the centre 40×40 px of the 100×40 px image (crop)"
    box = fit_image(photo, "letterbox")
    assert box.pixels.shape == (100, 100, 3)
    np.testing.assert_array_equal(box.pixels[30:70], pixels)
    assert (box.pixels[:30] == LETTERBOX_RGB).all() and (box.pixels[70:] == LETTERBOX_RGB).all()
    stretch = fit_image(photo, "stretch")
    np.testing.assert_array_equal(stretch.pixels, pixels)
    assert "squashed to a square (stretch)" in stretch.note
    square = image_from_array(pixels[:, :40])
    assert all(fit_image(square, fit) is square for fit in FITS)
    with pytest.raises(ValueError, match=r"the fit must be one of \('crop', 'letterbox', 'stretch'\), got 'zoom'"):
        fit_image(photo, "zoom")


def test_the_alpha_sweep_runs_from_the_window_to_all_tokens(load_small, image):
    """α = 0 is the window rule and α = 1 the all rule, cell for cell (K = R² = 9); between, the blend rule."""
    loaded = load_small("cnn-l0.5")
    sweep = blend_sweep(loaded, image, "stages.1.0.conv1", steps=5)
    np.testing.assert_array_equal(sweep.alphas, [0, 0.25, 0.5, 0.75, 1])
    table = neighbor_table(loaded, image, "stages.1.0.conv1")
    np.testing.assert_array_equal(sweep.rules[0].selection.cells, table.rules["window"].selection.cells)
    np.testing.assert_array_equal(sweep.rules[-1].selection.cells, table.rules["all"].selection.cells)
    np.testing.assert_array_equal(sweep.rules[2].selection.cells, table.rules["blend"].selection.cells)  # α = 0.5
    assert (sweep.rules[0].window_share == 1).all()
    payload = page_sweep(sweep, loaded.card, image, draw=None)
    assert (payload["model"], payload["image_sha256"], payload["draw"]) == ("cnn-l0.5", image.digest, None)
    cells = unpack(payload["cells"], "int16").reshape(5, 256, 9, 2)
    np.testing.assert_array_equal(cells[-1], table.rules["all"].selection.cells)
    np.testing.assert_array_equal(unpack(payload["window_share"], "float32").reshape(5, 256)[3],
                                  sweep.rules[3].window_share.astype(np.float32))
    with pytest.raises(ValueError, match="at least 2 steps"):
        blend_sweep(loaded, image, "stages.1.0.conv1", steps=1)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_the_page_says_when_the_blend_rule_picks_the_windows_cells(load_small, image, alpha):
    """The note appears exactly when the blend and window sets are equal for at least half the queries, with that
    share (counted here from the two rules' cells): α = 0 is the window rule itself (every query)."""
    loaded = load_small("cnn-l0.5")
    table = neighbor_table(loaded, image, "stages.1.0.conv1", RuleOptions(blend_alpha=alpha))
    window, blend = (table.rules[rule].selection.cells for rule in ("window", "blend"))
    same = np.mean([{tuple(c) for c in w} == {tuple(c) for c in b} for w, b in zip(window, blend, strict=True)])
    notes = page_table(model_view(image, 32), table, (0, 0), loaded.card, {})["notes"]
    said = [note for note in notes if "the blend rule picks exactly the window's cells" in note]
    if alpha == 0.0:
        assert same == 1.0
    assert len(said) == (same >= 0.5)
    if said:
        assert f"At α = {alpha:g}" in said[0] and f"for {same:.0%} of this layer's queries" in said[0]
