"""Compare mode's mapping (analysis.views.compare): the layer at a relative depth, a pixel carried between model
inputs of different sizes, and one query answered in every column as each model answers it alone."""

from __future__ import annotations

import pytest

from analysis import compare_neighbors, layer_at_depth, layer_depth, map_pixel, query_neighbors


def test_the_layer_at_a_depth_is_that_fraction_of_the_way_through_the_model(load_small):
    loaded = load_small("cnn-l0.5")
    names = [layer_info.name for layer_info in loaded.layer_infos]
    assert len(names) == 8  # per stage two hybrids, and the downsampling hybrids between stages
    assert layer_at_depth(loaded, 0).name == names[0] and layer_at_depth(loaded, 1).name == names[-1]
    assert layer_at_depth(loaded, 0.5).name == names[4]  # 0.5 · 7 = 3.5 rounds half up
    assert layer_at_depth(loaded, 0.25).name == names[2]  # 1.75
    for bad in (-0.1, 1.01, float("nan"), "0.5", True):
        with pytest.raises(ValueError, match="depth must be a fraction"):
            layer_at_depth(loaded, bad)


def test_a_layer_s_depth_is_a_short_decimal_that_opens_that_layer(load_small):
    loaded = load_small("cnn-l0.5")
    names = [layer_info.name for layer_info in loaded.layer_infos]
    assert [layer_depth(loaded, name) for name in names] == [0.0, 0.14, 0.29, 0.43, 0.57, 0.71, 0.86, 1.0]  # i / 7
    assert [layer_at_depth(loaded, layer_depth(loaded, name)).name for name in names] == names


@pytest.mark.parametrize("px, from_size, to_size, expected", [
    ((5, 31), 32, 32, (5, 31)),  # the same input: the same pixel
    ((5, 31), 32, 16, (2, 15)),  # centres 5.5/32 and 31.5/32 of the image land in pixels 2 and 15 of 16
    ((0, 15), 16, 32, (1, 31)),  # a 16 px pixel covers two of 32: the one holding its centre
    ((223, 0), 224, 32, (31, 0)),
])
def test_a_pixel_moves_to_the_same_place_of_another_input(px, from_size, to_size, expected):
    assert map_pixel(px, from_size, to_size) == expected


def test_one_query_is_answered_in_every_column_as_each_model_answers_it(load_small, image):
    models = [load_small(name) for name in ("cnn-l0", "cnn-l0.5", "vit-convnn")]
    layers = [layer_at_depth(loaded, 0.5).name for loaded in models]
    results = compare_neighbors(models, image, layers, (9, 30), source=2)
    for loaded, layer, result in zip(models, layers, results, strict=True):
        alone = query_neighbors(loaded, image, layer, (9, 30))
        assert result.layer.name == layer and result.query_cell == alone.query_cell
        assert result.sets["layer"].cells.tolist() == alone.sets["layer"].cells.tolist()
    with pytest.raises(ValueError, match="compare 2 to 4 models"):
        compare_neighbors(models[:1], image, layers[:1], (9, 30))
    with pytest.raises(ValueError, match="outside the 32×32"):
        compare_neighbors(models, image, layers, (32, 0))
