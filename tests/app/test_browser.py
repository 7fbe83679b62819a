"""The explorer in a real browser: a click or a hover is answered in the page, with what the API says, and sends
nothing to the server; a knob fetches a new table; the core loop fits a phone and a desktop screen."""

from __future__ import annotations

import io
import itertools
import json
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import numpy as np
import pytest
from PIL import Image

import analysis as an
import app
import app_server
import app_texts
from analysis.rendering.overlay import MAX_LABELLED_RANKS
from tests.app.browser import DESKTOP, PHONE, HeldJoins, browser_page, expect_chain, settle
from tests.app.test_app import CELL_LAYER, SHIPPED_DIR, cells, page

SCREENSHOTS = Path(__file__).resolve().parents[1] / "screenshots"  # git-ignored: the last run's pictures
pytestmark = pytest.mark.browser


def pixel_position(page_, table: dict, px: tuple[int, int], canvas: str = "#explorer .cx-canvas") -> dict:
    """Where on a panel's canvas (the explorer's focus panel unless ``canvas`` names another) model-input pixel
    ``px`` = (row, col) is centred, in the canvas's CSS pixels (the canvas shows the input with
    ``table["padding"]`` cells of padding around it)."""
    box = page_.locator(canvas).bounding_box()
    rows, cols = table["row_edges_px"], table["col_edges_px"]
    scale = box["width"] / max(cols[-1] - cols[0], rows[-1] - rows[0])
    return {"x": (px[1] + 0.5 - cols[0]) * scale, "y": (px[0] + 0.5 - rows[0]) * scale}


def shown(page_) -> dict:
    root = page_.locator(".cx")
    return {name: root.get_attribute(f"data-{name}") for name in ("query", "cell", "rule", "layer", "neighbors",
                                                                  "model")}


def api_cells(explorer, values: dict, rule: str) -> list:
    """The query's neighbour cells under ``rule`` as the Python API gives them (None for CLS)."""
    query = values["query"]
    loaded, image = explorer.loaded(query)
    nset = an.query_neighbors(loaded, image, query.layer, query.pixel, query.options(), draw=query.draw).sets[rule]
    return [None if prefix else cell for cell, prefix in zip(nset.cells.tolist(), nset.is_prefix, strict=True)]


def test_clicks_and_hovers_are_answered_in_the_page_as_the_api_answers(app_url, explorer, chromium):
    checkpoint = "cnn-l0.5"
    table = explorer.on_table(**page(checkpoint, explorer.examples[0]))
    with browser_page(chromium, app_url) as tab:
        assert shown(tab)["query"] == "16,16" and shown(tab)["layer"] == CELL_LAYER
        requests = []
        tab.on("request", lambda request: requests.append(request.url))
        for px in ((10, 20), (31, 0)):
            tab.locator("#explorer .cx-canvas").click(position=pixel_position(tab, table, px))
            values = page(checkpoint, explorer.examples[0], row_px=px[0], col_px=px[1])
            expected = api_cells(explorer, values, "layer")
            assert shown(tab)["query"] == f"{px[0]},{px[1]}" and json.loads(shown(tab)["neighbors"]) == expected
            assert tab.input_value("#row_px input") == str(px[0]) and tab.input_value("#col_px input") == str(px[1])
        tab.get_by_role("tab", name="window (convolution)").click()  # the rule shown large
        assert shown(tab)["rule"] == "window"
        assert json.loads(shown(tab)["neighbors"]) == api_cells(explorer, values, "window")
        first = api_cells(explorer, values, "window")[0]
        tab.locator("#explorer .cx-canvas").hover(position=pixel_position(tab, table, an.cell_rect_px(
            explorer.model(checkpoint).layer_info(CELL_LAYER), *first)[:2]))
        assert tab.locator(".cx-tip").inner_text().startswith(f"rank 0 · cell ({first[0]}, {first[1]}) · similarity")
        tab.locator("#explorer .cx-canvas").press("ArrowUp")  # the keyboard moves the query by one cell
        assert shown(tab)["cell"] == "14,0"
        assert requests == []  # two clicks, a rule switch, a hover and a key: nothing reached the server

        tab.locator(".cx-play").click()  # the α animation: its frames once from the server, then played here
        tab.wait_for_selector(".cx[data-sweep-done]", timeout=30_000)
        values = page(checkpoint, explorer.examples[0], row_px=28, col_px=0)
        assert shown(tab)["rule"] == "blend" and tab.locator(".cx").get_attribute("data-alpha") == "1"
        assert ("the large panel shows α = 1.00, the statistics table the knob's α = 0.50"  # the two αs named
                in tab.locator(".cx-sweep-text").inner_text())
        assert json.loads(shown(tab)["neighbors"]) == api_cells(explorer, values, "all")  # α = 1, K = R²: all
        tab.locator("#link_button").click()  # a link copied now opens on the frame shown, not on the knob's α = 0.5
        tab.wait_for_function("document.querySelector('#link textarea, #link input').value.includes('?')")
        link = dict(parse_qsl(urlsplit(tab.locator("#link textarea, #link input").first.input_value()).query))
        assert (link["rule"], link["alpha"], link["row"], link["col"]) == ("blend", "1", "28", "0"), link
        assert api_cells(explorer, {"query": replace(values["query"], blend_alpha=1.0)}, "blend") == json.loads(
            shown(tab)["neighbors"])

        tab.locator("#num_neighbors input").fill("4")  # a knob fetches a new table; the query stays
        tab.locator("#num_neighbors input").press("Enter")
        tab.wait_for_function("JSON.parse(document.querySelector('.cx').dataset.neighbors).length === 4")
        assert tab.locator(".cx").get_attribute("data-alpha") == ""  # a new table ends the animation
        assert any("queue/join" in url for url in requests) and shown(tab)["cell"] == "14,0"
        values = page(checkpoint, explorer.examples[0], row_px=28, col_px=0, num_neighbors=4)
        assert json.loads(shown(tab)["neighbors"]) == api_cells(explorer, values, "blend")

        tab.locator("#window_size input").fill("3")  # the R that auto gives K = 4: the same table, no redraw
        tab.locator("#window_size input").press("Enter")
        settle(tab)
        tab.locator("#num_candidates input").fill("2")  # r < K: refused, and the box goes back to the table's r
        tab.locator("#num_candidates input").press("Enter")
        tab.wait_for_selector(".toast-body:has-text('must be at least K = 4')", timeout=30_000)
        tab.wait_for_function("document.querySelector('#num_candidates input').value === '0'", timeout=10_000)
        assert tab.locator("#window_size input").input_value() == "3"  # R stays as typed (it went back to 0)
        tab.wait_for_function("!document.querySelector('#explorer .error')", timeout=10_000)  # the toast says it:
        #                                                                     no "Error" mark left on the valid table
        drawn = tab.locator(".cx").get_attribute("data-drawn")
        tab.locator("#seed input").fill("7")  # so the next knob is not refused for it again
        tab.locator("#seed input").press("Enter")
        tab.wait_for_function(f"document.querySelector('.cx').dataset.drawn !== '{drawn}'", timeout=30_000)
        values = page(checkpoint, explorer.examples[0], row_px=28, col_px=0, num_neighbors=4, seed=7)
        tab.get_by_role("tab", name="random candidates").click()
        assert json.loads(shown(tab)["neighbors"]) == api_cells(explorer, values, "random")


def test_alpha_frames_answered_after_another_image_came_are_not_played(app_url, explorer, chromium):
    """"▶ α"'s frames asked for on one example and answered after another was picked (their request held here until
    then) were kept, their layer, K, R and head matching the new table, and the next "▶ α" played them over the new
    image at once, without a request (found by an adversary): they are dropped, and "▶ α" asks for the new image's
    frames, whose last (α = 1) is the all rule's set the API gives on it."""
    checkpoint, second = "cnn-l0.5", explorer.examples[1]  # the page opens on the first example
    with browser_page(chromium, app_url) as tab:
        joins = HeldJoins(tab)
        tab.locator(".cx-play").click()
        joins.wait("the frames' request")
        joins.stop()
        chain = expect_chain(tab, "select", "examples")
        tab.locator("#examples .thumbnail-item").nth(1).click()
        tab.wait_for_function("step => convnnQueue.joined.has(step) && !convnnQueue.open.size", arg=chain,
                              timeout=60_000)  # the new image's views drawn; the frames' request still held
        joins.release()
        settle(tab)
        joins.close()
        joins = []
        tab.on("request", lambda request: joins.append(request.url) if "queue/join" in request.url else None)
        tab.locator(".cx-play").click()
        tab.wait_for_selector(".cx[data-sweep-done]", timeout=30_000)
        assert joins, "the frames of the image before were played"
        assert tab.locator(".cx").get_attribute("data-alpha") == "1"
        assert json.loads(shown(tab)["neighbors"]) == api_cells(explorer, page(checkpoint, second), "all")


def test_a_click_in_the_padding_frame_selects_the_nearest_cell(app_url, explorer, chromium):
    """A ViT's panel draws a frame of padding cells around the image (where the window rule reaches), and a click
    there did nothing (on vit-convnn16, 56 % of the panel: 13 of 40 random clicks). A click anywhere on the panel
    is answered: one in the frame selects the query cell nearest to it (its pixel moved onto the image's edge), with
    the neighbours the API gives there, and sends nothing to the server."""
    layer, image = "blocks.0.attn", explorer.examples[0]
    with browser_page(chromium, f"{app_url}?model=vit-convnn&image={Path(image).stem}&layer={layer}") as tab:
        tab.wait_for_function("document.querySelector('.cx').dataset.layer === 'blocks.0.attn'", timeout=60_000)
        table = explorer.on_table(**page("vit-convnn", image, layer))
        size, rows, cols = table["input_size"], table["row_edges_px"], table["col_edges_px"]
        assert table["padding"] > 0 and rows[0] < 0 and cols[-1] > size  # the frame this test clicks in
        requests = []
        tab.on("request", lambda request: requests.append(request.url))
        for px in itertools.product((rows[0], 13, rows[-1] - 1), (cols[0], 21, cols[-1] - 1)):
            if px == (13, 21):  # the one position on the image itself
                continue
            tab.locator("#explorer .cx-canvas").click(position=pixel_position(tab, table, px))
            nearest = tuple(int(np.clip(p, 0, size - 1)) for p in px)
            values = page("vit-convnn", image, layer, *nearest)
            assert shown(tab)["query"] == "{},{}".format(*nearest), px
            assert json.loads(shown(tab)["neighbors"]) == api_cells(explorer, values, "layer"), px
        assert requests == []


def test_a_vit_shows_every_head_and_the_multi_hop_view_follows_the_click(app_url, explorer, chromium):
    checkpoint = "vit-convnn"
    with browser_page(chromium, app_url) as tab:
        tab.locator("#checkpoint input").click()
        tab.locator("#checkpoint input").fill("vit-convnn")
        model_chain = expect_chain(tab, "input", "checkpoint")
        tab.get_by_role("option").filter(has_text="vit-convnn").first.click()
        tab.wait_for_function("document.querySelector('.cx').dataset.layer === 'blocks.0.attn'", timeout=60_000)
        settle(tab, model_chain)  # the model's other views too, before counting requests
        table = explorer.on_table(**page(checkpoint, explorer.examples[0], "blocks.0.attn"))
        assert tab.locator(".cx-multiples figure").count() == 4 + 2  # the other rules, and each head's selection
        assert tab.locator(".cx-caption").inner_text().endswith("· head 0 of 2 (0–1)")  # whose keys the rules read
        tab_chain = expect_chain(tab, "select", "hops")  # the open tab, kept for a link: its event
        tab.get_by_role("tab", name="Multi-hop").click()
        tab.wait_for_selector(".cx-hops[data-drawn]")
        settle(tab, tab_chain)  # its results stream opened after the view was drawn, counted as the click's (CI)
        requests = []
        tab.on("request", lambda request: requests.append(request.url))
        tab.locator("#explorer .cx-canvas").first.click(position=pixel_position(tab, table, (5, 27)))
        values = page(checkpoint, explorer.examples[0], "blocks.0.attn", 5, 27)
        assert json.loads(shown(tab)["neighbors"]) == api_cells(explorer, values, "layer")
        field = an.receptive_field(explorer.model(checkpoint), explorer.image(explorer.examples[0]),
                                   "blocks.0.attn", (5, 27), 2, 0)
        hops = tab.locator(".cx-hops")
        assert hops.get_attribute("data-query") == "5,27"
        assert hops.get_attribute("data-counts") == ",".join(map(str, field.pixel_counts))
        assert requests == []


