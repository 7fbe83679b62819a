"""The eval draw in the explorer (METHOD §3b): a field of the view that travels in links and the API, stepped by
◀ ▶ with every view of the image following, and a random-candidate model's answer over 16 draws beside its
prediction; each value against :mod:`analysis` computed here."""

from __future__ import annotations

import base64
import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
from gradio.utils import get_upload_folder

import analysis as an
import app
import app_texts
from app_api import endpoint
from tests.app.test_app import CELL_LAYER, SHIPPED_DIR, blocks_by_id, page, run_event

RANDOM = "cnn-random"  # its ConvNN layers draw r = 12 candidates


def rule_cells(payload: dict) -> dict[str, np.ndarray]:
    """Every rule's (N, K, 2) neighbour cells of the page's table, as the page decodes them."""
    return {entry["name"]: np.frombuffer(base64.b64decode(entry["cells"]), "<i2").reshape(-1, entry["k"], 2)
            for entry in payload["rules"]}


@pytest.fixture(scope="module")
def fresh(checkpoint_dir, example_image):
    """The random model and the image, loaded here (not through the explorer)."""
    return an.load_model(checkpoint_dir / f"{RANDOM}.json"), an.load_image(example_image)


def test_the_table_of_a_draw_is_that_draw_s_neighbours_and_prediction(explorer, fresh, example_image):
    """The page's table for draw 3 holds neighbor_table(..., draw=3)'s cells under every rule and top_classes of
    draw 3, says its draw, and differs from draw 0's. Defect it catches: the draw dropped between the view and the
    table or the prediction."""
    loaded, image = fresh
    payloads = {draw: explorer.on_table(**page(RANDOM, example_image, draw=draw)) for draw in (0, 3)}
    for draw, payload in payloads.items():
        expected = an.neighbor_table(loaded, image, CELL_LAYER, draw=draw)
        got = rule_cells(payload)
        assert set(got) == set(expected.rules)
        for name, rule in expected.rules.items():
            assert np.array_equal(got[name], rule.selection.cells), (draw, name)
        prediction = an.top_classes(loaded, image, draw=draw)
        assert [name for name, _ in payload["prediction"]] == list(prediction)
        np.testing.assert_allclose([p for _, p in payload["prediction"]], list(prediction.values()), rtol=1e-5)
        assert payload["draw"] == draw
    assert not np.array_equal(rule_cells(payloads[0])["layer"], rule_cells(payloads[3])["layer"])


def test_the_spread_shown_is_the_model_s_answer_over_16_draws(explorer, fresh, example_image):
    """Beside the prediction: each class's share of top-1 and the top class's probability range over 16 draws, as
    draw_spread computes them here; nothing for a model without random candidates. Defect it catches: a spread of
    another draw count, or shares of another model."""
    loaded, image = fresh
    spread = an.draw_spread(loaded, image)
    shown = explorer.on_table(**page(RANDOM, example_image, draw=5))["spread"]
    assert shown["draws"] == spread.draws == an.SPREAD_DRAWS
    assert [name for name, _ in shown["shares"]] == list(spread.shares)
    np.testing.assert_allclose([share for _, share in shown["shares"]], list(spread.shares.values()))
    assert shown["top_class"] == spread.top_class
    np.testing.assert_allclose(shown["top_probability"], spread.top_probability, rtol=1e-6)
    plain = explorer.on_table(**page("cnn-l0.5", example_image))
    assert plain["spread"] is None and plain["draw"] is None


def test_compare_mode_shows_the_explorer_s_draw(explorer, example_image):
    """Compare mode's columns are of the explorer's eval draw, as every other view of the image is: a
    random-candidate model's column stayed on draw 0 (its cells and prediction) while the explorer showed draw 3
    (found by an adversary); a model without random candidates names no draw. Its cells and prediction against the
    explorer's own table of draw 3."""
    layers = [CELL_LAYER, CELL_LAYER]
    value = explorer.on_compare([RANDOM, "cnn-l0.5"], *layers, None, None, **page(RANDOM, example_image, draw=3))
    random_column, plain_column = value["columns"]
    expected = explorer.on_table(**page(RANDOM, example_image, draw=3))
    assert random_column["draw"] == 3 and plain_column["draw"] is None
    assert random_column["prediction"] == expected["prediction"]
    assert rule_cells(random_column)["layer"].tolist() == rule_cells(expected)["layer"].tolist()
    draw_0 = explorer.on_table(**page(RANDOM, example_image, draw=0))
    assert rule_cells(random_column)["random"].tolist() != rule_cells(draw_0)["random"].tolist()


def test_the_draw_travels_in_a_link(explorer, example_image):
    """A link carries the draw (left out at draw 0); opening it sets the draw box, shown for a random-candidate
    model; a draw other than 0 of a model without random candidates is refused by name."""
    state = an.ViewState(an.Query(checkpoint=RANDOM, image_file=str(example_image), layer=CELL_LAYER, draw=3))
    link = explorer.on_link_copy(state)["link"]
    assert "&draw=3" in link
    assert "draw" not in explorer.on_link_copy(dataclasses.replace(state, query=dataclasses.replace(
        state.query, draw=0)))["link"]
    opened = explorer.view(dict(pair.split("=") for pair in link.split("&")), an.ViewState())
    assert opened["draw"]["value"] == 3 and opened["draw"]["visible"] and opened["link_note"] == ""
    assert opened["draw_next"]["visible"]
    refused = explorer.view({"model": "cnn-l0.5", "draw": "3"}, an.ViewState())
    assert refused["draw"]["value"] == 0 and not refused["draw"]["visible"]
    assert "the link's draw: cnn-l0.5 draws no random candidates" in refused["link_note"]
    too_far = explorer.view({"model": RANDOM, "draw": str(an.MAX_DRAW + 1)}, an.ViewState())
    assert too_far["draw"]["value"] == 0 and "the link's draw:" in too_far["link_note"]


