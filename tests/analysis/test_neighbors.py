"""Neighbour sets under each rule, their pixel rectangles, overlaps and distances (analysis/neighbors.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from analysis import (
    RuleOptions,
    cell_rect_px,
    jaccard,
    max_window_size,
    model_input,
    neighbors_summary,
    query_cell,
    query_neighbors,
    resolve_options,
    rule_selection,
    trace_image,
)
from analysis.session.selections import _selection, distance_stats
from analysis.views.neighbors import NeighborSet
from convnn.functional import pad_map, to_tokens
from kernels.reference import aggregate_neighbors
from tests.tolerances import FP32_EXACT


def test_window_neighbors_of_a_16x16_layer_are_the_3x3_cells_around_the_query(load_small, image):
    """32×32 image, 16×16 layer: pixel (10, 20) is cell (5, 10); its window is cells 4..6 × 9..11, 2×2 px each."""
    loaded = load_small("cnn-l0.5")
    layer_info = next(layer_info for layer_info in loaded.layer_infos
                      if (layer_info.height, layer_info.width) == (16, 16))
    result = query_neighbors(loaded, image, layer_info.name, (10, 20), RuleOptions(num_neighbors=9))
    assert result.query_cell == (5, 10)
    window = result.sets["window"]
    expected = [(r, c) for r in (4, 5, 6) for c in (9, 10, 11)]  # raster order = Conv1D tap order
    assert [tuple(cell) for cell in window.cells.tolist()] == expected
    rects = [cell_rect_px(layer_info, r, c) for r, c in expected]
    assert rects[0] == (8, 18, 10, 20)  # (top, left, bottom, right), bottom/right exclusive
    assert rects[4] == (10, 20, 12, 22)  # the query's own cell holds pixel (10, 20)
    assert rects[8] == (12, 22, 14, 24)
    assert window.mean_distance == pytest.approx((4 + 4 * math.sqrt(2)) / 9)
    assert window.window_share == 1.0


def test_window_at_the_border_includes_padding_cells(load_small, image):
    loaded = load_small("cnn-l0.5")
    layer_info = loaded.layer_infos[0]  # 32×32
    cells = query_neighbors(loaded, image, layer_info.name, (0, 0), RuleOptions(num_neighbors=9)).sets["window"].cells
    assert [tuple(c) for c in cells.tolist()][:4] == [(-1, -1), (-1, 0), (-1, 1), (0, -1)]
    assert cell_rect_px(layer_info, -1, -1) == (-1, -1, 0, 0)


def test_layer_selection_equals_the_all_rule_for_an_exhaustive_layer(load_small, image):
    loaded = load_small("cnn-l0.5")
    for layer_info in loaded.layer_infos:
        layer_sel = rule_selection(loaded, image, layer_info.name, "layer", RuleOptions())
        all_sel = rule_selection(loaded, image, layer_info.name, "all", RuleOptions())
        np.testing.assert_array_equal(layer_sel.cells, all_sel.cells)
        grid = np.stack(np.divmod(np.arange(layer_info.height * layer_info.width), layer_info.width), axis=-1)
        np.testing.assert_array_equal(layer_sel.cells[:, 0], grid)  # the query itself is rank 0


def test_recorded_selection_reaggregated_equals_the_layer_output(load_small, image):
    """What the recorder says the layer used, gathered and aggregated again, is the layer's own output in the
    model's forward pass (captured by a hook: called alone, a random layer would key its draws on its own input)."""
    loaded = load_small("cnn-random")
    trace = trace_image(loaded, image)
    outputs = {}
    knns = {layer_info.name: loaded.model.get_submodule(layer_info.name).knn for layer_info in loaded.layer_infos}
    handles = [knn.register_forward_hook(lambda _, __, out, name=name: outputs.setdefault(name, out))
               for name, knn in knns.items()]
    try:
        with torch.no_grad():
            loaded.model(model_input(image, loaded.card))
    finally:
        for handle in handles:
            handle.remove()
    for name, knn in knns.items():
        x, record = trace.inputs[name], trace.records[name]
        values = to_tokens(pad_map(x, record.padding))
        out = aggregate_neighbors(values, record.topk_idx, None, knn.weight, knn.bias, knn.groups)
        torch.testing.assert_close(out.view_as(outputs[name]), outputs[name], **FP32_EXACT)