def test_the_multi_hop_view_asks_for_each_query_s_field_where_no_table_holds_them_all(app_url, explorer, chromium,
                                                                                     monkeypatch):
    """Past the field table's bound (a large uploaded model) the page gets one query's field; a click elsewhere asks
    the server for that query's, and the view draws it: the pixel counts the API gives."""
    monkeypatch.setattr(an.views.spectrum, "MAX_FIELD_TABLE", 32 * 32)  # the served app's, in this process
    with browser_page(chromium, app_url) as tab:
        tab.get_by_role("tab", name=app_texts.TABS["hops"]).click()
        tab.wait_for_selector(".cx-hops[data-drawn]")
        assert tab.locator(".cx-hops").get_attribute("data-query") == "16,16"
        table = explorer.on_table(**page("cnn-l0.5", explorer.examples[0]))
        tab.locator("#explorer .cx-canvas").first.click(position=pixel_position(tab, table, (3, 30)))
        tab.wait_for_function("document.querySelector('.cx-hops').dataset.query === '3,30'", timeout=30_000)
        field = an.receptive_field(explorer.model("cnn-l0.5"), explorer.image(explorer.examples[0]), CELL_LAYER,
                                   (3, 30), 2, 0)
        assert tab.locator(".cx-hops").get_attribute("data-asked") == str(1 * 16 + 15)
        assert tab.locator(".cx-hops").get_attribute("data-counts") == ",".join(map(str, field.pixel_counts))
        fields = an.receptive_fields  # a field that takes 0.5 s, as a large model's can
        monkeypatch.setattr(an, "receptive_fields", lambda *args: time.sleep(0.5) or fields(*args))
        for px in ((20, 4), (28, 12)):  # two clicks in quick succession: the view ends on the second one's field
            tab.locator("#explorer .cx-canvas").first.click(position=pixel_position(tab, table, px))
        tab.wait_for_function("document.querySelector('.cx-hops').dataset.query === '28,12'", timeout=30_000)
        assert tab.locator(".toast-body.error").count() == 0


def test_a_refused_layer_name_goes_back_to_the_layer_shown(app_url, chromium):
    """A layer name typed in part ("stages.2") was refused, and the Layer box kept it with an "Error" mark on the
    explorer, so every knob was refused after it until a valid layer was picked. The box now goes back to the layer
    the explorer shows, the mark goes, and a knob applies again."""
    with browser_page(chromium, app_url) as tab:
        shown_layer = tab.locator(".cx").get_attribute("data-layer")
        tab.locator("#layer input").fill("stages.2")
        tab.locator("#layer input").press("Tab")  # leaves the box: the typed name is its value
        tab.wait_for_selector(".toast-body.error:has-text('is not a layer of')", timeout=30_000)
        tab.wait_for_function("(layer) => document.querySelector('#layer input').value.startsWith(`${layer} ·`)"
                              " && !document.querySelector('#explorer .error')", arg=shown_layer, timeout=10_000)
        #                                                                        the layer's label: name · facts
        settle(tab)  # the refusal's steps answered
        drawn = tab.locator(".cx").get_attribute("data-drawn")
        tab.locator("#seed input").fill("7")  # a knob applies again
        tab.locator("#seed input").press("Enter")
        tab.wait_for_function(f"document.querySelector('.cx').dataset.drawn !== '{drawn}'", timeout=30_000)
        assert tab.locator(".cx").get_attribute("data-layer") == shown_layer


def test_an_unknown_model_name_goes_back_to_the_model_shown(app_url, chromium):
    """A model name typed in the model list ("nosuchmodel") was refused, and the list kept it with an "Error" mark on
    the layer list (and the model's other outputs). The list now goes back to the model the explorer shows, its
    layers stay, no mark remains, and a knob applies again."""
    with browser_page(chromium, app_url) as tab:
        model, layer = tab.input_value("#checkpoint input"), tab.input_value("#layer input")
        tab.locator("#checkpoint input").fill("nosuchmodel")
        tab.locator("#checkpoint input").press("Enter")
        tab.wait_for_selector(".toast-body.error:has-text(\"unknown checkpoint 'nosuchmodel'\")", timeout=30_000)
        tab.wait_for_function("model => document.querySelector('#checkpoint input').value === model"
                              " && !document.querySelector('#layer .error, #checkpoint .error')", arg=model,
                              timeout=10_000)
        settle(tab)  # the refusal's steps answered
        assert tab.input_value("#layer input") == layer
        marked = tab.evaluate("[...document.querySelectorAll('.error')].filter(e => !e.closest('.toast-wrap')).length")
        assert marked == 0  # no component keeps an "Error" mark
        drawn = tab.locator(".cx").get_attribute("data-drawn")
        tab.locator("#seed input").fill("7")  # a knob applies again
        tab.locator("#seed input").press("Enter")
        tab.wait_for_function(f"document.querySelector('.cx').dataset.drawn !== '{drawn}'", timeout=30_000)


def test_quick_model_picks_end_on_the_last_one_without_a_false_message(app_url, explorer, chromium, monkeypatch):
    """A model picked while the pick before was still answered: the earlier pick's next steps read the new model
    with the earlier model's layer and showed "layer 'blocks.0.attn' is not a layer of cnn-l0" (the page then
    ended right). And the explorer stayed on the model before the two (1 run in 3): the new pick's explorer step came
    while the earlier pick's was on its way, and the page dropped it (a .then step's trigger_mode "once"). No
    message now, and the page ends on the last model. The server holds the first pick's answer until the second is
    made, and the first pick's explorer step until the page shows the second pick's layers (no time waited)."""
    holding, asked, release, answered = (threading.Event() for _ in range(4))
    card_summary, has_layer = an.card_summary, explorer.has_layer
    first_layer = explorer.model("cnn-l0").first_layer_info

    def held_summary(card) -> str:  # the first model picked: its card, once the second model is picked
        if holding.is_set() and not asked.is_set():
            asked.set()
            release.wait(60)
        return card_summary(card)

    def held_has_layer(checkpoint, layer, request=None) -> bool:  # the first pick's explorer step (the second
        if (checkpoint, layer) == ("cnn-l0", "blocks.0.attn"):  # model, the first's layer): once the second's
            answered.wait(60)  #                                    layers are shown
        return has_layer(checkpoint, layer, request)

    monkeypatch.setattr(an, "card_summary", held_summary)
    monkeypatch.setattr(explorer, "has_layer", held_has_layer)
    with browser_page(chromium, app_url) as tab:
        box = tab.locator("#checkpoint input")
        holding.set()
        try:
            for model in ("vit-mhsa", "cnn-l0"):  # a ViT's layer, then a CNN, which has none of that name
                box.click()
                box.fill(model)
                box.press("Enter")
                assert asked.wait(60)
        finally:
            release.set()
        try:
            tab.wait_for_function("label => document.querySelector('#layer input').value === label",
                                  arg=an.layer_label(first_layer), timeout=60_000)
        finally:
            answered.set()
        tab.wait_for_function("document.querySelector('.cx').dataset.model === 'cnn-l0'", timeout=60_000)
        settle(tab)
        assert shown(tab)["layer"] == first_layer.name
        assert tab.locator(".toast-body").all_inner_texts() == []


def test_an_unknown_model_name_typed_while_a_pick_is_answered_ends_on_the_pick(app_url, explorer, chromium,
                                                                             monkeypatch):
    """A model picked, and before its answer came an unknown name typed in the list and Enter: the pick's next steps
    read the unknown name and changed nothing, and the refusal put the list back to the model drawn before the pick,
    so the list and the explorer stayed on that model while the card and the layer list showed the pick. The page
    now ends on the pick everywhere, with the refusal's message. The server holds the pick's answer until the name
    is entered (the page holds the name's event back until then: always_last), no time waited."""
    holding, asked, release = (threading.Event() for _ in range(3))
    card_summary, picked = an.card_summary, "vit-mhsa"
    first_layer = explorer.model(picked).first_layer_info

    def held_summary(card) -> str:  # the model picked, as if loaded cold: its card once the name is entered
        if holding.is_set() and not asked.is_set():
            asked.set()
            release.wait(60)
        return card_summary(card)

    monkeypatch.setattr(an, "card_summary", held_summary)
    with browser_page(chromium, app_url) as tab:
        tab.get_by_text("Model card, or open your own checkpoint").click()  # the card in sight
        box = tab.locator("#checkpoint input")
        chain = expect_chain(tab, "input", "checkpoint")
        holding.set()
        try:
            box.click()
            box.fill(picked)
            box.press("Enter")
            assert asked.wait(60)
            box.click()
            box.fill("nosuchmodel")
            box.press("Enter")  # the list leaves the box and sends its input: held back by the page
            tab.wait_for_function("document.activeElement !== document.querySelector('#checkpoint input')")
        finally:
            release.set()
        tab.wait_for_selector(".toast-body.error:has-text(\"unknown checkpoint 'nosuchmodel'\")", timeout=30_000)
        label = dict((name, label) for label, name in explorer.choices([]))[picked]  # what the list shows of it
        tab.wait_for_function("([label, model]) => document.querySelector('#checkpoint input').value === label"
                              " && document.querySelector('.cx').dataset.model === model", arg=[label, picked],
                              timeout=60_000)
        settle(tab, chain)  # and every answer on its way has come
        assert (box.input_value(), shown(tab)["model"], shown(tab)["layer"], tab.input_value("#layer input"),
                tab.input_value("#card textarea")) == (label, picked, first_layer.name, an.layer_label(first_layer),
                                                       card_summary(explorer.model(picked).card))
        assert len(tab.locator(".toast-body").all_inner_texts()) == 1  # the refusal's, no other


def test_past_the_table_s_bound_quick_clicks_end_on_the_last_one(app_url, explorer, chromium, monkeypatch):
    """With K above the table's bound each click asks the server for its row; a second click while the first's row
    was on its way was lost (Gradio drops a trigger then) and the first's answer put the query back (an adversary's
    five arrow keys moved four cells). Now the boxes keep the last click and its row is asked for again."""
    tables = an.neighbor_table  # a row that takes 0.5 s, as a large model's can
    monkeypatch.setattr(an, "neighbor_table", lambda *args: time.sleep(0.5) or tables(*args))
    with browser_page(chromium, f"{app_url}?k=200&row=16&col=16&rule=all") as tab:
        tab.wait_for_function("document.querySelector('.cx').dataset.query === '16,16'", timeout=60_000)
        table = explorer.on_table(**page("cnn-l0.5", explorer.examples[0], num_neighbors=200))
        for px in ((0, 0), (31, 31)):  # two clicks in quick succession
            tab.locator("#explorer .cx-canvas").click(position=pixel_position(tab, table, px))
        tab.wait_for_function("document.querySelector('.cx').dataset.query === '31,31'"
                              " && document.querySelector('.cx').dataset.neighbors !== 'null'", timeout=30_000)
        values = page("cnn-l0.5", explorer.examples[0], row_px=31, col_px=31, num_neighbors=200)
        assert json.loads(shown(tab)["neighbors"]) == api_cells(explorer, values, "all")
        assert tab.locator(".toast-body.error").count() == 0


