"""Event chains' steps: which views share a step (server.step_groups) and one step that runs several (server.merge)."""

from __future__ import annotations

import gradio as gr
import pytest

import app
import server

TABLE = {  # name → (handler, inputs, outputs)
    "first": ("on_first", ["image", "layer"], ["explorer"]),
    "plots": ("on_plots", ["image", "layer"], ["plot", "note"]),
    "query": ("on_query", ["image", "row"], ["row"]),  # writes what "pixels" reads
    "pixels": ("on_pixels", ["image", "row"], ["pixel_plot"]),
    "reset": ("on_reset", [], ["slow_plot"]),
    "after": ("on_after", ["layer"], ["after_plot"]),
}


def test_views_share_a_step_unless_one_reads_what_the_step_writes_or_stands_alone():
    assert server.step_groups(["first", "plots", "query", "pixels"], TABLE) == [["first", "plots", "query"],
                                                                                 ["pixels"]]
    assert server.step_groups(["plots", "reset", "after", "first"], TABLE, alone={"reset"}) == [
        ["plots"], ["reset"], ["after", "first"]]
    assert server.step_groups(["first", "plots"], TABLE, alone={"first"}) == [["first"], ["plots"]]
    assert server.step_groups([], TABLE) == []


def test_the_page_load_runs_the_explorer_first_then_its_views_in_fewer_steps_in_the_same_order():
    """Twelve views after the link, one round trip each, were twelve steps; the explorer's first render keeps its own
    step (what the page shows first), no step reads what its own views write, and every view runs once, in the
    refresh table's order."""
    views = app.REFRESH[("demo", "load")][1:]
    groups = server.step_groups(views, app.VIEWS, alone=app.ALONE)
    assert groups[0] == ["first_render"] and ["slow_reset"] in groups
    assert [view for group in groups for view in group] == views
    assert len(groups) == 6 < len(views) == 11
    for group in groups:
        written = set()
        for view in group:
            _, inputs, outputs = app.VIEWS[view]
            assert not written & set(inputs), (group, view)
            written |= set(outputs)


def components(*names):
    return {name: gr.Textbox(elem_id=name) for name in names}


def test_one_step_calls_each_view_with_its_own_inputs_and_returns_every_output_by_component():
    ui = components("a", "b", "x", "y", "z")
    calls = []

    def one(values, request):  # a view of one output: its value
        calls.append(("one", {block.elem_id: value for block, value in values.items()}, request))
        return "x=" + values[ui["a"]]

    def two(values, request):  # a view of several outputs: a dict by component
        calls.append(("two", {block.elem_id: value for block, value in values.items()}, request))
        return {ui["y"]: values[ui["b"]] + "!", ui["z"]: 3}

    step = server.merge([{"fn": one, "inputs": {ui["a"]}, "outputs": [ui["x"]]},
                         {"fn": two, "inputs": {ui["a"], ui["b"]}, "outputs": [ui["y"], ui["z"]]}])
    assert step["inputs"] == {ui["a"], ui["b"]} and step["outputs"] == [ui["x"], ui["y"], ui["z"]]
    assert list(step["fn"].__signature__.parameters) == ["values", "request"]
    result = step["fn"]({ui["a"]: "1", ui["b"]: "2"}, "req")
    assert result == {ui["x"]: "x=1", ui["y"]: "2!", ui["z"]: 3}
    assert calls == [("one", {"a": "1"}, "req"), ("two", {"a": "1", "b": "2"}, "req")]


def test_a_views_skip_keeps_each_of_its_outputs_and_an_error_ends_the_step():
    ui = components("a", "x", "y", "z")
    skipped = {"fn": lambda values, request: gr.skip(), "inputs": {ui["a"]}, "outputs": [ui["x"], ui["y"]]}
    no_inputs = {"fn": lambda request: "z", "inputs": None, "outputs": [ui["z"]]}
    step = server.merge([skipped, no_inputs])
    assert step["fn"]({ui["a"]: "1"}, None) == {ui["x"]: gr.skip(), ui["y"]: gr.skip(), ui["z"]: "z"}

    def refused(values, request):
        raise gr.Error("no")

    failing = server.merge([{"fn": refused, "inputs": {ui["a"]}, "outputs": [ui["x"]]}, no_inputs])
    with pytest.raises(gr.Error):
        failing["fn"]({ui["a"]: "1"}, None)
    alone = server.merge([no_inputs, {"fn": lambda request: 1, "inputs": None, "outputs": [ui["y"]]}])
    assert alone["inputs"] is None and list(alone["fn"].__signature__.parameters) == ["request"]
    assert alone["fn"](None) == {ui["z"]: "z", ui["y"]: 1}


def test_steps_that_write_one_component_or_a_coroutine_are_not_merged():
    ui = components("a", "x")
    step = {"fn": lambda values, request: 1, "inputs": {ui["a"]}, "outputs": [ui["x"]]}
    with pytest.raises(ValueError, match="different components"):
        server.merge([step, step])

    async def reset(request):
        return None

    with pytest.raises(ValueError, match="coroutine"):
        server.merge([step, {"fn": reset, "inputs": None, "outputs": [gr.Textbox()]}])
