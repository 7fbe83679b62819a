"""A view of the explorer as a link: its state in a URL's query string (README, "Teaching with ConvNN Explorer").

A link names a shipped model, an example image, a layer, the clicked pixel, the rule knobs, a tab and the rule shown
large, and compare mode's models and depth, e.g.
``?model=cnn-l0.5&image=cat_0&layer=stages.1.0.conv1&row=10&col=20&k=9&tab=spectrum`` or
``…&tab=compare&compare=cnn-l0,cnn-l0.5,cnn-l1&depth=0.25``. This module reads and
writes the text of a :class:`~analysis.session.state.ViewState` from its fields' settings (:func:`parse_link`,
:func:`write_link`): each value has the type its field needs or is refused with a message. :func:`open_link` is what
opening a link (or a lesson's step, :func:`lesson_step`) does to the view: each value checked as its control checks
it, and against the model (:func:`fit_to_model`); what it cannot set is named.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

from convnn.candidates import draws_candidates

from .inputs import user_error_message, whole_number
from .models import LoadedModel
from .selections import resolve_options
from .state import Query, ViewState, check_number, compare_list, field_values, knob_names, settings

__all__ = ["LESSON_END", "LESSON_UNKNOWN", "LINK_FIELDS", "LINK_TOO_LONG", "MAX_LINK_BYTES", "LessonStep", "OpenedLink",
           "echo", "fit_to_model", "lesson_step", "link_fields", "link_query", "open_link", "parse_link", "write_link"]

LESSON_END = "The lesson's last step: pick another lesson in the list, or explore from here."
LESSON_UNKNOWN = ("This lesson narrates the shipped models it was written for ({models}), and this server lists "
                  "{listed}: its text would describe what the screen does not show, so the view stays as it is. "
                  "Start the app on the shipped checkpoints (`python app.py`, without `--checkpoints`) to "
                  "follow it.")


def link_fields(state: ViewState | type = ViewState) -> dict[str, str]:
    """A view's link keys → their kinds (:class:`~analysis.session.state.Setting`), in the query string's order:
    "text" (a name), "names" (names separated by commas), "whole" (a whole number), "real" (a finite number)."""
    return {how.link: how.kind for _, how in settings(state) if how.link is not None}


LINK_FIELDS = link_fields()  # the explorer's
MAX_LINK_BYTES = 2048  # a link's query string, at most: one the page writes is a few hundred bytes; the page sends
#                        it again with each request it makes, re-encoded (up to 3× as long) and as the Referer, so a
#                        longer one is not served (server.RequestSizeLimit) …
LINK_TOO_LONG = "link_too_long"  # … but sent to the page with this field in its place: how long it was, in bytes
MAX_VALUE_CHARS = 120  # a longer value is refused unread (names here are short; a link is typed or pasted)
_TEXT = re.compile(r"[A-Za-z0-9_.:\-]+")  # model stems, example names, layer paths, tab names
_NAMES = re.compile(r"[A-Za-z0-9_.:\-]+(,[A-Za-z0-9_.:\-]+)*")  # compare mode's models
_WHOLE = re.compile(r"[+-]?\d{1,19}")  # a seed may be as large as 2**63 − 1
_REAL = re.compile(r"[+-]?(\d{1,12}(\.\d{0,17})?|\.\d{1,17})([eE][+-]?\d{1,3})?")  # what repr(float) writes
MAX_UNKNOWN_NAMED = 5  # a link's unknown names echoed in its note, at most; the rest are counted
_IGNORED = re.compile(r"__.*|utm_.*|fbclid|gclid|view")  # Gradio's own (__theme, view=api) and trackers' fields
_KINDS = {  # kind → (the text it accepts, what the message calls it, the value read from that text)
    "text": (_TEXT, "a name", str),
    "names": (_NAMES, "names separated by commas", lambda text: text.split(",")),
    "whole": (_WHOLE, "a whole number", int),
    "real": (_REAL, "a number", float),
}


def parse_link(params: Mapping[str, object], fields: Mapping[str, str] = LINK_FIELDS
               ) -> tuple[dict[str, str | int | float | list[str]], list[str]]:
    """The fields of a link's query string, each as its kind (``fields``: :func:`link_fields`), and a message per
    value refused.

    Args:
        params (Mapping[str, object]): the query parameters, name → value (what ``request.query_params`` holds;
            any values, e.g. from a hand-edited URL).
        fields (Mapping[str, str]): the link keys → their kinds. Default: :data:`LINK_FIELDS`

    Returns:
        tuple[dict, list[str]]: the fields read (``{"model": "cnn-l0.5", "row": 10, "alpha": 0.25, "compare":
        ["cnn-l0", "cnn-l1"], …}``, absent fields left out) and, for each unknown name or unreadable value, a
        message naming it (the unknown names in one message: at most :data:`MAX_UNKNOWN_NAMED` echoed, the rest
        counted, so the messages are bounded however many names a link holds; :data:`LINK_TOO_LONG`, which the
        server puts in place of a link longer than :data:`MAX_LINK_BYTES`, a message saying so). The messages are
        shown as markup in the page: a name or value is echoed (:func:`echo`) only when it is plain (letters,
        digits, ``_.:-``, at most 40 characters), as a code span; anything else is described, not shown. Gradio's
        own fields (``__theme``, ``view``) and trackers' (``utm_*``, ``fbclid``, ``gclid``) are passed over.
    """
    values: dict[str, str | int | float | list[str]] = {}
    problems: list[str] = []
    unknown: list[object] = []
    for name, raw in params.items():
        kind = fields.get(name)
        if kind is None and isinstance(name, str) and _IGNORED.fullmatch(name):
            continue
        if name == LINK_TOO_LONG:
            problems.append(f"the link was too long to read ({echo(raw)} bytes; a link to the explorer is at most "
                            f"{MAX_LINK_BYTES:,}, one the page writes far shorter): check where it came from")
            continue
        if kind is None:
            unknown.append(name)
            continue
        text = raw if isinstance(raw, str) else ""
        pattern, what, read = _KINDS[kind]
        if len(text) > MAX_VALUE_CHARS or not pattern.fullmatch(text):
            problems.append(f"the link's {name} must be {what}, got {echo(text)}")
            continue
        values[name] = read(text)
    if unknown:
        named = ", ".join(echo(name) for name in unknown[:MAX_UNKNOWN_NAMED])
        more = len(unknown) - MAX_UNKNOWN_NAMED
        named += f" and {more:,} more" if more > 0 else ""
        problems.insert(0, f"the link's {named} {'is' if len(unknown) == 1 else 'are'} not something a link sets "
                           f"(it can set: {', '.join(fields)})")
    return values, problems


def echo(text: object) -> str:
    """``text`` as a code span of page markup (nothing in it renders), if it is a plain name of at most 40
    characters; "nothing" for an empty one (an empty code span shows nothing); else a description of it."""
    if text == "":
        return "nothing"
    if isinstance(text, str) and len(text) <= 40 and _TEXT.fullmatch(text):
        return f"`{text}`"
    return "a value not shown (not a plain name or number)"


def link_query(values: Mapping[str, object], fields: Mapping[str, str] = LINK_FIELDS) -> str:
    """The query string of a view (no leading ``?``): the keys of ``fields`` that ``values`` holds and that are not
    None, in that order (a list of names joined by commas); :func:`parse_link` reads it back to the same values."""
    pairs = [(name, values[name]) for name in fields if values.get(name) is not None]
    return urlencode([(name, ",".join(value) if isinstance(value, list | tuple) else value) for name, value in pairs],
                     safe=",")


def write_link(state: ViewState, travels: Mapping[str, object]) -> str:
    """The query string of ``state`` (:func:`link_query`): every field a link carries, a knob only when it is off its
    default; ``travels`` gives, by link key, the values the server names differently from the state (the model's
    shipped name, the image's example name, compare mode's models) or None for one that cannot travel."""
    values, defaults = field_values(state), field_values(type(state)(query=type(state.query)()))
    written = {how.link: values[item.name] for item, how in settings(state)
               if how.link is not None and not (how.is_knob and values[item.name] == defaults[item.name])}
    return link_query(written | dict(travels), link_fields(state))


@dataclass(frozen=True)
class OpenedLink:
    """A view as a link or a lesson's step opens it (:func:`open_link`).

    Attributes:
        state (ViewState): the view to show.
        named (frozenset[str]): the fields the link set (a model, image, tab or compare mode's models or depth it
            did not set stays as the page has it; the layer, the pixel and the knobs are always set).
        note (str): page markup naming every value the link could not set ("" when it set everything).
        focus_rule (str): the rule shown large, as the page reads it: ``"rule@link"`` (each link's value new).
    """

    state: ViewState
    named: frozenset[str]
    note: str
    focus_rule: str


def open_link(params: Mapping[str, object], current: ViewState, shipped: Sequence[str], examples: Mapping[str, str],
              load: Callable[[str | None], LoadedModel], tabs: Sequence[str], rules: Sequence[str]) -> OpenedLink:
    """The view a link's query string opens from ``current`` (the page's view): a pure function of its arguments.

    A model, image, tab or compare mode's models or depth the link leaves out stays as it is; a layer, pixel or knob
    it leaves out takes its default (the model's first layer, the field's default), so a lesson's step is the same
    view whatever came before. Each value is checked as its control checks it (:func:`parse_link`, the field's
    bounds: :func:`~analysis.session.state.check_number`), a model among ``shipped``, an image among ``examples``,
    then against the model (:func:`fit_to_model`); a value refused keeps the page's or the default, and is named in
    the note (the rest of the view still opens).

    Args:
        params (Mapping[str, object]): the link's query parameters.
        current (ViewState): the view shown now (its query's class gives the link's fields).
        shipped (Sequence[str]): the models a link may name.
        examples (Mapping[str, str]): the example images a link may name → their files.
        load (Callable[[str | None], LoadedModel]): the model of a name.
        tabs, rules (Sequence[str]): the tabs and the rules a link may name; the last rule is the default.

    Raises:
        ValueError: ``current``'s model cannot be loaded and the link names no other (as the model list says).
    """
    values, problems = parse_link(params, link_fields(current))
    defaults = type(current.query)()
    state = {"compare_models": current.compare_models, "compare_depth": current.compare_depth, "tab": current.tab}
    query = {"checkpoint": current.query.checkpoint, "image_file": current.query.image_file, "fit": current.query.fit}
    named: set[str] = set()

    def choose(key: str, name: str, allowed: Mapping[str, object], into: dict, among: str) -> None:
        """The field ``name`` set to ``allowed``'s value for the link's ``key``, if it is one of them; else a
        problem naming them (``among``: " the shipped models", ": a, b")."""
        if key in values and values[key] in allowed:
            into[name] = allowed[values[key]]
            named.add(name)
        elif key in values:
            problems.append(f"the link's {key} {echo(values[key])} is not one of{among}")

    choose("model", "checkpoint", {name: name for name in shipped}, query, " the shipped models")
    choose("image", "image_file", examples, query, " the examples")
    loaded = load(query["checkpoint"])
    first = loaded.first_layer_info
    query["layer"] = values.get("layer", first and first.name)
    if "layer" in values:
        named.add("layer")
    view_settings = {item.name: how for item, how in settings(current)}
    for item, how in settings(current.query):  # the pixel and the knobs: the link's, else the default
        if item.name in query or item.name == "layer":
            continue
        query[item.name] = getattr(defaults, item.name)
        if how.link in values:
            try:
                query[item.name] = check_number(values[how.link], how)
                named.add(item.name)
            except ValueError as err:
                problems.append(f"the link's {how.link}: {user_error_message(err)}")
    fitted, refused = fit_to_model(dataclasses.replace(defaults, **query), loaded, named)
    problems += refused
    if "compare" in values:  # compare mode's columns, as its model list allows them
        if any(name not in shipped for name in values["compare"]):
            problems.append("the link's compare must name shipped models only")
        else:
            try:
                state["compare_models"] = tuple(compare_list(values["compare"]))
                named.add("compare_models")
            except ValueError as err:
                problems.append(f"the link's compare: {err}")
    if "depth" in values:
        try:
            state["compare_depth"] = check_number(values["depth"], view_settings["compare_depth"])
            named.add("compare_depth")
        except ValueError as err:
            problems.append(f"the link's {user_error_message(err)}")  # the message names the depth's label
    choose("tab", "tab", {tab: tab for tab in tabs}, state, f": {', '.join(tabs)}")
    rule = values.get("rule", rules[-1])
    if rule not in rules:
        problems.append(f"the link's rule {echo(rule)} is not one of: {', '.join(rules)}")
        rule = rules[-1]
    # every problem (at most one per link field, each value echoed shortened), none ending the sentence early
    note = ("**This link could not set everything:** " + "; ".join(problem.rstrip(".") for problem in problems)
            + ".") if problems else ""
    return OpenedLink(type(current)(query=fitted, rule=rule, **state), frozenset(named), note,
                      f"{rule}@{link_query(values, link_fields(current))}")


def fit_to_model(query: Query, loaded: LoadedModel, named: frozenset[str] | set[str] = frozenset()
                 ) -> tuple[Query, list[str]]:
    """``query`` checked against its model in one place: a layer the model does not have, a pixel outside its input,
    a head it does not have or a draw other than 0 of a model without random candidates (each only if ``named``: the
    fields a link set), and knobs that do not resolve on the layer (:func:`analysis.resolve_options`), each replaced
    by its default (the model's first layer, the field's default) and named in a message; the knobs that resolve are
    kept (each checked with those kept before it).

    Returns:
        tuple[Query, list[str]]: the query the model can show, and the messages.
    """
    problems: list[str] = []
    layer_infos = {layer_info.name: layer_info for layer_info in loaded.layer_infos}
    defaults = type(query)()
    links = {item.name: how.link for item, how in settings(query)}
    changes: dict[str, object] = {}
    if query.layer not in layer_infos:
        if "layer" in named:
            problems.append(f"the link's layer {echo(query.layer)} is not a layer of this model")
        first = loaded.first_layer_info
        changes["layer"] = first and first.name
    if "draw" in named and query.draw and not draws_candidates(loaded.model):  # every draw of it is the same
        problems.append(f"the link's draw: {loaded.card.name} draws no random candidates, so it has draw 0 only")
        changes["draw"] = defaults.draw
    bounds = {"row_px": loaded.card.input_size, "col_px": loaded.card.input_size, "head": loaded.max_heads}
    for name, bound in bounds.items():
        if name in named and (number := getattr(query, name)) >= bound:
            problems.append(f"the link's {links[name]} must be below {bound} for this model, got {number}")
            changes[name] = getattr(defaults, name)
    query = dataclasses.replace(query, **changes)
    if query.layer in layer_infos:  # the knobs together, as the table will check them for this layer
        layer_info = layer_infos[query.layer]
        try:
            resolve_options(layer_info, query.options())
        except ValueError:  # keep each knob that resolves with those kept before it; name each one that does not
            knobs = [name for name in knob_names(query) if name not in ("head", "draw")]
            kept = dataclasses.replace(query, **{name: getattr(defaults, name) for name in knobs})
            for name in knobs:
                trial = dataclasses.replace(kept, **{name: getattr(query, name)})
                try:
                    resolve_options(layer_info, trial.options())
                    kept = trial
                except ValueError as err:
                    problems.append(f"the link's knobs: {err}")
            query = kept
    return query, problems


@dataclass(frozen=True)
class LessonStep:
    """One step of a lesson (:func:`lesson_step`): its link's parameters, its numbered text and its index, and the
    models it was written for that this server does not have (then ``params`` is empty and ``text`` says so)."""

    params: dict[str, str]
    text: str
    step: int
    unknown: tuple[str, ...] = ()


def lesson_step(lessons: Sequence[Mapping], title: object, step: object,
                weights: Mapping[str, str]) -> LessonStep | None:
    """Step ``step`` of the lesson titled ``title`` (clamped to its steps), or None for no such lesson.

    A lesson narrates the models it was written for, by the sha256 of their weights: where this server lists one of
    them under another name's weights, or not at all (``--checkpoints`` with a folder of other models), the step
    says so instead of narrating what the screen would not show.

    Args:
        lessons (Sequence[Mapping]): the lessons, each ``{"title", "models": {name: weights sha256}, "steps":
            [{"link", "text", "claims"}, …]}`` (``web/lessons.json``).
        title (object): the lesson picked.
        step (object): the step asked for (a whole number).
        weights (Mapping[str, str]): the models this server lists → the sha256 of their weights (their cards'
            ``weights_sha256``).

    Raises:
        ValueError: ``step`` is not a whole number.
    """
    found = next((item for item in lessons if item["title"] == title), None)
    if found is None:
        return None
    steps = found["steps"]
    step = min(max(whole_number(step, "the lesson's step"), 0), len(steps) - 1)
    unknown = tuple(name for name, digest in found["models"].items() if weights.get(name) != digest)
    number = f"**Step {step + 1} of {len(steps)}.** "
    if unknown:
        listed = "; ".join(f"other weights as `{name}`" if name in weights else f"no `{name}`" for name in unknown)
        return LessonStep({}, number + LESSON_UNKNOWN.format(models=", ".join(f"`{name}`" for name in found["models"]),
                                                             listed=listed), step, unknown)
    text = number + steps[step]["text"]
    if step == len(steps) - 1:  # Next has nowhere to go: say so
        text += f"\n\n*{LESSON_END}*"
    return LessonStep(dict(parse_qsl(steps[step]["link"])), text, step)