@pytest.mark.parametrize("context", [DESKTOP, PHONE], ids=["1280x800", "390x844"])
def test_the_core_loop_fits_the_screen(app_url, context, chromium):
    """Image, click, focus panel and prediction: inside the viewport (at 1280×800 all on the first screen; at
    390×844 without sideways scrolling, the focus panel starting on the first screen, right after the model, the
    examples and the upload), none covering another. Screenshots go to tests/screenshots/."""
    width, height = context["viewport"]["width"], context["viewport"]["height"]
    with browser_page(chromium, app_url, context) as tab:
        SCREENSHOTS.mkdir(exist_ok=True)
        tab.screenshot(path=SCREENSHOTS / f"explorer-{width}x{height}.png")
        boxes = {name: tab.locator(selector).first.bounding_box() for name, selector in (
            ("model", "#checkpoint"), ("upload", "#image_upload"), ("focus panel", "#explorer .cx-canvas"),
            ("prediction", ".cx-prediction"))}
        assert tab.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scrolling
        for name, box in boxes.items():
            assert box["x"] >= 0 and box["x"] + box["width"] <= width, name
            if width >= 1000:
                assert box["y"] >= 0 and box["y"] + box["height"] <= height, name
        if width < 1000:  # a phone: the image before the rest of the controls
            assert boxes["model"]["y"] < boxes["upload"]["y"] < boxes["focus panel"]["y"] < height
            assert boxes["focus panel"]["y"] < tab.locator("#layer").bounding_box()["y"]
        for (a, box_a), (b, box_b) in itertools.combinations(boxes.items(), 2):
            apart = (box_a["x"] + box_a["width"] <= box_b["x"] or box_b["x"] + box_b["width"] <= box_a["x"]
                     or box_a["y"] + box_a["height"] <= box_b["y"] or box_b["y"] + box_b["height"] <= box_a["y"])
            assert apart, (a, b)
        assert boxes["focus panel"]["width"] >= (0.9 * width if width < 500 else 400)  # large on every screen
        knob_names = tab.locator("#knobs .row [data-testid=block-info]").evaluate_all(
            "names => names.filter((name) => name.checkVisibility()).map((name) => name.offsetHeight)")
        assert len(knob_names) == 4 and len(set(knob_names)) == 1, knob_names  # each on one line, as "seed" is


CHART_BOXES_JS = """(id) => {
  const plot = document.querySelector(`#${id} .js-plotly-plot`);
  const outer = plot.getBoundingClientRect();
  const box = (e) => { const r = e.getBoundingClientRect();
                       return {text: e.textContent, x: r.left - outer.left, y: r.top - outer.top, w: r.width,
                               h: r.height}; };
  return {width: outer.width, height: outer.height,
          label: [...document.querySelectorAll(`#${id} [data-testid=block-label]`)].map(box),
          titles: [...plot.querySelectorAll("text[class*=title], .annotation-text")].filter((e) => e.textContent)
            .map(box),
          ticks: [...plot.querySelectorAll(".xtick text, .ytick text")].map((e) => e.getAttribute("transform") || ""),
          heatmaps: [...plot.querySelectorAll("g.hm image")].map(box)};
}"""  # a chart's size, its Gradio label, and its titles, tick labels and heatmaps, in the chart's CSS pixels
PHONE_CHARTS = {"weights": ["kernel_plot", "slot_plot"], "mix": ["mix_plot"], "attribution": ["attribution_plot"],
                "spectrum": ["spectrum_plot", "spectrum_models_plot"], "equivalence": ["equivalence_plot"],
                "pixels": ["pixel_plot"]}  # every chart, by its tab
SLOW_BUTTONS = {"attribution_plot": "attribution_button", "spectrum_models_plot": "spectrum_models_button",
                "equivalence_plot": "equivalence_button"}  # the charts drawn when asked
MIN_HEATMAP_PX = 120  # a heatmap's least width on a phone (the equivalence demo's three in a row were 80–105 px)


def apart(a: dict, b: dict) -> bool:
    """Whether two boxes ({x, y, w, h}) do not overlap."""
    return a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"] or a["y"] + a["h"] <= b["y"] or \
        b["y"] + b["h"] <= a["y"]


def box_of(locator) -> dict:
    """A locator's box as :func:`apart` takes it ({x, y, w, h}, in the page's CSS pixels)."""
    box = locator.bounding_box()
    return {"x": box["x"], "y": box["y"], "w": box["width"], "h": box["height"]}


def test_the_attribution_s_progress_leaves_its_note_readable(app_url, chromium, monkeypatch):
    """Gradio's progress (the method, the passes made, the time) was drawn over the attribution's note, on its
    words, while the attribution ran: it shows on the chart alone, clear of the note."""
    attribution_map = an.attribution_map  # an attribution that takes seconds, as occlusion's does
    monkeypatch.setattr(an, "attribution_map", lambda *args: time.sleep(3) or attribution_map(*args))
    with browser_page(chromium, app_url) as tab:
        tab.get_by_role("tab", name=app_texts.TABS["attribution"]).click()
        chain = expect_chain(tab, "click", "attribution_button")
        tab.locator("#attribution_button").click()
        tab.wait_for_selector("#tabs .progress-text:has-text('passes')", timeout=30_000)
        note = box_of(tab.locator("#attribution_note p"))
        progress = [box_of(text) for text in tab.locator("#tabs .progress-text:visible, "
                                                         "#tabs .progress-level-inner:visible").all()]
        assert progress and all(apart(text, note) for text in progress), (note, progress)
        settle(tab, chain)
        tab.wait_for_selector("#attribution_plot .js-plotly-plot", timeout=30_000)


DROPDOWN_TEXT_JS = """(selector) => [...document.querySelectorAll(`${selector} input`)]
  .filter((input) => input.offsetParent).map((input) => {
    const box = input.getBoundingClientRect(), style = getComputedStyle(input);
    const arrow = input.parentElement.querySelector(".icon-wrap")?.getBoundingClientRect();
    const control = input.closest(".wrap-inner").getBoundingClientRect();
    const rect = (r) => r && {x: r.left, y: r.top, w: r.width, h: r.height};
    return {value: input.value, scroll: input.scrollWidth, client: input.clientWidth, arrow: rect(arrow),
            control: rect(control), text: {x: box.left + parseFloat(style.paddingLeft), y: box.top,
                                           w: input.clientWidth - parseFloat(style.paddingLeft) -
                                              parseFloat(style.paddingRight), h: box.height}};
  })"""  # each shown dropdown of a selector's: its name, the box its text is drawn in (inside its padding), its
#        menu arrow and its control, in the page's CSS pixels


def whole_beside_arrow(shown: dict, width: int) -> bool:
    """Whether a dropdown (:data:`DROPDOWN_TEXT_JS`) shows its whole name, clear of its arrow, the arrow inside its
    control and the control inside a page ``width`` wide."""
    arrow, control = shown["arrow"], shown["control"]
    inside = (control["x"] <= arrow["x"] and arrow["x"] + arrow["w"] <= control["x"] + control["w"]
              and arrow["y"] >= control["y"] and arrow["y"] + arrow["h"] <= control["y"] + control["h"])
    return (bool(shown["value"]) and shown["scroll"] <= shown["client"] and apart(shown["text"], arrow) and inside
            and 0 <= control["x"] and control["x"] + control["w"] <= width)


def test_a_phone_shows_the_chosen_lesson_s_title_whole_before_the_list_s_arrow(app_url, explorer, chromium):
    """At 390 × 844 the lesson list sat beside ◀ Back, 164 px wide: its arrow was drawn on the chosen lesson's
    title, which was cut mid-word ("1 · Convolution is the w"). The longest title shows whole, ending before the
    arrow, which sits inside the list's box."""
    title = max((lesson["title"] for lesson in explorer.lessons), key=len)
    with browser_page(chromium, app_url, PHONE) as tab:
        tab.get_by_text("Lessons: convolution").click()
        chain = expect_chain(tab, "input", "lesson")
        tab.locator("#lesson input").click()
        tab.get_by_role("option", name=title).click()
        settle(tab, chain)
        [shown] = tab.evaluate(DROPDOWN_TEXT_JS, "#lesson")
        assert shown["value"] == title and whole_beside_arrow(shown, PHONE["viewport"]["width"]), json.dumps(shown)


LAYER_TEXTS_JS = """() => [...document.querySelectorAll("#layer input, #layer .whole-text, [role=option]")]
  .filter((text) => text.checkVisibility({visibilityProperty: true}) &&
                    getComputedStyle(text).color !== "rgba(0, 0, 0, 0)")
  .map((text) => ({text: text.tagName === "INPUT" ? text.value : text.textContent.replace(/^✓ /, ""),
                   wide: text.scrollWidth,
                   width: text.clientWidth, tall: text.scrollHeight, height: text.clientHeight,
                   left: text.getBoundingClientRect().left, right: text.getBoundingClientRect().right}))
"""  # the layer list's chosen layer as drawn (its box's text, unless drawn by another element), and its open list's
#     entries: text, sizes, and where it is in the window


@pytest.mark.parametrize("context", [DESKTOP, PHONE], ids=["1280x800", "390x844"])
def test_the_layer_list_shows_each_layer_s_name_and_facts_whole(shipped_url, chromium, context):
    """The layer list's box shows one line, and a layer's name and facts were cut before its grid ("blocks.2.attn ·
    ConvNN-attention K=16 · rando"), at 1280 × 800 and at 390 × 844: the chosen layer's label shows whole, on the
    lines it takes, as does each entry of the open list, inside the window."""
    url, explorer = shipped_url
    model, layer, width = "vit-convnn16-random32", "blocks.2.attn", context["viewport"]["width"]
    labels = [an.layer_label(layer_info) for layer_info in explorer.model(model).layer_infos]

    def whole(texts: list[dict]) -> bool:
        return all(text["wide"] <= text["width"] and text["tall"] <= text["height"] and 0 <= text["left"]
                   and text["right"] <= width for text in texts)

    with browser_page(chromium, f"{url}?model={model}&layer={layer}", context) as tab:
        chosen = tab.evaluate(LAYER_TEXTS_JS)
        assert [text["text"] for text in chosen] == [an.layer_label(explorer.model(model).layer_info(layer))]
        assert whole(chosen), chosen
        tab.locator("#layer input:visible").click()  # the list open, nothing typed yet
        entries = tab.evaluate(LAYER_TEXTS_JS)
        assert [text["text"] for text in entries] == [chosen[0]["text"], *labels] and whole(entries), entries


def test_a_phone_keeps_the_controls_on_the_second_screen_through_a_long_lesson_step(shipped_url, chromium):
    """At 390 × 844 the random-candidate lesson's last step (its longest text, on a model whose prediction adds its
    answer over 16 draws) put the K box at y = 1,901, past the second screen (found by a newcomer): the step's text
    scrolls in its box, whole (its last words reachable), and the layer, fit and K controls end by y = 1,688."""
    url, explorer = shipped_url
    lesson = next(lesson for lesson in explorer.lessons if "random" in lesson["title"].lower())
    height = PHONE["viewport"]["height"]
    with browser_page(chromium, url, PHONE) as tab:
        tab.get_by_text("Lessons: convolution").click()
        chain = expect_chain(tab, "input", "lesson")
        tab.locator("#lesson input").click()
        tab.get_by_role("option", name=lesson["title"]).click()
        settle(tab, chain)
        for _ in lesson["steps"][1:]:
            chain = expect_chain(tab, "click", "lesson_next")
            tab.locator("#lesson_next").click()
            settle(tab, chain)
        tab.evaluate("window.scrollTo(0, 0)")
        assert tab.locator(".cx-spread").count() == 1  # the model's answer over its draws, under the prediction
        bottoms = {name: tab.locator(selector).first.bounding_box() for name, selector in (
            ("image", "#explorer .cx-canvas"), ("top-1", ".cx-predicted"), ("layer", "#layer"), ("fit", "#fit"),
            ("K", "#num_neighbors"))}
        bottoms = {name: round(box["y"] + box["height"]) for name, box in bottoms.items()}
        assert bottoms["image"] <= height and bottoms["top-1"] <= height, bottoms
        assert max(bottoms[name] for name in ("layer", "fit", "K")) <= 2 * height, bottoms
        text = tab.locator("#lesson_text")
        assert f"Step {len(lesson['steps'])} of {len(lesson['steps'])}" in text.inner_text()
        box = text.evaluate("t => ({scroll: t.scrollHeight, client: t.clientHeight, overflow: getComputedStyle(t)"
                            ".overflowY})")
        assert box["scroll"] > box["client"] and box["overflow"] == "auto", box  # the rest of it, in its box


