"""A random-candidate model's answer over its eval draws (METHOD §3b, analysis.views.draws) and the neighbour table
of one draw, against the model run here draw by draw."""

from collections import Counter

import numpy as np
import pytest
import torch

from analysis import attribution_map, conv_equivalence, draw_spread, neighbor_table, top_classes, trace_image
from analysis.session.image_display import model_input
from convnn import record_neighbors
from convnn.candidates import candidate_draw

LAYER = "stages.1.0.conv1"  # a hybrid layer whose ConvNN branch draws r = 12 of 256 cells


def _one_draw(loaded, image, draw: int) -> np.ndarray:
    """The model's probabilities for ``image`` alone in draw ``draw``, computed here."""
    with torch.no_grad(), candidate_draw(draw):
        return torch.softmax(loaded.model(model_input(image, loaded.card))[0], 0).numpy()


def test_the_spread_over_16_draws_is_each_draw_run_alone(load_small, image):
    """Each row is that draw run on its own; the shares count the draws' top-1; the top class's probability range
    is its min and max over them; row 0 is the answer the other views show. Defects it catches: every row drawn
    with draw 0, shares not normalised, the range of another class."""
    loaded = load_small("cnn-random")
    spread = draw_spread(loaded, image)
    expected = np.stack([_one_draw(loaded, image, draw) for draw in range(16)])
    assert np.abs(expected - expected[0]).max() > 1e-5  # the draws differ by more than the tolerance below
    assert spread.draws == 16
    np.testing.assert_allclose(spread.probabilities, expected, rtol=1e-5, atol=1e-6)
    counts = Counter(loaded.card.classes[c] for c in expected.argmax(1))
    assert spread.shares == {name: count / 16 for name, count in counts.items()}
    assert list(spread.shares.values()) == sorted(spread.shares.values(), reverse=True)  # most frequent first
    assert sum(spread.shares.values()) == pytest.approx(1.0)
    top = loaded.card.classes.index(spread.top_class)
    assert counts[spread.top_class] == max(counts.values())
    assert spread.top_probability == pytest.approx((expected[:, top].min(), expected[:, top].max()), abs=1e-6)
    first = top_classes(loaded, image, len(loaded.card.classes))
    assert first[loaded.card.classes[int(expected[0].argmax())]] == pytest.approx(expected[0].max(), abs=1e-6)


def test_a_model_without_random_candidates_has_one_answer(load_small, image):
    spread = draw_spread(load_small("cnn-l0.5"), image)
    assert spread.draws == 1 and list(spread.shares.values()) == [1.0]
    assert spread.top_probability[0] == spread.top_probability[1] == spread.probabilities.max()
    with pytest.raises(ValueError, match="draws must be"):
        draw_spread(load_small("cnn-random"), image, 0)


def test_the_neighbour_table_of_a_draw_is_what_the_layer_selected_in_that_draw(load_small, image):
    """The layer's own selection in the table of draw 3 is what its ConvNN branch recorded when the model ran in
    draw 3 (computed here), and not draw 0's; the trace of draw 3 is that forward pass. Defect it catches: the
    draw dropped anywhere between the table and the forward pass."""
    loaded = load_small("cnn-random")
    branch = f"{LAYER}.knn"
    recorded = {}
    for draw in (0, 3):
        with torch.no_grad(), record_neighbors(loaded.model) as records, candidate_draw(draw):
            logits = loaded.model(model_input(image, loaded.card))[0]
        recorded[draw] = records[branch][0].topk_idx[0, 0]  # (N, K) token indices of the 16×16 map
        torch.testing.assert_close(trace_image(loaded, image, draw).logits, logits)
    assert not torch.equal(recorded[0], recorded[3])
    for draw in (0, 3):
        table = neighbor_table(loaded, image, LAYER, draw=draw)
        cells = table.rules["layer"].selection.cells  # (N, K, 2)
        rows, cols = np.divmod(recorded[draw].numpy(), 16)
        assert np.array_equal(cells, np.stack([rows, cols], -1)), draw
    assert trace_image(load_small("cnn-l0.5"), image, 5) is trace_image(load_small("cnn-l0.5"), image)
    with pytest.raises(ValueError, match="draw"):
        neighbor_table(loaded, image, LAYER, draw=-1)


def test_attribution_and_the_equivalence_demo_show_the_draw_asked_for(load_small, image):
    """Saliency in draw 3 is the gradient of the class predicted in draw 3, every pass run in draw 3 (computed here,
    and not draw 0's); the equivalence demo of a layer after random layers runs on that layer's input of draw 3,
    and the theorem holds there too. Defects it catches: the draw dropped before the attributed passes, or before
    the trace the demo reads its input from."""
    loaded = load_small("cnn-random")
    maps = {}
    for draw in (0, 3):
        x = model_input(image, loaded.card).requires_grad_()
        with candidate_draw(draw):
            logits = loaded.model(x)[0]
            logits[int(logits.argmax())].backward()
        expected = x.grad[0].abs().sum(0).numpy()
        maps[draw] = attribution_map(loaded, image, "saliency", None, draw)
        assert maps[draw].target == loaded.card.classes[int(logits.argmax())]
        np.testing.assert_allclose(maps[draw].values, expected, rtol=1e-4, atol=1e-4 * expected.max())
    assert np.abs(maps[0].values - maps[3].values).max() > 0.1 * maps[0].values.max()  # the tiny model's scale
    demos = {draw: conv_equivalence(loaded, image, LAYER, draw) for draw in (0, 3)}
    assert np.abs(demos[0].reference - demos[3].reference).max() > 0.01 * np.abs(demos[0].reference).max()
    assert all(demo.max_abs_diff <= 1e-4 * max(demo.max_abs_output, 1.0) for demo in demos.values())