def test_random_rule_reproduces_the_layer_with_its_seed_and_candidates(load_small, image):
    """With the layer's own seed (the default) the random rule draws what the layer drew for this image."""
    loaded = load_small("cnn-random")  # r = 12
    layer_info = loaded.layer_infos[3]
    random_sel = rule_selection(loaded, image, layer_info.name, "random", RuleOptions())
    layer_sel = rule_selection(loaded, image, layer_info.name, "layer", RuleOptions())
    np.testing.assert_array_equal(random_sel.cells, layer_sel.cells)
    candidates = {tuple(c) for c in random_sel.candidates.tolist()}
    assert len(candidates) == 12
    for query, cells in enumerate(random_sel.cells.tolist()):
        query_rc = divmod(query, layer_info.width)
        assert tuple(cells[0]) == query_rc
        assert {tuple(c) for c in cells[1:]} <= candidates | {query_rc}
    other = rule_selection(loaded, image, layer_info.name, "random", RuleOptions(seed=1))
    assert {tuple(c) for c in other.candidates.tolist()} != candidates


def test_the_blend_rules_ends_are_the_window_and_all_rules_order_included(load_small, image):
    loaded = load_small("cnn-l0.5")
    layer_info = loaded.layer_infos[3]
    for alpha, end in ((0.0, "window"), (1.0, "all")):
        blend = rule_selection(loaded, image, layer_info.name, "blend", RuleOptions(num_neighbors=9, blend_alpha=alpha))
        same = rule_selection(loaded, image, layer_info.name, end, RuleOptions(num_neighbors=9))
        np.testing.assert_array_equal(blend.cells, same.cells)
        np.testing.assert_array_equal(blend.scores, same.scores)


def test_conv_only_layer_uses_its_whole_window(load_small, image):
    loaded = load_small("cnn-l0")
    result = query_neighbors(loaded, image, loaded.layer_infos[4].name, (17, 9))
    assert result.overlaps[("window", "layer")] == 1.0


def test_vit_patches_map_to_4x4_pixel_cells_and_cls_is_flagged(load_small, image):
    loaded = load_small("vit-convnn")
    layer_info = loaded.layer_infos[0]
    assert (layer_info.height, layer_info.width, layer_info.num_prefix_tokens) == (8, 8, 1)
    assert query_cell(layer_info, 10, 21) == (2, 5)
    assert cell_rect_px(layer_info, 2, 5) == (8, 20, 12, 24)
    trace = trace_image(loaded, image)
    for head in range(layer_info.num_heads):
        sel = rule_selection(loaded, image, layer_info.name, "layer", RuleOptions(head=head))
        recorded = trace.records[layer_info.name].topk_idx[0, head, 1:].numpy()  # patch queries, CLS row dropped
        tokens = np.where(sel.is_prefix, 0, sel.cells[..., 0] * 8 + sel.cells[..., 1] + 1)
        np.testing.assert_array_equal(tokens, recorded)


def test_a_knob_recomputes_only_the_rules_that_read_it(load_small, fresh_image):
    """α feeds only blend, the seed only random, K every rule but the layer's own recorded selection."""
    loaded, layer = load_small("cnn-random"), "stages.1.0.conv1"

    def computed(options: RuleOptions) -> int:
        before = _selection.cache_info().misses
        query_neighbors(loaded, fresh_image, layer, (10, 20), options)
        return _selection.cache_info().misses - before

    assert computed(RuleOptions()) == 5  # four rules + the layer's own
    assert computed(RuleOptions(blend_alpha=0.8)) == 1
    assert computed(RuleOptions(blend_alpha=0.8, seed=3)) == 1
    assert computed(RuleOptions(num_neighbors=4, blend_alpha=0.8, seed=3)) == 4
    assert computed(RuleOptions(blend_alpha=0.8)) == 0  # back to K = 9, seed 0: every rule is a lookup
    every_token = RuleOptions(num_candidates=256, blend_alpha=0.8)  # r ≥ N = 256: random draws nothing
    assert computed(every_token) == 1
    assert computed(replace(every_token, seed=5)) == 0