def test_a_phone_shows_compare_mode_s_layer_names_whole(shipped_url, chromium):
    """At 390 × 844 compare mode's layer lists stood two to a row, 126 px for a name 162 px long ("stages.1.0.conv2
    · 16×16" showed as "stages.1.0.conv…"): each column's layer name shows whole, clear of its list's arrow."""
    url, _ = shipped_url
    with browser_page(chromium, url, PHONE) as tab:
        tab.get_by_role("tab", name=app_texts.TABS["compare"]).click()
        tab.wait_for_function("document.querySelector('.cc')?.dataset.columns === '3'", timeout=60_000)
        settle(tab)
        lists = tab.evaluate(DROPDOWN_TEXT_JS, "[id^=compare_layer_]")
        assert [shown["value"].split(" · ")[0] for shown in lists] == [
            tab.locator(f".cc-col:nth-child({i + 1})").get_attribute("data-layer") for i in range(3)]
        assert all(whole_beside_arrow(shown, PHONE["viewport"]["width"]) for shown in lists), json.dumps(lists)


def test_a_phone_shows_the_image_and_prediction_first_then_the_controls_and_whole_charts(app_url, chromium):
    """At 390 × 844: the whole image and the top-1 prediction on the first screen, with a lesson open too (its picker
    and text put the image at y ≈ 811), the layer, fit and K controls by the end of the second (they were below
    2,200 px, after the explorer's statistics); every chart's titles inside
    its box, clear of each other and of the chart's label, tick labels never vertical (per-layer names were) and
    heatmaps at least :data:`MIN_HEATMAP_PX` wide (the equivalence demo's were ≈ 80 px; its every-model spectrum's
    axis title ran off the chart). Each wait is for what the page shows, never for a time."""
    height = PHONE["viewport"]["height"]
    with browser_page(chromium, app_url, PHONE) as tab:
        for image in ("example", "upload", "lesson"):  # a phone photo's note (its size, its crop) pushed the top-1
            #                                           below
            if image == "upload":
                photo = io.BytesIO()
                Image.new("RGB", (3000, 2000), (90, 140, 60)).save(photo, "JPEG")
                chain = expect_chain(tab, "upload", "image_upload")
                with tab.expect_file_chooser() as chooser:
                    tab.locator("#image_upload").click()
                chooser.value.set_files({"name": "phone-photo.jpg", "mimeType": "image/jpeg",
                                         "buffer": photo.getvalue()})
                settle(tab, chain)
                tab.evaluate("window.scrollTo(0, 0)")  # the first screen, as the page opened
                assert "3000×2000" in tab.locator(".cx-seen").inner_text()  # the note in its longest form
            if image == "lesson":  # a lesson open, its picker and its step's text (here a note on these models)
                tab.get_by_text("Lessons: convolution").click()
                chain = expect_chain(tab, "input", "lesson")
                tab.locator("#lesson input").click()
                tab.get_by_role("option").first.click()
                settle(tab, chain)
                tab.evaluate("window.scrollTo(0, 0)")
            boxes = {name: tab.locator(selector).first.bounding_box() for name, selector in (
                ("image", "#explorer .cx-canvas"), ("top-1", ".cx-predicted"), ("layer", "#layer"), ("fit", "#fit"),
                ("K", "#num_neighbors"))}
            bottoms = {name: round(box["y"] + box["height"]) for name, box in boxes.items()}
            assert bottoms["image"] <= height and bottoms["top-1"] <= height, (image, bottoms)
            assert max(bottoms[name] for name in ("layer", "fit", "K")) <= 2 * height, (image, bottoms)
        for tab_id, charts in PHONE_CHARTS.items():
            tab.get_by_role("tab", name=app_texts.TABS[tab_id]).click()
            for chart in charts:
                if chart in SLOW_BUTTONS:
                    tab.locator(f"#{SLOW_BUTTONS[chart]}").click()
                tab.wait_for_selector(f"#{chart} .js-plotly-plot .gtitle", timeout=60_000)
                tab.screenshot(path=SCREENSHOTS / f"phone-{chart}.png", full_page=True, scale="css")  # in CSS px:
                #                                      at the phone's 3 device px per CSS px a shot took 1 s, not 0.25
                drawn = tab.evaluate(CHART_BOXES_JS, chart)
                for title in drawn["titles"]:
                    inside = (title["x"] >= -1 and title["y"] >= -1 and title["x"] + title["w"] <= drawn["width"] + 1
                              and title["y"] + title["h"] <= drawn["height"] + 1)
                    assert inside, (chart, title, drawn["width"], drawn["height"])
                    assert all(apart(title, label) for label in drawn["label"]), (chart, title, drawn["label"])
                for a, b in itertools.combinations(drawn["titles"], 2):
                    assert apart(a, b), (chart, a, b)
                assert not [t for t in drawn["ticks"] if "rotate(90" in t or "rotate(-90" in t], chart
                assert all(heatmap["w"] >= MIN_HEATMAP_PX for heatmap in drawn["heatmaps"]), (chart, drawn["heatmaps"])


def test_enter_in_a_slider_s_box_applies_the_value(app_url, chromium):
    """A slider's number box applied a typed value only when it lost focus: hops 3 and Enter still drew 2 hops."""
    with browser_page(chromium, app_url) as tab:
        chain = expect_chain(tab, "release", "blend_alpha")
        box = tab.locator("#blend_alpha input[type=number]")
        box.fill("0.9")
        box.press("Enter")
        settle(tab, chain, timeout_s=30)  # the slider's event was sent and answered
        assert 0.9 in tab.evaluate("window.convnnKnobs")  # the knobs its table was made from (app_texts.KEEP_KNOBS_JS)


TYPED = {"num_neighbors": ("12", "30"), "window_size": ("7", "9"), "num_candidates": ("64", "120"),
         "seed": ("99", "4321"), "blend_alpha": ("0.2", "0.35")}  # each knob's two values, typed one after the other


def type_value(tab, elem_id: str, value: str) -> None:
    """``value`` typed into a number box as a person types it, 20–30 ms per key (the box emptied first), and Enter."""
    box = tab.locator(f"#{elem_id} input[type=number]")
    box.click()
    box.press("Control+a")
    for key in value:
        box.press(key)
        tab.wait_for_timeout(20 + 10 * (ord(key) % 2))
    box.press("Enter")


def drawn_with(tab, knobs: dict[str, str]) -> None:
    """Wait until the explorer's table was made with ``knobs`` (name → value as its box shows it), then until the
    page has settled. A change made while the one before is answered is held by the page (always_last) and sent
    once that answer has been handled: in between no event of it is open, so :func:`settle` alone could end there
    (it did, with the view still on a value typed half-way)."""
    tab.wait_for_function("""knobs => {
        const options = JSON.parse(document.querySelector(".cx").dataset.options);
        return Object.entries(knobs).every(([knob, value]) => String(options[knob]) === value);
    }""", arg=knobs)
    settle(tab)


def test_what_a_typed_knob_shows_is_what_the_view_shows(app_url, explorer, chromium, monkeypatch):
    """Typing K at 30–60 ms per key left the view on the first digit (box "30", view "K = 3"): each key sent the
    box's value (.input), and a change made while the one before was answered was dropped (Gradio's trigger_mode
    "once"). A number box now applies its value when the user leaves it (Enter), and the last of quick changes runs
    (always_last): two values typed one after the other into each knob, the α box and a ViT's head box, the second
    while the first one's table is on its way, and the view is drawn with what every box shows."""
    table = explorer.table
    monkeypatch.setattr(explorer, "table", lambda *args, **kwargs: time.sleep(0.4) or table(*args, **kwargs))
    with browser_page(chromium, app_url) as tab:
        typed = []
        for elem_id, values in TYPED.items():
            for value in values:
                type_value(tab, elem_id, value)
            typed.append(elem_id)
            drawn_with(tab, {knob: TYPED[knob][-1] for knob in typed})
            options = json.loads(tab.locator(".cx").get_attribute("data-options"))  # the table drawn (0: resolved)
            boxes = {knob: tab.input_value(f"#{knob} input[type=number]") for knob in typed}
            assert boxes == {knob: TYPED[knob][-1] for knob in typed}  # the boxes show what was typed last
            assert {knob: str(options[knob]) for knob in typed} == boxes, elem_id  # and so does the view
        tab.locator("#checkpoint input").click()
        tab.locator("#checkpoint input").fill("vit-convnn")
        model_chain = expect_chain(tab, "input", "checkpoint")
        tab.get_by_role("option").filter(has_text="vit-convnn").first.click()
        settle(tab, model_chain)
        for value in ("1", "0"):
            type_value(tab, "head", value)
        drawn_with(tab, {"head": "0"})
        assert json.loads(tab.locator(".cx").get_attribute("data-options"))["head"] == 0
        assert tab.locator(".toast-body.error").count() == 0


def test_a_number_typed_quickly_is_the_number_typed_or_refused(app_url, chromium):
    """1e30 typed quickly in the K box ended as K = 30, and -5 as K = 5: while the box's text was not a number yet
    ("1e", "-"), Gradio's box read it as empty and emptied it under the next keys. The number typed reaches the
    server, which refuses it with K's range, the box back to the K shown; text that never becomes a number ("1e"
    and Enter) is refused in the page, which says so under the box, the box back to the K shown, nothing sent."""
    with browser_page(chromium, app_url) as tab:
        box, drawn = tab.locator("#num_neighbors input"), tab.locator(".cx").get_attribute("data-drawn")
        for typed, got in (("1e30", "got 1.00e+30"), ("-5", "got -5")):
            chain = expect_chain(tab, "blur", "num_neighbors")
            box.click()
            box.press("Control+a")
            tab.keyboard.type(typed)  # no pause between keys
            box.press("Enter")
            settle(tab, chain)
            tab.wait_for_selector(f".toast-body.error:has-text('must be from 1 to 256'):has-text('{got}')",
                                  timeout=10_000)
            tab.wait_for_function("document.querySelector('#num_neighbors input').value === '0'", timeout=10_000)
        requests = []
        tab.on("request", lambda request: requests.append(request.url))
        box.click()
        box.press("Control+a")
        tab.keyboard.type("1e")
        box.press("Enter")
        assert box.input_value() == "0"
        refused = tab.locator("#num_neighbors [role=alert]").inner_text()
        assert refused.startswith("K (neighbours per query) must be a number"), refused
        settle(tab)
        assert requests == [] and tab.locator(".cx").get_attribute("data-drawn") == drawn


def test_the_slow_views_answer_their_buttons_in_the_page(app_url, chromium):
    """Attribution and the equivalence demo, asked for in the page, show their results with no error: their
    handlers are coroutines that compute in a thread of their own (server.SlowRuns), Gradio's progress included; a
    cancelled attribution clears its chart and says it was cancelled, with no "Error" mark: the server drops the
    run, the page cancels nothing through Gradio's /cancel (whose late message ending the event left the note and
    the chart marked "Error" with no message, 3 of 18 tries). The Cancel's join is answered late here, after its
    result, as on a loaded machine: the page still shows that result, and settle waits for it, not for the results
    stream that Gradio's client opens again then (the test waited out settle's bound on it, 66 s instead of 8)."""
    with browser_page(chromium, app_url) as tab:
        errors = []
        tab.on("pageerror", lambda error: errors.append(str(error)))
        tab.get_by_role("tab", name=app_texts.TABS["attribution"]).click()
        tab.locator("#attribution_button").click()
        tab.wait_for_selector("#attribution_plot .js-plotly-plot", timeout=60_000)
        tab.locator("#target textarea, #target input").first.fill("giraffe")  # not a class of the model: refused
        chain = expect_chain(tab, "click", "attribution_button")
        tab.locator("#attribution_button").click()
        tab.wait_for_selector(".toast-body.error:has-text(\"class 'giraffe' is not one of the model's classes\")",
                              timeout=60_000)
        settle(tab, chain)
        tab.wait_for_function("!document.querySelector('#attribution_plot .error, #attribution_note .error')",
                              timeout=10_000)  # the refusal's step that takes the mark off may come a moment later
        assert tab.locator("#attribution_plot .js-plotly-plot").count() == 1  # the last result stays
        tab.locator(".toast-body.error .toast-close").first.click()
        tab.wait_for_selector(".toast-body.error", state="detached", timeout=10_000)
        tab.locator("#target textarea, #target input").first.fill("")
        tab.get_by_role("tab", name=app_texts.TABS["equivalence"]).click()
        tab.locator("#equivalence_button").click()
        tab.wait_for_function("document.querySelector('#equivalence_text').innerText.includes('max |difference|')",
                              timeout=60_000)
        tab.wait_for_selector("#equivalence_plot .js-plotly-plot", timeout=60_000)
        assert tab.locator(".toast-body.error").count() == 0 and errors == []
        tab.get_by_role("tab", name=app_texts.TABS["attribution"]).click()
        tab.locator("#method input").click()  # occlusion takes seconds: Cancel drops it, and the page says so
        tab.get_by_role("option", name="Occlusion").click()
        requests = []
        tab.on("request", lambda request: requests.append(request.url))
        chain = expect_chain(tab, "click", "attribution_cancel")  # the Cancel's one step

        def answer_late(route):
            response = route.fetch()
            if json.loads(route.request.post_data)["fn_index"] == chain:
                time.sleep(1)  # the Cancel's result reaches the page first
            route.fulfill(response=response)
        tab.route(lambda url: "/queue/join" in url, answer_late)
        tab.locator("#attribution_button").click()
        tab.locator("#attribution_cancel").click()
        settle(tab, chain)
        assert tab.locator("#attribution_note").inner_text().startswith("Cancelled.")
        assert tab.locator("#attribution_plot .js-plotly-plot").count() == 0
        assert tab.locator(".error").count() == 0 and errors == []
        assert not [url for url in requests if url.endswith("/cancel")]


