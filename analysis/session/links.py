"""A view of the explorer as a link: its state in a URL's query string (README, "Teaching with ConvNN Explorer").

A link names a shipped model, an example image, a layer, the clicked pixel, the rule knobs, a tab and the rule shown
large, and compare mode's models and depth, e.g.
``?model=cnn-l0.5&image=cat_0&layer=stages.1.0.conv1&row=10&col=20&k=9&tab=spectrum`` or
``…&tab=compare&compare=cnn-l0,cnn-l0.5,cnn-l1&depth=0.25``. This module reads and
writes the text only: each value has the type its field needs or is refused with a message; whether a model, a
layer or a pixel exists, and the bounds of each number, are checked by the page exactly as it checks its controls.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlencode

__all__ = ["LINK_FIELDS", "echo", "link_query", "parse_link"]

# key → its kind: "text" (a name), "names" (names separated by commas), "whole" (a whole number), "real" (a finite
# number); the query string's order.
LINK_FIELDS = {"model": "text", "image": "text", "layer": "text", "row": "whole", "col": "whole", "k": "whole",
               "window": "whole", "r": "whole", "seed": "whole", "alpha": "real", "head": "whole", "tab": "text",
               "compare": "names", "depth": "real", "rule": "text"}
MAX_VALUE_CHARS = 120  # a longer value is refused unread (names here are short; a link is typed or pasted)
_TEXT = re.compile(r"[A-Za-z0-9_.:\-]+")  # model stems, example names, layer paths, tab names
_NAMES = re.compile(r"[A-Za-z0-9_.:\-]+(,[A-Za-z0-9_.:\-]+)*")  # compare mode's models
_WHOLE = re.compile(r"[+-]?\d{1,19}")  # a seed may be as large as 2**63 − 1
_REAL = re.compile(r"[+-]?(\d{1,12}(\.\d{0,17})?|\.\d{1,17})([eE][+-]?\d{1,3})?")  # what repr(float) writes
_IGNORED = re.compile(r"__.*|utm_.*|fbclid|gclid|view")  # Gradio's own (__theme, view=api) and trackers' fields
_KINDS = {  # kind → (the text it accepts, what the message calls it, the value read from that text)
    "text": (_TEXT, "a name", str),
    "names": (_NAMES, "names separated by commas", lambda text: text.split(",")),
    "whole": (_WHOLE, "a whole number", int),
    "real": (_REAL, "a number", float),
}


def parse_link(params: Mapping[str, object]) -> tuple[dict[str, str | int | float | list[str]], list[str]]:
    """The fields of a link's query string, each as its kind (:data:`LINK_FIELDS`), and a message per value refused.

    Args:
        params (Mapping[str, object]): the query parameters, name → value (what ``request.query_params`` holds;
            any values, e.g. from a hand-edited URL).

    Returns:
        tuple[dict, list[str]]: the fields read (``{"model": "cnn-l0.5", "row": 10, "alpha": 0.25, "compare":
        ["cnn-l0", "cnn-l1"], …}``, absent fields left out) and, for each unknown name or unreadable value, a
        message naming it. The messages are shown as markup in the page: a name or value is echoed
        (:func:`echo`) only when it is plain (letters, digits, ``_.:-``, at most 40 characters), as a code span;
        anything else is described, not shown. Gradio's own fields (``__theme``, ``view``) and trackers'
        (``utm_*``, ``fbclid``, ``gclid``) are passed over.
    """
    values: dict[str, str | int | float | list[str]] = {}
    problems: list[str] = []
    for name, raw in params.items():
        kind = LINK_FIELDS.get(name)
        if kind is None and isinstance(name, str) and _IGNORED.fullmatch(name):
            continue
        if kind is None:
            problems.append(f"the link's {echo(name)} is not something a link sets (it can set: "
                            f"{', '.join(LINK_FIELDS)})")
            continue
        text = raw if isinstance(raw, str) else ""
        pattern, what, read = _KINDS[kind]
        if len(text) > MAX_VALUE_CHARS or not pattern.fullmatch(text):
            problems.append(f"the link's {name} must be {what}, got {echo(text)}")
            continue
        values[name] = read(text)
    return values, problems


def echo(text: object) -> str:
    """``text`` as a code span of page markup (nothing in it renders), if it is a plain name of at most 40
    characters; else a description of it."""
    if isinstance(text, str) and len(text) <= 40 and (text == "" or _TEXT.fullmatch(text)):
        return f"`{text}`"
    return "a value not shown (not a plain name or number)"


def link_query(values: Mapping[str, object]) -> str:
    """The query string of a view (no leading ``?``): the fields of :data:`LINK_FIELDS` that ``values`` holds and
    that are not None, in that order (a list of names joined by commas); :func:`parse_link` reads it back to the
    same values."""
    fields = [(name, values[name]) for name in LINK_FIELDS if values.get(name) is not None]
    return urlencode([(name, ",".join(value) if isinstance(value, list) else value) for name, value in fields],
                     safe=",")
