"""What the explorer shows, as one value: a :class:`Query` (model, image, fit, layer, clicked pixel and the rule
knobs: all a neighbour table is made from) inside a :class:`ViewState` (with the open tab, compare mode's models and
depth, and the rule shown large).

Each field is declared once, here, with its default and how it is set (:class:`Setting`): its key in a link, the
kind of its text there, and, for a number, its control's label and bounds. The app builds its controls from these
settings, reads the page's inputs into a :class:`Query` by field name (each field is named as its control's
``elem_id``), and :mod:`analysis.session.links` writes and reads links from the same fields; so a new knob is one
field here, and the page, the link and the API carry it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

from .image_display import clamp_px
from .inputs import KNOB_NAMES, real_number, whole_number
from .selections import RuleOptions
from .traces import MAX_DRAW

__all__ = ["MAX_COMPARED", "MAX_DRAW", "Query", "Setting", "ViewState", "check_number", "compare_list", "field_values",
           "knob", "knob_names", "setting", "settings"]

MAX_COMPARED = 4  # compare mode's columns at most


@dataclass(frozen=True)
class Setting:
    """How one field of the view is set.

    Attributes:
        link (str, optional): its key in a link; None: a link does not carry it.
        kind (str): the kind of its text in a link: ``"text"`` (a name), ``"names"`` (names separated by commas),
            ``"whole"`` (a whole number) or ``"real"`` (a finite number).
        label (str): its control's label, which the control's and the link's messages name. Default: ""
        info (str): its control's hint under the label (what 0 means). Default: ""
        minimum, maximum (float, optional): its control's inclusive bounds (numbers). Default: none
        step (float, optional): a slider's step; None: a number box. Default: None
        visible (bool): whether its control is shown before a model asks for it. Default: True
        is_knob (bool): a rule knob (what a selection reads): 0 or α = 0.5 mean "as the layer does", and a link
            leaves it out at its default. Default: False
    """

    link: str | None
    kind: str
    label: str = ""
    info: str = ""
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    visible: bool = True
    is_knob: bool = False


def setting(default: object, link: str | None, kind: str, **control) -> dataclasses.Field:
    """A dataclass field of the view with its default and :class:`Setting` (``control``: its other attributes)."""
    return field(default=default, metadata={"setting": Setting(link, kind, **control)})


def knob(default: object, link: str, label: str, kind: str = "whole", minimum: float | None = 0, **control
         ) -> dataclasses.Field:
    """A rule knob's field (:func:`setting` with ``is_knob``): a number box from ``minimum`` up (None: no bound of its
    own, the layer's range checks it), or a slider."""
    return setting(default, link, kind, label=label, minimum=minimum, is_knob=True, **control)


@dataclass(frozen=True)
class Query:
    """All a neighbour table is made from, as the page's controls hold it (each field is named as its control's
    ``elem_id``). 0 for K, R, r or the seed means the layer's own (:meth:`options`).

    Attributes:
        checkpoint (str, optional): the model, as the model list names it. Default: None
        image_file (str, optional): the image's path (an example or an upload). Default: None
        layer (str, optional): the layer's name. Default: None
        row_px, col_px (int): the clicked pixel of the model input. Default: 16
        num_neighbors, window_size, num_candidates, seed (int): K, R, r and the random rule's seed. Default: 0
        blend_alpha (float): α of the blend rule. Default: 0.5
        head (int): the attention head. Default: 0
        fit (str): how a photo that is not square is made square (:data:`analysis.FITS`). Default: "crop"
        draw (int): the eval draw of a model with random candidates (METHOD §3b): the forward pass every view of the
            image shows, from the table and the prediction to the attribution. Its control shows for such a model
            only (any other computes the same in every draw). Default: 0
    """

    checkpoint: str | None = setting(None, "model", "text")
    image_file: str | None = setting(None, "image", "text")
    layer: str | None = setting(None, "layer", "text")
    row_px: int = setting(16, "row", "whole", label="query row (px)", minimum=0)
    col_px: int = setting(16, "col", "whole", label="query col (px)", minimum=0)
    num_neighbors: int = knob(0, "k", KNOB_NAMES["num_neighbors"], info="0 = the layer's",
                              minimum=None)  # 1 to the layer's H·W: resolve_options
    window_size: int = knob(0, "window", KNOB_NAMES["window_size"], info="0 = auto")
    num_candidates: int = knob(0, "r", KNOB_NAMES["num_candidates"], info="0 = the layer's, or 32")
    seed: int = knob(0, "seed", "seed", info="0 = the layer's")
    blend_alpha: float = knob(0.5, "alpha", KNOB_NAMES["blend_alpha"], "real", info="0 = window, 1 = features",
                              maximum=1, step=0.05)
    head: int = knob(0, "head", KNOB_NAMES["head"], visible=False)
    fit: str = setting("crop", None, "text")
    draw: int = knob(0, "draw", KNOB_NAMES["draw"], maximum=MAX_DRAW, visible=False)

    @property
    def pixel(self) -> tuple[int, int]:
        """The clicked pixel ``(row_px, col_px)``, checked: whole numbers (a page or an API call may send anything).

        Raises:
            ValueError: not whole numbers; the message names the query row or col.
        """
        return whole_number(self.row_px, "query row"), whole_number(self.col_px, "query col")

    def at(self, pixel: tuple[int, int], size: int | None = None) -> Query:
        """This query at ``pixel`` (``(row_px, col_px)``), moved to the nearest pixel of a ``size`` × ``size`` model
        input when ``size`` is given (:func:`analysis.clamp_px`): a query kept across a change of model stays valid.

        Raises:
            TypeError: ``pixel`` is not a pair of numbers.
        """
        row_px, col_px = clamp_px(pixel, size, size) if size is not None else pixel
        return dataclasses.replace(self, row_px=row_px, col_px=col_px)

    def options(self) -> RuleOptions:
        """The rule knobs as :class:`analysis.RuleOptions` (:meth:`RuleOptions.from_ui`: 0 = the layer's own).

        Raises:
            ValueError: K, R or r not a whole finite number ≥ 0.
        """
        return RuleOptions.from_ui(self.num_neighbors, self.window_size, self.num_candidates, self.seed,
                                   self.blend_alpha, self.head)


