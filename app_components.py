"""The page's in-page views as Gradio component classes (Gradio 6's "Component Classes": a ``gr.HTML`` subclass
bundling its template, CSS and ``js_on_load``, its state in ``props``).

Each view is drawn in the browser by ``web/panel.js`` (the drawing library: pure functions of a canvas, a table and
a query) followed by its own script, from the value the server sends it; a click is answered there. The views share
no variable: the query lives in the query row/col boxes, whose ``elem_id``\\ s each view is given (it reads the
query there, writes a click there and redraws when it changes there). A view asks the server for something with one
named event per purpose (its class says which), answered with its own value.

What a view is given at construction (those ``elem_id``\\ s) is written into its template as ``data-*``
attributes of its root element, which its script reads, rather than passed as props: Gradio 6.31 replaces an HTML
component's props with the keys of any update it receives that are not constructor arguments (``gr.skip()`` sends
``{"__type__": "update"}``, so compare mode's skip while its tab is closed left it, mounted later, without them).
"""

from __future__ import annotations

import functools
import html
from collections.abc import Mapping, Sequence

import gradio as gr

from app_api import WEB_DIR

__all__ = ["CompareView", "ExplorerView", "HopsView", "PageView"]

QUERY_BOXES = ("row_px", "col_px")  # the elem_ids of the query's row and col boxes (analysis.Query's fields)


@functools.cache
def web_file(name: str) -> str:
    """A file of the page's own JavaScript or CSS, from the ``web/`` folder beside this file."""
    return (WEB_DIR / name).read_text(encoding="utf-8")


class PageView(gr.HTML):
    """A view drawn in the page: ``<div class="ROOT" data-query-boxes="ROW COL" …>`` filled by ``web/panel.js`` +
    ``web/SCRIPT``, styled by ``web/explorer.css`` (scoped to the view by Gradio).

    Args:
        value (dict, optional): what the server sends the view (a subclass says what). Default: None
        query_boxes (Sequence[str]): the ``elem_id`` of the query's row box and of its col box. Default: QUERY_BOXES
        data (Mapping[str, str], optional): more ``data-*`` attributes of the root element, for the view's script.
        **kwargs: ``gr.HTML``'s other arguments (``elem_id``, ``visible``…).
    """

    ROOT = ""  # the class of the view's root element
    SCRIPT = ""  # its script, after web/panel.js

    def __init__(self, value: dict | None = None, *, query_boxes: Sequence[str] = QUERY_BOXES,
                 data: Mapping[str, str] | None = None, **kwargs) -> None:
        attributes = {"query-boxes": " ".join(query_boxes), **(data or {})}
        root = " ".join([f'class="{self.ROOT}"', *(f'data-{name}="{html.escape(text)}"'
                                                   for name, text in attributes.items())])
        super().__init__(value, html_template=f"<div {root}></div>", css_template=web_file("explorer.css"),
                         js_on_load=web_file("panel.js") + web_file(self.SCRIPT), padding=False, **kwargs)


class ExplorerView(PageView):
    """The explorer: the table of one (model, image, layer, rule knobs), every query's neighbours under every rule
    (:func:`analysis.page_table`), drawn large with the statistics, the prediction and small multiples.

    Its value is a table, or the α animation's frames for the table shown (:func:`analysis.page_sweep`). Its named
    events: ``row`` (a K above the table's bound: the clicked query's row, ``evt.index`` its pixel), answered with a
    table, ``sweep`` (▶ α pressed), answered with the frames, and ``view`` (what it draws, as a link names it,
    changed), answered in the page only (a copied link is cleared: ``app_texts.CLEAR_LINK_JS``). A table a link or a
    lesson's step opens names the rule to show large (its ``focus_rule``, new at each opening).
    """

    ROOT = "cx"
    SCRIPT = "explorer.js"


class CompareView(PageView):
    """Compare mode: 2–4 models' tables in columns (``columns``, each an :func:`analysis.page_table`), at the query
    of the boxes, given in a ``query_size`` × ``query_size`` input (the explorer's model's); ``note`` instead of
    columns when fewer than 2 models are picked. It asks the server for nothing."""

    ROOT = "cc"
    SCRIPT = "compare.js"


class HopsView(PageView):
    """The multi-hop view: the receptive fields of the query cells of a layer (:func:`analysis.page_hops`). Its
    named event ``field`` (a query whose field its value does not hold: ``evt.index`` its pixel) is answered with
    that query's field."""

    ROOT = "cx-hops"
    SCRIPT = "hops.js"
