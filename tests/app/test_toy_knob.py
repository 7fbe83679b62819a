"""A new knob is one field: a toy knob declared on a Query subclass (one field, with its control's setting and its
link key) gets a control on the page, a refresh of the table, a key in links and a parameter of the API, with no other
change to the app."""

from __future__ import annotations

import inspect
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gradio.utils import get_upload_folder

import analysis as an
import app
from analysis.session.state import knob
from app_api import endpoint
from server import CheckedNumber
from tests.app.test_app import CELL_LAYER, blocks_by_id, chain_steps


@dataclass(frozen=True)
class ToyQuery(an.Query):
    toy: int = knob(0, "toy", "toy knob (0 = off)", maximum=9)  # the one field


@dataclass(frozen=True)
class ToyState(an.ViewState):
    query: ToyQuery = field(default_factory=ToyQuery)


class ToyExplorer(app.Explorer):
    """The explorer on the toy view; it keeps each query its model and image are resolved for."""

    state_type = ToyState

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.queries: list[an.Query] = []

    def loaded(self, query, request=None):
        self.queries.append(query)
        return super().loaded(query, request)


@pytest.fixture(scope="module")
def toy(checkpoint_dir) -> ToyExplorer:
    return ToyExplorer(checkpoint_dir, device="cpu")


def page_values(example_image: Path, **changed) -> dict:
    """What the page's controls hold, by elem_id: the toy view's query on the small hybrid model."""
    query = ToyQuery(checkpoint="cnn-l0.5", image_file=str(example_image), layer=CELL_LAYER, row_px=10, col_px=20)
    return {item.name: getattr(query, item.name) for item, _ in an.settings(query)} | changed


def test_a_toy_knob_gets_a_control_and_the_table_is_redrawn_with_it(toy, explorer, example_image):
    demo = app.build_demo(toy)
    blocks = blocks_by_id(demo)
    control = blocks["toy"]
    assert isinstance(control, CheckedNumber)
    assert (control.label, control.value, control.minimum, control.maximum) == ("toy knob (0 = off)", 0, 0, 9)
    assert app.refresh_table(ToyState)[("toy", "blur")] == ["table"]
    assert ("toy", "blur") not in app.REFRESH  # the explorer's own view has no toy
    step = chain_steps(demo, control, "blur")[0]
    assert step.name == "on_table"
    values = page_values(example_image, toy=3)
    toy.queries.clear()
    read = {source: name for name, source in app.READ_OPENED.items()}  # the model: the one opened
    table = step.fn({block: values[read.get(block.elem_id, block.elem_id)] for block in step.inputs}, None)
    assert toy.queries == [ToyQuery(**page_values(example_image, toy=3))]
    plain = {name: value for name, value in values.items() if name != "toy"}
    assert table == explorer.on_table(an.Query(**plain))  # the toy selects nothing: the explorer's own table
    assert "toy" in app.link_outputs(ToyState) and "toy" not in app.link_outputs()


def test_a_toy_knob_travels_in_a_link(toy, example_image):
    assert an.link_fields(ToyState)["toy"] == "whole" and "toy" not in an.LINK_FIELDS
    state = ToyState(query=ToyQuery(**page_values(example_image, toy=3)))
    link = toy.on_link_copy(state)["link"]
    assert "&toy=3" in link
    assert "toy" not in toy.on_link_copy(ToyState(query=ToyQuery(**page_values(example_image))))["link"]
    opened = toy.view(dict(pair.split("=") for pair in link.split("&")), ToyState())
    assert opened["toy"] == 3 and opened["link_note"] == ""
    refused = toy.view({"model": "cnn-l0.5", "toy": "12"}, ToyState())
    assert refused["toy"] == 0 and "the link's toy:" in refused["link_note"]


def test_a_toy_knob_is_a_parameter_of_the_api(toy, example_image):
    call = endpoint(toy.api_neighbors, ToyState)
    parameters = inspect.signature(call).parameters
    assert list(parameters)[-4:] == ["fit", "draw", "toy", "request"]  # after the explorer's own fields
    assert (parameters["toy"].annotation, parameters["toy"].default) == (int, 0)
    assert "toy" not in inspect.signature(endpoint(toy.api_neighbors)).parameters
    stored = Path(get_upload_folder()) / "toy-knob-test" / "cat_0.png"  # an upload in Gradio's cache
    stored.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(example_image, stored)
    toy.queries.clear()
    record = call("cnn-l0.5", {"path": str(stored)}, CELL_LAYER, 10, 20, toy=4)
    assert record["query"]["row_px"] == 10
    assert toy.queries == [ToyQuery(**page_values(stored.resolve(), toy=4))]