def test_the_draw_is_a_parameter_of_the_api(explorer, fresh, example_image):
    """/table with draw=3 is the page's table of draw 3; /predict of draw 3 is top_classes of draw 3."""
    loaded, image = fresh
    stored = Path(get_upload_folder()) / "draw-test" / "cat_0.png"  # an upload in Gradio's cache
    stored.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(example_image, stored)
    table = endpoint(explorer.api_table)(RANDOM, {"path": str(stored)}, CELL_LAYER, draw=3)
    expected = an.neighbor_table(loaded, image, CELL_LAYER, draw=3)
    assert np.array_equal(rule_cells(table)["layer"], expected.rules["layer"].selection.cells)
    assert table["draw"] == 3
    prediction = endpoint(explorer.api_predict)(RANDOM, {"path": str(stored)}, draw=3)
    assert list(prediction) == list(an.top_classes(loaded, image, draw=3))
    for draw in (an.MAX_DRAW + 1, 2**63):  # past the box's and a link's bound: the same message, not an overflow
        message = rf"eval draw \(random candidates\) must be an integer in \[0, {an.MAX_DRAW}\], got {draw}"
        with pytest.raises(Exception, match=message):
            endpoint(explorer.api_predict)(RANDOM, {"path": str(stored)}, draw=draw)


def test_stepping_the_draw_redraws_every_view_of_the_image(explorer, example_image):
    """▶ steps to the next draw and ◀ back (not below 0); the explorer's table, the λ mix, the spectrum and the
    multi-hop view follow it (each equal to its handler's output for that draw), and the slow views go back to
    their prompts."""
    demo = app.build_demo(explorer)
    blocks = blocks_by_id(demo)
    values = {block._id: getattr(block, "value", None) for block in demo.blocks.values()}
    values[blocks["checkpoint"]._id], values[blocks["image_file"]._id] = RANDOM, str(example_image)
    run_event(demo, values, blocks["checkpoint"], "input")
    values[blocks["layer"]._id] = CELL_LAYER
    values[blocks["equivalence_text"]._id] = "a result of another draw"
    for button, draw in (("draw_next", 1), ("draw_next", 2), ("draw_back", 1), ("draw_back", 0), ("draw_back", 0)):
        run_event(demo, values, blocks[button], "click")
        assert values[blocks["draw"]._id] == draw
        query = page(RANDOM, example_image, draw=draw)
        assert values[blocks["explorer"]._id] == explorer.on_table(**query)
        assert values[blocks["mix_note"]._id] == explorer.on_mix(**query)["mix_note"]
        assert values[blocks["hop_view"]._id] == explorer.on_hops(**query, hops=2)
        assert values[blocks["equivalence_text"]._id] == app_texts.EQUIVALENCE_PROMPT
    assert app.REFRESH[("draw", "blur")] == app.DRAW_CHAIN


def test_the_slow_views_say_which_draw_they_show(explorer, example_image):
    """Attribution and the equivalence demo of a random-candidate model name the draw they ran in; another
    model's say nothing of draws."""
    note = explorer.on_attribution(**page(RANDOM, example_image, draw=4), method="saliency", target="")
    assert app_texts.DRAW_SHOWN.format(draw=4) in note["attribution_note"]
    text = explorer.on_equivalence(**page(RANDOM, example_image, draw=4))["equivalence_text"]
    assert text.endswith(app_texts.DRAW_SHOWN.format(draw=4))
    assert "draw" not in explorer.on_equivalence(**page("cnn-l0.5", example_image))["equivalence_text"]


def test_lesson_3_steps_through_the_draws_of_a_shipped_random_model():
    """Lesson 3's last step opens draw 1 of cnn-l0.5-random32 with its draw box shown, and what the layer used at
    the step's pixel is another set than at draw 0: the step shows what its text says."""
    shipped = app.Explorer(SHIPPED_DIR, device="cpu")
    app.build_demo(shipped)
    lesson = next(lesson for lesson in shipped.lessons if lesson["title"].startswith("3 "))
    index = next(i for i, step in enumerate(lesson["steps"]) if "draw=" in step["link"])
    out = shipped.lesson_step(lesson["title"], index, an.ViewState(an.Query(checkpoint="cnn-l0.5")))
    assert out["link_note"] == "" and out["draw"]["value"] == 1 and out["draw"]["visible"]
    assert "◀ ▶" in out["lesson_text"]
    query = an.Query(checkpoint=out["checkpoint"], image_file=out["image_file"], layer=out["layer"]["value"],
                     row_px=out["row_px"], col_px=out["col_px"])
    loaded, image = shipped.loaded(query)
    row, col = an.query_cell(loaded.layer_info(query.layer), *query.pixel)
    used = [an.neighbor_table(loaded, image, query.layer, draw=draw).rules["layer"].selection.cells[
        row * loaded.layer_info(query.layer).width + col] for draw in (0, 1)]
    assert not np.array_equal(*used)
    table = shipped.on_table(dataclasses.replace(query, draw=1))
    assert table["draw"] == 1 and table["spread"]["draws"] == an.SPREAD_DRAWS
