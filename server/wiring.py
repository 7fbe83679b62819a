"""The page's events as the explorer's handlers take them (:func:`wire`): each input by the ``elem_id`` of its
component, what the explorer shows gathered into one :class:`analysis.Query` or :class:`analysis.ViewState`; and an
event chain's views in as few steps as their inputs allow (:func:`step_groups`, :func:`merge`).

Gradio's private parts this module touches are listed in :data:`GRADIO_PRIVATE`, right below the imports
(``tests/server/test_gradio_private.py`` checks each on the installed Gradio; ``requirements.txt`` pins Gradio to
the minor versions it passed on).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence

import gradio as gr

import analysis as an

__all__ = ["GRADIO_PRIVATE", "merge", "step_groups", "wire"]

GRADIO_PRIVATE = {
    "Block._id": "a component's id: the key of its value in a set of inputs' values (wire)",
}


def wire(handlers: object, ui: Mapping[str, gr.components.Component], fn_name: str, inputs: Sequence[str],
         outputs: Sequence[str], state_type: type = an.ViewState, read: Mapping[str, str] | None = None) -> dict:
    """The ``fn``, ``inputs`` and ``outputs`` keywords of a Gradio event.

    ``fn`` calls the method ``fn_name`` of ``handlers`` with each input value as the keyword of its component's name
    in ``ui`` (its ``elem_id``), those of the view gathered in one place: a query (``state_type``'s query class) of the
    inputs among its fields as ``query`` (its other fields at their defaults), and that query in a ``state_type``
    with the inputs among its own fields (tab, compare mode's models and depth) as ``state``; plus the request and,
    if it takes them, the event data (``evt``) and Gradio's progress tracker (``progress``). Gradio passes inputs
    given as a set as one ``{component: value}`` dict; a handler of several outputs returns ``{name: value}``.

    Args:
        handlers (object): the page's handlers (``app.Explorer``).
        ui (Mapping[str, gr.components.Component]): the page's components by ``elem_id``.
        fn_name (str): the handler's method name.
        inputs, outputs (Sequence[str]): the names in ``ui`` of its inputs and outputs.
        state_type (type): the view's class (:class:`analysis.ViewState` or a subclass). Default: ViewState
        read (Mapping[str, str], optional): inputs whose value comes from another component: an input's name → the
            name in ``ui`` of the component read for it (the handler still takes it under the input's name).

    Raises:
        AttributeError: ``handlers`` has no method ``fn_name``.
        KeyError: a name not in ``ui``.
    """
    fn: Callable = getattr(handlers, fn_name)
    params = inspect.signature(fn).parameters
    extra = [p for p in ("evt", "progress") if p in params]
    read = {name: (read or {}).get(name, name) for name in inputs}
    names = {ui[source]._id: name for name, source in read.items()}
    query_type = type(state_type().query)
    in_query = {item.name for item in dataclasses.fields(query_type)}
    in_state = {item.name for item in dataclasses.fields(state_type)} - {"query"}

    def handler(*args):
        values, request, *special = args if inputs else ({}, *args)
        kwargs = dict(zip(extra, special, strict=True))
        page = {names[block._id]: value for block, value in values.items()}
        if "query" in params or "state" in params:
            query = query_type(**{name: page.pop(name) for name in in_query if name in page})
            if "state" in params:
                query = state_type(query=query, **{name: page.pop(name) for name in in_state if name in page})
            page["query" if "query" in params else "state"] = query
        result = fn(**page, request=request, **kwargs)
        return {ui[name]: value for name, value in result.items()} if len(outputs) > 1 else result

    annotations = {"values": dict, "request": gr.Request, "evt": gr.EventData, "progress": gr.Progress}
    order = (["values"] if inputs else []) + ["request", *extra]
    handler.__signature__ = inspect.Signature([
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotations[name],
                          default=gr.Progress() if name == "progress" else inspect.Parameter.empty)
        for name in order])
    handler.__annotations__ = {name: annotations[name] for name in order}  # Gradio reads the special ones here
    handler.__name__ = fn_name
    return {"fn": handler, "inputs": {ui[source] for source in read.values()} or None,
            "outputs": [ui[name] for name in outputs]}


def step_groups(views: Sequence[str], table: Mapping[str, tuple], alone: Collection[str] = ()) -> list[list[str]]:
    """``views`` (names in ``table``: name → (handler name, inputs, outputs)), in order, as the steps of an event
    chain: consecutive views share a step (:func:`merge`) unless one reads what another of the step writes (the page
    sends a step's inputs as they are when the step is sent) or is in ``alone``. Each step is a round trip between
    the page and the server: a page load's twelve views took twelve, about 0.1 s each of the page's own work on a
    desktop, a network round trip each on a phone.
    """
    groups: list[list[str]] = []
    written: set[str] = set()
    for view in views:
        _, inputs, outputs = table[view]
        if not groups or view in alone or groups[-1][-1] in alone or written & set(inputs):
            groups.append([])
            written = set()
        groups[-1].append(view)
        written |= set(outputs)
    return groups


def merge(steps: Sequence[dict]) -> dict:
    """Several events' ``fn``, ``inputs`` and ``outputs`` keywords (:func:`wire`'s, each handler taking its inputs'
    ``{component: value}`` and the request) as one event's: its handler calls each in turn with its own inputs' values
    and returns every output by component. A handler's ``gr.skip()`` (or any one update) for several outputs applies
    to each of them. An error raised by one ends the whole step, as it ended the chain.

    Raises:
        ValueError: two steps write the same component, or a handler takes more than its inputs and the request.
    """
    outputs = [component for step in steps for component in step["outputs"]]
    if len(set(map(id, outputs))) != len(outputs):
        raise ValueError("merged steps must write different components")
    for step in steps:
        if len(inspect.signature(step["fn"]).parameters) != (2 if step["inputs"] else 1) or \
                inspect.iscoroutinefunction(step["fn"]):
            raise ValueError(f"{step['fn'].__name__} is a coroutine or takes more than its inputs and the request")
    inputs = set().union(*(step["inputs"] or set() for step in steps))

    def handler(*args):
        values, request = args if inputs else ({}, *args)
        result = {}
        for step in steps:
            reads, mine = step["inputs"], step["outputs"]
            answer = step["fn"]({block: values[block] for block in reads}, request) if reads else step["fn"](request)
            if len(mine) == 1:
                result[mine[0]] = answer
            elif isinstance(answer, dict) and all(isinstance(key, gr.components.Component) for key in answer):
                result.update(answer)
            else:  # one update for all of them
                result.update(dict.fromkeys(mine, answer))
        return result

    order = {"values": dict, "request": gr.Request} if inputs else {"request": gr.Request}
    handler.__signature__ = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                                 annotation=kind) for name, kind in order.items()])
    handler.__annotations__ = order
    handler.__name__ = "+".join(step["fn"].__name__ for step in steps)
    return {"fn": handler, "inputs": inputs or None, "outputs": outputs}