def test_a_fifth_model_in_compare_mode_is_not_added_and_the_page_says_so(app_url, chromium):
    """Compare mode's list dropped a 5th model silently (its max_choices); it is not added now, with a message."""
    with browser_page(chromium, app_url) as tab:
        tab.get_by_role("tab", name=app_texts.TABS["compare"]).click()
        tab.wait_for_function("document.querySelector('.cc')?.dataset.columns === '2'", timeout=60_000)
        settle(tab)
        for name in ("cnn-random", "vit-convnn", "vit-mhsa"):
            chain = expect_chain(tab, "input", "compare_models")
            tab.locator("#compare_models input").click()
            tab.get_by_role("option").filter(has_text=name).first.click()
            settle(tab, chain)
        tab.wait_for_selector(".toast-body:has-text('Compare mode shows 4 models at most: remove one to add "
                              "another.')", timeout=30_000)
        chips = tab.evaluate("[...document.querySelectorAll('#compare_models .token-remove')]"
                             ".map(button => button.parentElement.innerText).filter(Boolean)")  # not "clear all"
        assert [chip.split(":")[0] for chip in chips] == ["cnn-l0", "cnn-l0.5", "cnn-random", "vit-convnn"]
        assert tab.locator(".cc").get_attribute("data-columns") == "4"
        assert [tab.locator(f".cc-col:nth-child({i + 1})").get_attribute("data-model") for i in range(4)] == [
            "cnn-l0", "cnn-l0.5", "cnn-random", "vit-convnn"]


def test_a_refused_depth_goes_back_to_the_depth_compare_mode_shows(app_url, chromium):
    """A depth typed out of range (2) was refused, but the depth control stayed at the refused bound (1), the layer
    lists kept an "Error" mark, and a copied link said depth=1.0. The control goes back to the depth the columns
    show, no mark remains, and a copied link carries that depth."""
    with browser_page(chromium, app_url) as tab:
        tab.get_by_role("tab", name=app_texts.TABS["compare"]).click()
        tab.wait_for_function("document.querySelector('.cc')?.dataset.columns === '2'", timeout=60_000)
        settle(tab)
        depth = tab.input_value("#compare_depth input[type=number]")
        layers = [tab.input_value(f"#compare_layer_{i} input") for i in range(2)]
        type_value(tab, "compare_depth", "2")
        tab.wait_for_selector(".toast-body.error:has-text('must be from 0 to 1, got 2.0')", timeout=30_000)
        tab.wait_for_function("depth => document.querySelector('#compare_depth input[type=number]').value === depth"
                              " && !document.querySelector('#compare_depth .error, [id^=compare_layer_] .error')",
                              arg=depth, timeout=10_000)
        settle(tab)
        assert [tab.input_value(f"#compare_layer_{i} input") for i in range(2)] == layers
        tab.locator("#link_button").click()
        tab.wait_for_function("document.querySelector('#link textarea, #link input').value.includes('depth=')")
        assert f"&depth={depth}&" in tab.locator("#link textarea, #link input").first.input_value()


def test_an_uploaded_photo_leaves_no_example_highlighted(app_url, explorer, chromium):
    """An example picked, then a photo uploaded: the explorer shows the photo and no example thumbnail stays
    highlighted as if it were the image shown (the one picked before stayed selected)."""
    with browser_page(chromium, app_url) as tab:
        chain = expect_chain(tab, "select", "examples")
        tab.locator("#examples .thumbnail-item").nth(3).click()
        settle(tab, chain)
        assert tab.locator("#examples .thumbnail-item.selected").count() == 1
        picked = tab.locator(".cx").get_attribute("data-image")
        chain = expect_chain(tab, "upload", "image_upload")
        with tab.expect_file_chooser() as chooser:
            tab.locator("#image_upload").click()
        chooser.value.set_files(str(explorer.examples[5]))
        settle(tab, chain)
        assert tab.locator(".cx").get_attribute("data-image") != picked  # the photo is shown
        assert tab.locator("#examples .thumbnail-item.selected").count() == 0


def test_a_refused_photo_leaves_the_examples_usable(app_url, explorer, chromium, tmp_path):
    """A file that is no image, uploaded as a photo, is refused with a message; the example thumbnails, an output
    of that step, were covered by a bare "Error" mark (until closed by hand) that took every click meant for them.
    Now they keep no mark, and a thumbnail picked next is shown."""
    fake = tmp_path / "not-an-image.jpg"
    fake.write_text("this is text")
    with browser_page(chromium, app_url) as tab:
        shown_before = tab.locator(".cx").get_attribute("data-image")
        with tab.expect_file_chooser() as chooser:
            tab.locator("#image_upload").click()
        chooser.value.set_files(str(fake))  # refused: the chain stops at its first step (no settle: no later step)
        tab.wait_for_selector(".toast-body:has-text('is not an image')", timeout=30_000)
        assert tab.locator(".cx").get_attribute("data-image") == shown_before
        tab.wait_for_function("!document.querySelector('#examples').innerText.includes('Error')")
        chain = expect_chain(tab, "select", "examples")
        tab.locator("#examples .thumbnail-item").nth(2).click(timeout=10_000)
        settle(tab, chain)
        assert tab.locator("#examples .thumbnail-item.selected").count() == 1
        assert tab.locator(".cx").get_attribute("data-image") != shown_before


def test_each_example_thumbnail_is_named_by_its_example(app_url, explorer, chromium):
    """The example thumbnails had no name (an empty alt text): a screen reader had only "Thumbnail 4 of 20", a test
    only a place. Each is named as a link names its example (its file's stem), by Gradio's caption, which is its
    alt text; the caption Gradio draws over a thumbnail is not shown (it hid half of a 32 px image). The thumbnail's
    button, which Gradio names "Thumbnail n of 20" (again as it redraws), is named by its image, after a pick too."""
    stems = [Path(path).stem for path in explorer.examples]
    with browser_page(chromium, app_url) as tab:
        assert tab.locator("#examples .thumbnail-item img").evaluate_all("images => images.map(i => i.alt)") == stems
        assert tab.locator("#examples .caption-label").evaluate_all(
            "labels => labels.filter(label => label.checkVisibility()).length") == 0
        buttons = tab.locator("#examples")
        assert [buttons.get_by_role("button", name=stem, exact=True).count() for stem in stems] == [1] * len(stems)
        chain = expect_chain(tab, "select", "examples")
        buttons.get_by_role("button", name="dog_1", exact=True).click()
        settle(tab, chain)
        assert tab.locator("#examples .thumbnail-item.selected img").get_attribute("alt") == "dog_1"
        assert [buttons.get_by_role("button", name=stem, exact=True).count() for stem in stems] == [1] * len(stems)
        dog = next(path for path in explorer.examples if Path(path).stem == "dog_1")
        assert tab.locator(".cx").get_attribute("data-image") == explorer.image(dog).digest


def test_compare_mode_offers_a_button_for_every_rule_of_its_tables(app_url, explorer, chromium, toy_rule):
    """Compare mode's rule bar is its tables' rules, as the explorer's is (it was a list of five written in
    compare.js, so a rule registered in the library, here the toy one, had no button there, and its titles were not
    the server's): the toy rule's button shows, in every column, the neighbours the server's table gives."""
    with browser_page(chromium, app_url) as tab:
        tab.get_by_role("tab", name=app_texts.TABS["compare"]).click()
        tab.wait_for_function("document.querySelector('.cc')?.dataset.columns === '2'", timeout=60_000)
        settle(tab)
        columns = [tab.locator(f".cc-col:nth-child({i + 1})") for i in range(2)]
        tables = [explorer.table(an.Query(checkpoint=column.get_attribute("data-model"), layer=column.get_attribute(
            "data-layer"), image_file=str(explorer.examples[0]))) for column in columns]
        titles = [rule["title"] for rule in tables[0]["rules"]]
        assert "first keys (toy)" in titles
        assert tab.locator(".cc-rules button").all_inner_texts() == titles
        tab.locator(".cc-rules button", has_text="first keys (toy)").click()
        assert tab.locator(".cc").get_attribute("data-rule") == "first"
        for column, table in zip(columns, tables, strict=True):  # the toy rule: every query's row is the same
            assert json.loads(column.get_attribute("data-neighbors")) == cells(table, "first", 0)


@pytest.fixture(scope="module")
def shipped_url():
    """The app on the shipped checkpoints (the lessons name them), served in this process for this module's tests."""
    explorer = app.Explorer(SHIPPED_DIR, device="cpu")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo = app.build_demo(explorer)
    _, url, _ = app_server.launch(demo, port, prevent_thread_lock=True, workspace=explorer.workspace)
    yield url, explorer
    demo.close()


def linked_values(explorer, link: str) -> dict:
    """The page values a link sets, the knobs it leaves out at their defaults (tests.app.test_app.page)."""
    fields = dict(parse_qsl(link))
    image = next(path for path in explorer.examples if Path(path).stem == fields["image"])
    return page(fields["model"], image, fields["layer"], int(fields["row"]), int(fields["col"]),
                **{item.name: int(fields[how.link]) for item, how in an.settings(an.Query)
                   if how.is_knob and how.link in fields})


def test_a_link_restores_the_view_and_a_copied_link_reopens_it(shipped_url, chromium):
    url, explorer = shipped_url
    link = "model=cnn-l1&image=cat_0&layer=stages.0.0.conv1&row=5&col=7&k=4&tab=spectrum&rule=window"
    with browser_page(chromium, f"{url}?{link}") as tab:
        assert shown(tab)["layer"] == "stages.0.0.conv1" and shown(tab)["query"] == "5,7"
        assert shown(tab)["rule"] == "window"  # the rule shown large
        assert json.loads(shown(tab)["neighbors"]) == api_cells(explorer, linked_values(explorer, link), "window")
        assert tab.get_by_role("tab", name="Spectrum").get_attribute("aria-selected") == "true"
        assert tab.locator(".toast-body").count() == 0  # no view ran on a half-applied link (no error toast)
        tab.locator("#link_button").click()
        tab.wait_for_function("document.querySelector('#link textarea, #link input').value.includes('?model=')")
        copied = tab.locator("#link textarea, #link input").first.input_value()
    assert copied == f"{url}?{link}"  # the address this page opened on, whose view is checked above: it reopens it
    with browser_page(chromium, f"{url}?row=999&model=nope") as bad:  # a bad link: a message, the page's default view
        assert "could not set everything" in bad.locator("#link_note").inner_text()
        bad.wait_for_selector(".toast-body:has-text('could not set everything it names')", timeout=30_000)  # in sight
        assert shown(bad)["query"] == "16,16"
    with browser_page(chromium, f"{url}?tab=compare&depth=2") as bad:  # the note stays once compare mode has opened
        bad.wait_for_function("document.querySelector('.cc')?.dataset.columns", timeout=60_000)
        bad.wait_for_selector(".toast-body:has-text('could not set everything it names')", timeout=30_000)
        assert "the link's depth" in bad.locator("#link_note").inner_text()
    compared = "tab=compare&compare=cnn-l0,vit-mhsa&depth=0.25"  # compare mode's models and depth
    with browser_page(chromium, f"{url}?{compared}") as tab:
        tab.wait_for_function("document.querySelector('.cc')?.dataset.columns === '2'", timeout=60_000)
        columns = [tab.locator(f".cc-col:nth-child({i + 1})") for i in range(2)]
        assert [column.get_attribute("data-model") for column in columns] == ["cnn-l0", "vit-mhsa"]
        assert [column.get_attribute("data-layer") for column in columns] == [
            an.layer_at_depth(explorer.model(name), 0.25).name for name in ("cnn-l0", "vit-mhsa")]
        tab.locator("#link_button").click()
        tab.wait_for_function("document.querySelector('#link textarea, #link input').value.includes('compare=')")
        assert tab.locator("#link textarea, #link input").first.input_value().endswith(f"{compared}&rule=layer")