def test_cached_selections_equal_a_cold_computation(load_small, fresh_image):
    loaded, layer = load_small("vit-convnn"), "blocks.0.attn"
    for alpha in (0.2, 0.8):  # the second query reuses every rule but blend
        cached = query_neighbors(loaded, fresh_image, layer, (10, 20), RuleOptions(blend_alpha=alpha, head=1))
    _selection.cache_clear()
    cold = query_neighbors(loaded, fresh_image, layer, (10, 20), RuleOptions(blend_alpha=0.8, head=1))
    assert cached.sets.keys() == cold.sets.keys() and cached.overlaps == cold.overlaps
    for rule, nset in cached.sets.items():
        np.testing.assert_array_equal(nset.cells, cold.sets[rule].cells)
        np.testing.assert_array_equal(nset.scores, cold.sets[rule].scores)


def test_q_and_k_are_projected_once_for_every_rule_and_head(load_small, fresh_image):
    loaded = load_small("vit-convnn")
    trace_image(loaded, fresh_image)  # the forward pass projects too
    calls = []
    handle = loaded.model.get_submodule("blocks.0.attn.qkv").register_forward_hook(lambda *_: calls.append(1))
    try:
        for head in (0, 1):
            for alpha in (0.2, 0.8):
                query_neighbors(loaded, fresh_image, "blocks.0.attn", (10, 20), RuleOptions(blend_alpha=alpha,
                                                                                            head=head))
    finally:
        handle.remove()
    assert len(calls) == 1


def test_jaccard_on_constructed_sets():
    assert jaccard({(0, 0), (0, 1)}, {(0, 1), (1, 1)}) == pytest.approx(1 / 3)
    assert jaccard({(0, 0)}, {(0, 0)}) == 1.0
    assert jaccard({(0, 0)}, {(5, 5)}) == 0.0
    a = NeighborSet(np.array([[0, 0], [-1, -1]]), np.array([False, True]), np.zeros(2), 0.0, 1.0)
    b = NeighborSet(np.array([[0, 0], [1, 1]]), np.array([False, False]), np.zeros(2), 0.0, 1.0)
    assert a.keys() == {(0, 0), "CLS"}
    assert jaccard(a.keys(), b.keys()) == pytest.approx(1 / 3)


def test_distance_stats_leave_cls_out_of_the_distance():
    cells = np.array([[[2, 2], [2, 5], [-1, -1]]])
    mean, share = distance_stats(cells, np.array([[False, False, True]]), np.array([[2, 2]]), 3)
    assert mean[0] == pytest.approx(1.5)  # (0 + 3) / 2
    assert share[0] == pytest.approx(1 / 3)


@pytest.mark.parametrize(("options", "message"), [
    (RuleOptions(num_neighbors=300), "K (neighbours per query) must be from 1 to 256"),
    (RuleOptions(num_neighbors=9, window_size=4), "R must be odd"),
    (RuleOptions(num_neighbors=9, window_size=1), "R² ≥ K = 9"),
    (RuleOptions(num_neighbors=16, num_candidates=8),
     "r (random candidates) must be at least K = 16 (r ≥ N = 256 uses every token of stages.1.0.conv1, as the all "
     "rule), got 8"),
    (RuleOptions(blend_alpha=1.5), "blend α must be from 0 to 1"),
    (RuleOptions(head=1), "attention head must be from 0 to 0 for stages.1.0.conv1 (1 head), got 1"),
    (RuleOptions(num_neighbors=2.5), "K (neighbours per query) must be a whole number, got 2.5"),
    (RuleOptions(num_neighbors=math.inf), "K (neighbours per query) must be a whole number, got inf"),
    (RuleOptions(window_size=19), "R must be odd with R² ≥ K = 9 and at most 17 (as wide as the 16×16 grid of "
                                  "stages.1.0.conv1), got R = 19"),
    (RuleOptions(window_size=101), "at most 17"),
    (RuleOptions(seed=2**63), "seed must be from 0 to 9223372036854775807, got 9223372036854775808"),
    (RuleOptions(seed=-1), "seed must be from 0 to 9223372036854775807, got -1"),
    (RuleOptions(blend_alpha=math.nan), "blend α must be from 0 to 1, got nan"),
    (RuleOptions(blend_alpha="0.5"), "blend α must be from 0 to 1, got '0.5'"),
    (RuleOptions(head=0.5), "attention head must be a whole number, got 0.5"),
])
def test_impossible_options_raise_clear_errors(load_small, image, options, message):
    loaded = load_small("cnn-l0.5")
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        query_neighbors(loaded, image, loaded.layer_infos[3].name, (3, 3), options)