@dataclass(frozen=True)
class ViewState:
    """The whole view a link restores: the :class:`Query`, the open tab, compare mode's models and depth, and the
    rule shown large (None: as the page has it).

    Attributes:
        query (Query): what the explorer shows. Default: ``Query()``
        tab (str, optional): the open tab's id. Default: None
        compare_models (tuple[str, ...], optional): compare mode's models. Default: None
        compare_depth (float): compare mode's depth, the fraction of the way through each model. Default: 0.5
        rule (str, optional): the rule shown large. Default: None
    """

    query: Query = field(default_factory=Query)
    tab: str | None = setting(None, "tab", "text")
    compare_models: tuple[str, ...] | None = setting(None, "compare", "names")
    compare_depth: float = setting(0.5, "depth", "real", label="depth: how far through each model", minimum=0,
                                   maximum=1, step=0.05)
    rule: str | None = setting(None, "rule", "text")


def settings(value: Query | ViewState | type) -> Iterator[tuple[dataclasses.Field, Setting]]:
    """Each field of a :class:`Query` or :class:`ViewState` (an instance or the class, a subclass's own fields
    included) with its :class:`Setting`, in declaration order; a view state's query's fields come first."""
    for item in dataclasses.fields(value):
        if item.name == "query":
            query = value.query if not isinstance(value, type) else item.default_factory()
            yield from settings(query)
        else:
            yield item, item.metadata["setting"]


def field_values(state: ViewState) -> dict[str, object]:
    """Every field of ``state`` by name, its query's first (the order of :func:`settings`)."""
    query = {item.name: getattr(state.query, item.name) for item in dataclasses.fields(state.query)}
    return query | {item.name: getattr(state, item.name) for item in dataclasses.fields(state) if item.name != "query"}


def knob_names(query: Query | type = Query) -> list[str]:
    """The names of the rule knobs of ``query`` (what a selection reads), in order."""
    return [item.name for item, how in settings(query) if how.is_knob]


def check_number(value: object, how: Setting) -> int | float:
    """``value`` checked as the control of ``how`` checks it: a whole or a finite number within its bounds.

    Raises:
        ValueError: anything else; the message names the control's label and the value.
    """
    check = whole_number if how.kind == "whole" else real_number
    return check(value, how.label, how.minimum, how.maximum)


def compare_list(checkpoints: object) -> list:
    """``checkpoints`` if it can be compare mode's list: a list of 2 to :data:`MAX_COMPARED` different entries (what
    its model list lets a user pick; each entry is checked as a model when it is loaded).

    Raises:
        ValueError: anything else, with the message the page shows.
    """
    if (not isinstance(checkpoints, list) or not 2 <= len(checkpoints) <= MAX_COMPARED
            or len({repr(checkpoint) for checkpoint in checkpoints}) != len(checkpoints)):
        raise ValueError(f"Pick 2 to {MAX_COMPARED} models to compare, each once.")
    return checkpoints