def test_a_copied_link_is_cleared_once_the_view_moves_on(app_url, explorer, chromium, tmp_path):
    """The link box kept a copied link, and its note, after the view changed: a link to a view no longer shown, next
    to the button that says "a link to this view". Each change of what a link names (the clicked pixel, the rule
    shown large, the open tab, K, the image) clears both, in the page (a click still sends nothing), and the link
    copied again is the new view's."""
    table = explorer.on_table(**page("cnn-l0.5", explorer.examples[0]))
    with browser_page(chromium, app_url) as tab:
        box = tab.locator("#link textarea, #link input").first

        def copied() -> str:
            tab.locator("#link_button").click()
            tab.wait_for_function("document.querySelector('#link textarea, #link input').value.includes('?model=')")
            return box.input_value().split("?", 1)[1]

        def cleared() -> None:
            tab.wait_for_function("document.querySelector('#link textarea, #link input').value === '' && "
                                  "document.querySelector('#link_note').innerText.trim() === ''")

        assert "&row=16&col=16&" in copied()
        requests = []
        tab.on("request", lambda request: requests.append(request.url))
        tab.locator("#explorer .cx-canvas").click(position=pixel_position(tab, table, (5, 7)))
        cleared()
        assert requests == []  # cleared in the page
        assert "&row=5&col=7&" in copied()
        tab.get_by_role("tab", name="window (convolution)").click()
        cleared()
        assert copied().endswith("&tab=weights&rule=window")
        tab.get_by_role("tab", name=app_texts.TABS["spectrum"]).click()
        cleared()
        assert copied().endswith("&tab=spectrum&rule=window")
        tab.get_by_role("tab", name=app_texts.TABS["compare"]).click()
        tab.wait_for_function("document.querySelector('.cc')?.dataset.columns === '2'", timeout=60_000)
        cleared()
        assert "&tab=compare&compare=cnn-l0,cnn-l0.5&depth=" in copied()
        type_value(tab, "compare_depth", "1")
        cleared()
        assert copied().endswith("&depth=1.0&rule=window")
        chain = expect_chain(tab, "input", "compare_models")
        tab.locator("#compare_models input").click()
        tab.get_by_role("option").filter(has_text="vit-mhsa").first.click()
        settle(tab, chain)
        cleared()
        assert "&compare=cnn-l0,cnn-l0.5,vit-mhsa&" in copied()
        type_value(tab, "num_neighbors", "4")
        drawn_with(tab, {"num_neighbors": "4"})
        cleared()
        assert "&k=4&" in copied()
        Image.open(explorer.examples[5]).rotate(90).save(photo := tmp_path / "photo.png")  # no example's bytes
        chain = expect_chain(tab, "upload", "image_upload")
        with tab.expect_file_chooser() as chooser:
            tab.locator("#image_upload").click()
        chooser.value.set_files(str(photo))
        settle(tab, chain)
        cleared()
        assert "image=" not in copied()
        tab.locator("#link_note", has_text="This link leaves out the uploaded photo").wait_for()
        tab.locator("#explorer .cx-canvas").click(position=pixel_position(tab, table, (20, 3)))
        cleared()  # its note too


def test_a_link_answered_after_the_view_moved_on_is_dropped(app_url, explorer, chromium, monkeypatch):
    """A link asked for, then a pixel clicked before its answer came: the click cleared the (still empty) link box,
    and the late answer wrote the link of the view no longer shown into it. That answer is dropped: the box and the
    note stay empty, and the link copied again is the view's shown. The server holds the answer until the click is
    drawn (no time waited)."""
    asked, release, link = threading.Event(), threading.Event(), explorer.link

    def held_link(*args, **kwargs) -> dict:
        asked.set()
        release.wait(60)
        return link(*args, **kwargs)

    monkeypatch.setattr(explorer, "link", held_link)
    table = explorer.on_table(**page("cnn-l0.5", explorer.examples[0]))
    with browser_page(chromium, app_url) as tab:
        box = tab.locator("#link textarea, #link input").first
        try:
            chain = expect_chain(tab, "click", "link_button")
            tab.locator("#link_button").click()
            assert asked.wait(60)  # the link of pixel (16, 16) is on its way
            tab.locator("#explorer .cx-canvas").click(position=pixel_position(tab, table, (5, 7)))
            tab.wait_for_function("document.querySelector('.cx').dataset.query === '5,7'")
        finally:
            release.set()
        settle(tab, chain)  # its answer has come
        assert box.input_value() == "" and tab.locator("#link_note").inner_text().strip() == ""
        tab.locator("#link_button").click()
        tab.wait_for_function("document.querySelector('#link textarea, #link input').value.includes('?model=')")
        assert "&row=5&col=7&" in box.input_value()


def test_a_typed_row_is_a_pixel_of_the_image_and_an_empty_one_changes_nothing(app_url, chromium):
    """An empty row box read as row 0 (the explorer drew row 0), and a row past the image (99 on the 32 px input)
    stayed in its box, drawn nowhere, and went into a copied link. A box left empty, or not holding a whole number,
    goes back to the pixel shown; a row or col past the image's edge is moved onto its nearest pixel, as a model of
    a smaller input moves the query; the box and a copied link hold the pixel drawn."""
    with browser_page(chromium, app_url) as tab:

        def typed(box: str, value: str, query: str) -> None:
            """``value`` typed into ``box`` and Enter: the explorer then draws ``query``, and the boxes hold it."""
            tab.locator(f"#{box} input").fill(value)
            tab.locator(f"#{box} input").press("Enter")
            tab.wait_for_function("query => document.querySelector('.cx').dataset.query === query && [...document"
                                  ".querySelectorAll('#row_px input, #col_px input')].map(b => b.value).join() === "
                                  "query", arg=query)

        assert shown(tab)["query"] == "16,16"
        typed("row_px", "", "16,16")
        typed("row_px", "99", "31,16")
        tab.locator("#link_button").click()
        tab.wait_for_function("document.querySelector('#link textarea, #link input').value.includes('?model=')")
        assert "&row=31&col=16&" in tab.locator("#link textarea, #link input").first.input_value()
        typed("col_px", "-4", "31,0")
        typed("col_px", "", "31,0")
        typed("row_px", "7", "7,0")


TAB_IN_VIEW_JS = """() => {
  const top = document.querySelector("#tabs").getBoundingClientRect().top;
  return top >= 0 && top < innerHeight / 2;
}"""  # the tabs' bar in the upper half of the window


def test_a_link_that_opens_a_tab_shows_it(app_url, chromium):
    """A link that opens a tab (?tab=compare) opened it below the explorer, off the first screen at 1280 × 800, and
    the page stayed at its top: once the link's views are drawn, the tab is in view (a plain address stays at the
    top, and so does a link naming a tab that is not one)."""
    with browser_page(chromium, f"{app_url}?tab=compare") as tab:
        tab.wait_for_function(TAB_IN_VIEW_JS, timeout=30_000)
        assert tab.get_by_role("tab", name=app_texts.TABS["compare"]).get_attribute("aria-selected") == "true"
        assert tab.locator(".cc").is_visible()  # compare mode itself, not only its tab's name
    for address in (app_url, f"{app_url}?tab=nosuchtab"):
        with browser_page(chromium, address) as tab:
            assert tab.evaluate("window.scrollY") == 0 and not tab.evaluate(TAB_IN_VIEW_JS)


def test_a_link_too_long_to_read_opens_the_page_with_a_note_not_a_bare_error(app_url, chromium):
    """A link of 15 KB passed the server's address bound (16 KB), but the page sends its query string again with
    each request it makes, re-encoded by Gradio's client (a comma as %2C: 29 KB): those were refused (414) and the
    page showed a bare "Error" toast. A link longer than the explorer's links can be opens the page without it."""
    link = "compare=" + ",".join(["cnn-l0"] * 2200)  # 15,407 bytes
    with browser_page(chromium, f"{app_url}?{link}") as tab:
        assert tab.url.endswith("/?link_too_long=15407")
        assert tab.locator("#link_note").inner_text() == (
            "This link could not set everything: the link was too long to read (15407 bytes; a link to the explorer "
            "is at most 2,048, one the page writes far shorter): check where it came from.")
        assert shown(tab)["query"] == "16,16"  # the default view
        assert tab.locator(".toast-body").all_inner_texts() == [f"Warning\n×\n{app_texts.LINK_WARNING}"]  # no error


def test_each_lesson_runs_end_to_end(shipped_url, chromium):
    """Every lesson, chosen and then stepped through with Next: each step shows its text and the explorer shows
    the step's layer and pixel, with the neighbours the API gives, each numbered inside its cell on a desktop
    (lesson 1's 5 × 5 window on 12-pixel cells had dark rank chips over its cells, and only 11 of its 25 numbers).
    An example picked then is the user's own image: the lesson's text says its step was about the lesson's (it went
    on narrating the image no longer shown)."""
    url, explorer = shipped_url
    with browser_page(chromium, url) as tab:
        tab.get_by_text("Lessons: convolution").click()
        for lesson in explorer.lessons:  # one after another in one page, as a class goes through them
            box = tab.locator("#lesson input")  # its title typed and Enter: the list Gradio opens stays where it
            box.click()  # opened, and a view drawn meanwhile had moved the page (an option outside the viewport, CI)
            box.fill(lesson["title"])
            box.press("Enter")
            for index, step in enumerate(lesson["steps"]):
                if index:
                    tab.locator("#lesson_next").click()
                values = linked_values(explorer, step["link"])
                tab.wait_for_function(
                    "([text, model, layer, query]) => document.querySelector('#lesson_text').innerText.includes(text)"
                    " && document.querySelector('.cx').dataset.model === model"
                    " && document.querySelector('.cx').dataset.layer === layer"
                    " && document.querySelector('.cx').dataset.query === query",
                    arg=[f"Step {index + 1} of {len(lesson['steps'])}", values["query"].checkpoint,
                         values["query"].layer, "{},{}".format(*values["query"].pixel)], timeout=60_000)
                settle(tab)  # the knobs the step resets fetch their table too: the last one drawn is the step's
                rule = dict(parse_qsl(step["link"])).get("rule", "layer")  # a step may name the rule shown large
                cells = api_cells(explorer, values, rule)
                tab.wait_for_function("(cells) => document.querySelector('.cx').dataset.neighbors === cells",
                                      arg=json.dumps(cells, separators=(",", ":")), timeout=20_000)
                numbered = [cell for cell in cells if cell is not None]  # a CLS token has no cell to number
                ranks = f"inside:{len(numbered)}" if len(cells) <= MAX_LABELLED_RANKS else "none"
                assert tab.locator(".cx").get_attribute("data-ranks") == ranks, step["link"]
        last = explorer.lessons[-1]["steps"]
        chain = expect_chain(tab, "select", "examples")  # an image of one's own: the step's words are not about it
        tab.locator("#examples .thumbnail-item").nth(5).click()
        settle(tab, chain)
        assert tab.locator("#lesson_text").inner_text() == app_texts.LESSON_ASIDE.format(
            step=len(last), what="image").replace("**", "")