def test_whole_floats_are_accepted_as_integers_whether_or_not_the_cache_is_warm(load_small, fresh_image):
    """RuleOptions(num_neighbors=9.0) used to raise TypeError on a cold cache and to succeed on a warm one."""
    loaded, layer = load_small("cnn-random"), "stages.1.0.conv1"
    floats = RuleOptions(num_neighbors=9.0, window_size=3.0, num_candidates=12.0, seed=np.int64(3), head=0.0)
    resolved = resolve_options(loaded.layer_info(layer), floats)
    assert resolved == RuleOptions(9, 3, 12, 3, 0.5, 0)
    assert {type(v) for v in (resolved.num_neighbors, resolved.window_size, resolved.num_candidates, resolved.seed,
                              resolved.head)} == {int}
    cold = query_neighbors(loaded, fresh_image, layer, (10, 20), floats)  # fresh image: every selection computed
    warm = query_neighbors(loaded, fresh_image, layer, (10, 20), RuleOptions(num_candidates=12, seed=3))
    for rule, nset in cold.sets.items():
        np.testing.assert_array_equal(nset.cells, warm.sets[rule].cells)
    with pytest.raises(ValueError, match="r \\(random candidates\\) must be a whole number, got inf"):
        RuleOptions.from_ui(0, 0, math.inf, 0, 0.5, 0)
    assert RuleOptions.from_ui(9.0, 0, 0, 4.0, 0.5, 0.0) == RuleOptions(9, None, None, 4.0, 0.5, 0.0)
    # empty boxes: the layer's own
    assert RuleOptions.from_ui(None, None, None, None, 0.5, 0) == RuleOptions(None, None, None, None, 0.5, 0)


def test_the_widest_window_covers_the_grid(load_small, image):
    loaded = load_small("cnn-l0.5")
    layer_info = loaded.layer_info("stages.1.0.conv1")
    assert max_window_size(layer_info) == 17 and max_window_size(loaded.layer_info("stages.2.0.conv1")) == 9
    result = query_neighbors(loaded, image, layer_info.name, (0, 0), RuleOptions(window_size=17))
    assert result.options.window_size == 17 and result.sets["window"].window_share == 1.0


def test_query_outside_the_image_is_refused(load_small, image):
    loaded = load_small("cnn-l0.5")
    with pytest.raises(ValueError, match="outside the 32×32"):
        query_neighbors(loaded, image, loaded.layer_infos[0].name, (32, 0))


def test_k_equal_to_n_makes_the_random_rule_the_all_rule(load_small, image):
    """METHOD §3: r ≥ N falls back to all. K = N = 1024 on a 32×32 map needs r = N, so random = all."""
    loaded = load_small("cnn-l0.5")
    result = query_neighbors(loaded, image, "stages.0.0.conv1", (16, 16), RuleOptions(num_neighbors=1024))
    assert result.options.num_candidates == 1024 and result.random_uses_all_tokens
    random, every = result.sets["random"], result.sets["all"]
    np.testing.assert_array_equal(random.cells, every.cells)
    assert random.candidates is None and len(random.keys()) == 1024
    assert result.options.window_size == 33 and result.sets["window"].window_share == 1.0
    assert "r = 1024 ≥ N = 1024 tokens: the random rule draws every token" in neighbors_summary(result)
    explicit = query_neighbors(loaded, image, "stages.0.0.conv1", (16, 16), RuleOptions(num_candidates=5000))
    assert explicit.options.num_candidates == 1024  # any r ≥ N means every token