def test_a_lesson_started_again_shows_its_step_s_pixel_and_rule(shipped_url, chromium):
    """A lesson started again after a click and a rule switch in the page: its first step's table was the one shown,
    so the explorer was not drawn again and stayed on the clicked pixel and the rule picked, while the query boxes,
    the multi-hop view and the step's text were the step's. The explorer shows the step's pixel and rule."""
    url, explorer = shipped_url
    lesson = explorer.lessons[0]
    table = explorer.on_table(**linked_values(explorer, lesson["steps"][0]["link"]))
    step = "document.querySelector('.cx').dataset.query === '16,16' && document.querySelector('.cx').dataset.rule " \
           "=== 'window'"  # the first step's pixel and rule
    with browser_page(chromium, url) as tab:
        tab.get_by_text("Lessons: convolution").click()
        for _ in range(2):
            chain = expect_chain(tab, "input", "lesson")
            tab.locator("#lesson input").click()
            tab.get_by_role("option", name=lesson["title"]).click()
            settle(tab, chain)
            tab.wait_for_function(step, timeout=30_000)
            tab.locator("#explorer .cx-canvas").click(position=pixel_position(tab, table, (5, 7)))
            tab.locator(".cx-rules button", has_text="all tokens").click()
            assert (shown(tab)["query"], shown(tab)["rule"]) == ("5,7", "all")


def test_leaving_the_lesson_list_without_a_pick_keeps_the_step(shipped_url, chromium):
    """The lesson list opened and left without a pick (a click on the lesson's text) keeps the lesson at its step:
    Gradio's list sends its input whenever it loses focus, and that started the lesson again at step 1. Enter on
    the option shown active still starts that lesson, as a click on an option does, and so does Enter after a word
    of a title typed and Escape (the list closed, its active option kept: a phone stayed on the lesson before)."""
    url, explorer = shipped_url
    first, second, third = (lesson_view_of(explorer, index, 0)["text"] for index in (0, 1, 2))
    with browser_page(chromium, url) as tab:
        tab.get_by_text("Lessons: convolution").click()
        chain = expect_chain(tab, "input", "lesson")
        tab.locator("#lesson input").click()
        tab.get_by_role("option", name=explorer.lessons[0]["title"]).click()
        settle(tab, chain)
        assert tab.locator("#lesson_text").inner_text().startswith(first)
        chain = expect_chain(tab, "click", "lesson_next")
        tab.locator("#lesson_next").click()
        settle(tab, chain)
        assert tab.locator("#lesson_text").inner_text().startswith("Step 2 of")
        chain = expect_chain(tab, "input", "lesson")
        tab.locator("#lesson input").click()
        assert tab.get_by_role("option").count() == len(explorer.lessons)  # the list is open
        tab.locator("#lesson_text").click()
        settle(tab, chain)
        assert tab.locator("#lesson_text").inner_text().startswith("Step 2 of")
        chain = expect_chain(tab, "input", "lesson")
        tab.locator("#lesson input").click()
        tab.keyboard.press("ArrowDown")  # from the lesson open to the next
        tab.keyboard.press("Enter")
        settle(tab, chain)
        assert tab.locator("#lesson_text").inner_text().startswith(second)
        assert tab.input_value("#lesson input") == explorer.lessons[1]["title"]
        chain = expect_chain(tab, "input", "lesson")
        box = tab.locator("#lesson input")
        box.click()
        box.press("Control+a")
        box.type(explorer.lessons[2]["title"].split(" · ")[1].split()[0])  # a word of the third lesson's title
        box.press("Escape")
        box.press("Enter")
        settle(tab, chain)
        assert tab.locator("#lesson_text").inner_text().startswith(third)


def lesson_view(tab, words: int) -> dict:
    """What the page shows of a lesson's step: its text's first ``words`` characters, the model list, the card's
    title, the layer list, and the model and layer the explorer draws (the card's accordion open)."""
    return {"text": tab.locator("#lesson_text").inner_text()[:words], "list": tab.input_value(
                "#checkpoint input"), "card": tab.input_value("#card textarea").splitlines()[0],
            "layers": tab.input_value("#layer input"), "model": shown(tab)["model"], "layer": shown(tab)["layer"]}


def lesson_view_of(explorer, lesson: int, step: int) -> dict:
    """:func:`lesson_view` of step ``step`` of lesson ``lesson`` (indices) as the app opens it."""
    steps, query = explorer.lessons[lesson]["steps"], dict(parse_qsl(explorer.lessons[lesson]["steps"][step]["link"]))
    loaded = explorer.model(query["model"])
    words = steps[step]["text"].split("*")[0][:40]  # the step's text up to its first markup
    return {"text": f"Step {step + 1} of {len(steps)}. {words}", "list": dict(
                (name, label) for label, name in explorer.choices([]))[query["model"]],
            "card": an.card_summary(loaded.card).splitlines()[0],
            "layers": an.layer_label(loaded.layer_info(query["layer"])), "model": query["model"],
            "layer": query["layer"]}


QUICK_LESSON_MOVES = {  # the first move and the second (a lesson by its index, or a button), what of the first is held
    #                      (its step's model opened, as if cold, or its explorer's table) and the step to end on
    "lesson-lesson-cold": ("lesson 3", "lesson 0", "card", "cnn-l0", (0, 0)),
    "lesson-lesson-drawing": ("lesson 3", "lesson 0", "table", "cnn-l0", (0, 0)),
    "lesson-next-cold": ("lesson 3", "next", "card", "cnn-l0", (3, 1)),
    "next-back-drawing": ("next", "back", "table", "cnn-l0.5", (3, 0)),
}


@pytest.mark.parametrize("moves", QUICK_LESSON_MOVES)
def test_quick_lesson_moves_end_on_the_last_one(shipped_url, chromium, monkeypatch, moves):
    """A lesson move (a lesson picked, Next or Back; lesson 4: λ = 0, λ = 0.5, λ = 1, one layer name for the three),
    and before its step was shown whole, another move: the page ends on the last move's step everywhere (its text,
    the model list, the card, the layer list and the explorer), not on a mix of the two, nor on the first move's step
    answered late. A lesson picked, then Next: the pick's step, its model loaded cold, came after Next's and put the
    page back on it. Next, then Back: Next's table came after Back's step was drawn, and the explorer showed Next's
    model under Back's step. The server holds the first move's model (as if loaded cold) or its explorer's table
    until the second move is made, and its step shown (and drawn, in a chain of its own) where the page does not hold
    it back (always_last: a lesson picked while the pick before is answered); no time waited. A lesson is picked
    with the keyboard, one event (a click on an option sends two, at once)."""
    url, explorer = shipped_url
    first, second, held, model, last = QUICK_LESSON_MOVES[moves]
    holding, asked, release = (threading.Event() for _ in range(3))
    card_summary, table = an.card_summary, explorer.table

    def hold():  # every call until released
        if holding.is_set():
            asked.set()
            release.wait(60)

    def held_summary(card) -> str:  # the first move's model, opened
        if held == "card" and card.name == model:
            hold()
        return card_summary(card)

    def held_table(query, *args, **kwargs) -> dict:  # the first move's table, for the explorer
        if held == "table" and query.checkpoint == model:
            hold()
        return table(query, *args, **kwargs)

    def move(tab, how: str) -> None:
        if how.startswith("lesson"):
            box = tab.locator("#lesson input")
            box.click()
            box.fill(explorer.lessons[int(how.split()[1])]["title"])
            box.press("Enter")
        else:
            tab.locator(f"#lesson_{how}").click()

    monkeypatch.setattr(an, "card_summary", held_summary)
    monkeypatch.setattr(explorer, "table", held_table)
    want = lesson_view_of(explorer, *last)
    with browser_page(chromium, url) as tab:
        tab.get_by_text("Lessons: convolution").click()
        tab.get_by_text("Model card, or open your own checkpoint").click()  # the card in sight
        rule = None
        if not first.startswith("lesson"):  # on lesson 4's first step, another rule shown large than the step's
            chain = expect_chain(tab, "input", "lesson")
            move(tab, "lesson 3")
            settle(tab, chain)
            rule = shown(tab)["rule"]
            assert shown(tab)["model"] == "cnn-l0" and rule != "all"
            tab.locator(".cx-rules button", has_text="all tokens").click()
            tab.wait_for_function("document.querySelector('.cx').dataset.rule === 'all'")  # until a step's table
            #                                                                                 shows its own again
        same_source = first.split()[0] == second.split()[0]
        chain = expect_chain(tab, "input", "lesson") if second.startswith("lesson") else expect_chain(
            tab, "click", f"lesson_{second}")  # the second move's
        holding.set()
        try:
            move(tab, first)
            assert asked.wait(60)
            move(tab, second)
            if not same_source or held == "table":  # its step shown (and, in a chain of its own, drawn)
                drawn = not same_source and held == "table"
                tab.wait_for_function(
                    "([text, model, rule]) => document.querySelector('#lesson_text').innerText.startsWith(text)"
                    " && (!rule || document.querySelector('.cx').dataset.rule === rule"
                    " && document.querySelector('.cx').dataset.model === model)",
                    arg=[want["text"], want["model"], drawn and rule], timeout=60_000)
        finally:
            release.set()
        tab.wait_for_function("([text, model]) => document.querySelector('#lesson_text').innerText.startsWith(text)"
                              " && document.querySelector('.cx').dataset.model === model",
                              arg=[want["text"], want["model"]], timeout=60_000)
        settle(tab, chain)  # and every answer on its way has come
        assert lesson_view(tab, len(want["text"])) == want
        assert tab.locator(".toast-body").count() == 0


def test_compare_mode_answers_one_click_in_every_column(shipped_url, chromium):
    """Three shipped models side by side (λ = 0, 0.5, 1 at the same depth): a click in the middle column is
    answered in every column, at the same place of the image, with the neighbours the API gives, and nothing
    reaches the server; the explorer's query follows it, so a copied link holds it; a hover previews a pixel in
    every column; the rule buttons switch every column. The columns open at the explorer's layer's depth."""
    url, explorer = shipped_url
    with browser_page(chromium, url) as tab:
        tab.get_by_role("tab", name="Compare models").click()
        tab.wait_for_function("document.querySelector('.cc')?.dataset.columns === '3'", timeout=60_000)
        settle(tab)
        models = explorer.compare_default()
        layers = [tab.locator(f".cc-col:nth-child({i + 1})").get_attribute("data-layer") for i in range(3)]
        loaded = [explorer.model(name) for name in models]
        depth = an.layer_depth(explorer.model(shown(tab)["model"]), shown(tab)["layer"])  # where the explorer is
        assert layers == [an.layer_at_depth(m, depth).name for m in loaded]
        image_file = explorer.examples[0]
        for index, name in enumerate(models):  # each column's prediction, written as the explorer writes one
            best, probability = explorer.on_table(**page(name, image_file, layers[index]))["prediction"][0]
            caption = tab.locator(f".cc-col:nth-child({index + 1})").inner_text()
            assert f"predicts {best} ({100 * probability:.1f}%)" in caption, caption  # was "(86.39 %)" beside 86.4%
        table = explorer.on_table(**page(models[1], image_file, layers[1]))
        requests = []
        tab.on("request", lambda request: requests.append(request.url))
        for px in ((9, 25), (30, 3)):
            tab.locator(".cc-col:nth-child(2) .cc-canvas").click(
                position=pixel_position(tab, table, px, ".cc-col:nth-child(2) .cc-canvas"))
            results = an.compare_neighbors(loaded, explorer.image(image_file), layers, px, source=1)
            for index, result in enumerate(results):
                column = tab.locator(f".cc-col:nth-child({index + 1})")
                assert column.get_attribute("data-model") == models[index]
                assert column.get_attribute("data-query") == f"{px[0]},{px[1]}"
                assert json.loads(column.get_attribute("data-neighbors")) == result.sets["layer"].cells.tolist()
        tab.locator(".cc-col:nth-child(3) .cc-canvas").hover(  # a hover previews its pixel in every column
            position=pixel_position(tab, table, (4, 12), ".cc-col:nth-child(3) .cc-canvas"))
        tab.wait_for_function("[...document.querySelectorAll('.cc-col')].every(c => c.dataset.query === '4,12')")
        tab.locator(".cc-rules button", has_text="window").click()  # leaving returns to the clicked pixel
        assert tab.locator(".cc").get_attribute("data-rule") == "window"
        assert {tab.locator(f".cc-col:nth-child({i + 1})").get_attribute("data-query") for i in range(3)} == {"30,3"}
        for index, result in enumerate(results):
            cells = json.loads(tab.locator(f".cc-col:nth-child({index + 1})").get_attribute("data-neighbors"))
            assert cells == result.sets["window"].cells.tolist()
        assert requests == []  # two clicks, a hover and a rule switch: answered in the page
        assert tab.locator(".cx").get_attribute("data-query") == "30,3"  # the explorer follows the click,
        assert [tab.locator(f"#{box} input").input_value() for box in ("row_px", "col_px")] == ["30", "3"]
        tab.screenshot(path=str(SCREENSHOTS / "compare.png"), full_page=False)
        tab.locator("#link_button").click()  # so that a copied link holds the pixel clicked in a column
        tab.wait_for_function("document.querySelector('#link textarea, #link input').value.includes('compare=')")
        assert "&row=30&col=3&" in tab.locator("#link textarea, #link input").first.input_value()
        settle(tab)  # the link's request answered
        for columns in ("2", "0"):  # down to one model: no stale columns, a note instead
            tab.locator("#compare_models .token-remove").first.click()
            tab.wait_for_function(f"document.querySelector('.cc').dataset.columns === '{columns}'", timeout=30_000)
        assert tab.locator(".cc-note").inner_text() == "Pick 2 to 4 models to compare."
        assert tab.locator(".toast-body").count() == 0
    # A link opens compare mode drawn.
    with browser_page(chromium, f"{url}?image=dog_0&row=3&col=30&tab=compare") as linked:
        linked.wait_for_function("document.querySelector('.cc')?.dataset.columns === '3'", timeout=60_000)
        assert linked.locator(".cc-col:nth-child(1)").get_attribute("data-query") == "3,30"


def test_a_random_candidate_model_shows_its_draws_and_steps_through_them(app_url, explorer, chromium):
    """A link's draw opens that draw: the explorer says it and shows the answer over 16 draws as draw_spread gives
    it; ▶ steps to the next draw and the neighbours shown follow, as the API gives them for that draw. Each wait is
    for a value the page writes once the table arrives (data-draw), never for a time."""
    link = f"model=cnn-random&image=cat_0&layer={CELL_LAYER}&row=10&col=20&draw=2"
    with browser_page(chromium, f"{app_url}?{link}") as tab:
        tab.wait_for_function("document.querySelector('.cx')?.dataset.draw === '2'", timeout=60_000)
        image = explorer.example_paths["cat_0"]
        spread = an.draw_spread(*explorer.loaded(an.Query(checkpoint="cnn-random", image_file=image)))
        shares = json.loads(tab.locator(".cx-spread").get_attribute("data-shares"))
        assert [name for name, _ in shares] == list(spread.shares)
        assert [share for _, share in shares] == pytest.approx(list(spread.shares.values()))
        assert tab.locator("#draw_next").is_visible()
        tab.locator("#draw_next").click()
        tab.wait_for_function("document.querySelector('.cx')?.dataset.draw === '3'", timeout=60_000)
        values = page("cnn-random", image, row_px=10, col_px=20, draw=3)
        assert shown(tab)["query"] == "10,20"  # the query stays; its neighbours are draw 3's
        assert json.loads(shown(tab)["neighbors"]) == api_cells(explorer, values, "layer")


DUPLICATE_IDS_JS = """() => {
  const counts = new Map();
  for (const element of document.querySelectorAll("[id]")) {
    if (element.id && !element.closest(".js-plotly-plot")) counts.set(element.id, (counts.get(element.id) ?? 0) + 1);
  }
  return [...counts].filter(([, count]) => count > 1).map(([id, count]) => `${id} ×${count}`);
}"""  # every id of the page given twice or more, but for those inside a Plotly chart (Gradio copies Plotly's style
#       element, id and all, into each chart, and Plotly's modebar logo is a <g id="symbol"> in each) and Gradio's
#       empty id="" on the layout blocks given no elem_id (an empty id is no id: getElementById("") finds none)


def test_every_element_id_of_the_page_is_unique(app_url, chromium):
    """Gradio 6.31's gr.Group writes its elem_id on two nested elements: `#knobs` matched both (a selector or a
    label's `for` reaches the first only). No id of the page is given twice, with every tab opened in turn."""
    with browser_page(chromium, app_url) as tab:
        assert tab.evaluate(DUPLICATE_IDS_JS) == []
        for label in app_texts.TABS.values():
            tab.get_by_role("tab", name=label).click()
            settle(tab)
            assert tab.evaluate(DUPLICATE_IDS_JS) == [], label
        assert tab.locator(".cc").get_attribute("data-columns")  # compare mode's columns were drawn too


@pytest.mark.parametrize("context", [DESKTOP, PHONE], ids=["1280x800", "390x844"])
def test_compare_mode_s_columns_are_one_width(app_url, chromium, context):
    """Compare mode drew each column's panel as wide as its layer's padding ring made it, the image at one size: a
    CNN, an MHSA and a ConvNN-attention ViT side by side stood in panels of three widths. The columns and their
    panels are one width (within 1 px), at 1280 × 800 and at 390 × 844, the image still at one size in every one."""
    with browser_page(chromium, f"{app_url}?tab=compare&compare=cnn-l0.5,vit-mhsa,vit-convnn", context) as tab:
        tab.wait_for_function("document.querySelector('.cc')?.dataset.columns === '3'", timeout=60_000)
        settle(tab)
        for selector in (".cc-col", ".cc-canvas"):
            widths = [column.bounding_box()["width"] for column in tab.locator(selector).all()]
            assert len(widths) == 3 and max(widths) - min(widths) <= 1, (selector, widths)
        images = [float(width) for width in tab.locator(".cc-col").evaluate_all(
            "columns => columns.map((column) => column.dataset.imageWidth)")]
        assert max(images) - min(images) <= 1 and min(images) > 0, images


OBSERVERS_JS = r"""
(() => {  // every MutationObserver of the page: what it watches (an element's id, "body" or a tag) and its runs
  const Native = window.MutationObserver;
  const observers = window.convnnObservers = [];
  window.MutationObserver = class extends Native {
    constructor(callback) {
      const record = {targets: [], calls: 0};
      super((...args) => { record.calls += 1; return callback(...args); });
      this.record = record;
      observers.push(record);
    }
    observe(target, options) {
      const name = target === document.body ? "body" : target.id || target.nodeName;
      this.record.targets.push(options?.subtree ? `${name} and below` : name);
      return super.observe(target, options);
    }
  };
})();
"""
PAGE_WATCHES = ["examples and below", "layer and below"]  # web/page.js's: the thumbnails' names, the layer's text


def test_a_click_runs_none_of_the_page_s_own_observers(app_url, explorer, chromium):
    """web/page.js watched the page's whole body for the example thumbnails and the layer list, and every click in
    the explorer (which redraws its own elements) ran its observer. It watches those two alone: no observer of the
    page watches the whole body, and clicks and a rule switch in the explorer, answered in the page, run neither of
    page.js's; the thumbnails are still named by their examples and the layer list still shows its choice whole."""
    table = explorer.on_table(**page("cnn-l0.5", explorer.examples[0]))
    with browser_page(chromium, app_url) as tab:
        load = expect_chain(tab, "load")
        tab.add_init_script(OBSERVERS_JS)
        tab.reload()
        tab.wait_for_selector(".cx[data-drawn]", timeout=60_000)
        settle(tab, load)
        watches = tab.evaluate("convnnObservers.map((observer) => observer.targets)")
        assert not [targets for targets in watches if "body and below" in targets], watches
        assert sorted(target for targets in watches for target in targets if target in PAGE_WATCHES) == PAGE_WATCHES
        runs = "convnnObservers.filter((o) => o.targets.some((t) => PAGE.includes(t))).map((o) => o.calls)".replace(
            "PAGE", json.dumps(PAGE_WATCHES))
        before = tab.evaluate(runs)
        for px in ((3, 29), (20, 8), (30, 30)):
            tab.locator("#explorer .cx-canvas").click(position=pixel_position(tab, table, px))
            tab.wait_for_function(f"document.querySelector('.cx').dataset.query === '{px[0]},{px[1]}'")
        tab.locator(".cx-rules button", has_text="all tokens").click()
        assert shown(tab)["rule"] == "all"
        assert tab.evaluate(runs) == before
        stems = [Path(path).stem for path in explorer.examples]
        assert [tab.locator("#examples").get_by_role("button", name=stem, exact=True).count() for stem in stems] == [
            1] * len(stems)
        assert tab.locator("#layer .whole-text").inner_text() == tab.locator("#layer input").input_value()


def test_a_lesson_step_that_opens_a_tab_shows_it(shipped_url, chromium):
    """A lesson's step that opens a tab (lesson 1's last: the equivalence demo) opened it below the explorer, off the
    first screen at 1280 × 800, and the page stayed where it was, while a link that opens a tab shows it
    (test_a_link_that_opens_a_tab_shows_it). Once the step's views are drawn, the tab is in view; a step that names no
    tab leaves the page where it is, and so does Next past the lesson's last step (it opens nothing). A key pressed
    after Next, before the step's views are drawn (its requests held until then), leaves the page where it is: on a
    phone the jump came seconds after the press, while the visitor was reading or picking elsewhere."""
    url, explorer = shipped_url
    lesson = next(lesson for lesson in explorer.lessons if "tab" in dict(parse_qsl(lesson["steps"][-1]["link"])))
    tabs = [dict(parse_qsl(step["link"])).get("tab") for step in lesson["steps"]]
    assert tabs[0] is None  # a step naming no tab first, then the steps up to the last, which names one

    def step(button: str) -> None:
        chain = expect_chain(tab, "click" if button != "lesson" else "input", button)
        if button == "lesson":
            tab.locator("#lesson input").click()
            tab.get_by_role("option", name=lesson["title"]).click()
        else:
            tab.locator(f"#{button}").click()
        settle(tab, chain)

    with browser_page(chromium, url) as tab:
        tab.get_by_text("Lessons: convolution").click()
        step("lesson")
        assert tab.evaluate("window.scrollY") == 0 and not tab.evaluate(TAB_IN_VIEW_JS)
        for index in range(1, len(tabs)):
            tab.evaluate("window.scrollTo(0, 0)")  # Next in sight, as the visitor scrolls back up to it
            step("lesson_next")
            if tabs[index] is None:
                assert tab.evaluate("window.scrollY") == 0 and not tab.evaluate(TAB_IN_VIEW_JS), index
        tab.wait_for_function(TAB_IN_VIEW_JS, timeout=30_000)
        assert tab.get_by_role("tab", name=app_texts.TABS[tabs[-1]]).get_attribute("aria-selected") == "true"
        tab.evaluate("window.scrollTo(0, 0)")
        step("lesson_back")
        tab.evaluate("window.scrollTo(0, 0)")
        joins = HeldJoins(tab)  # the step's requests wait for the key
        chain = expect_chain(tab, "click", "lesson_next")
        tab.locator("#lesson_next").click()
        joins.wait("the step's first request")  # sent after the page noted the inputs so far
        tab.keyboard.press("Shift")
        joins.release()
        settle(tab, chain)
        joins.close()
        assert tab.get_by_role("tab", name=app_texts.TABS[tabs[-1]]).get_attribute("aria-selected") == "true"
        assert tab.evaluate("window.scrollY") == 0 and not tab.evaluate(TAB_IN_VIEW_JS)
        step("lesson_next")  # past the last step: its text stays, nothing opens
        assert tab.evaluate("window.scrollY") == 0 and not tab.evaluate(TAB_IN_VIEW_JS)
