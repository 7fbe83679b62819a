"""The lessons (``web/lessons.json``) say only what the screen shows: each step lists its checkable claims, checked
here against what the app computes for the view the step opens on the shipped models; a number in a step's text
must be one of its claims; a lesson opened over models it was not written for says so instead of narrating.

A step's ``claims``, each checked on the view the step opens, or with ``"at"`` on that view with some of the link's
parameters changed (``null`` removes one, so that the knob takes its default):

- ``{"shows": rule}``: the rule shown large (exactly one per step);
- ``{"predicted": class, "value": percent}``: the top-1 class and its probability as the page shows it;
- ``{"value": number, "of": quantity, "tol": …}``: a number the page shows, within ``tol`` (default 0), one of
  :data:`QUANTITIES` (``"rule"``, ``"with"`` and ``"class"`` say whose).
"""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qsl

import gradio as gr
import pytest

import analysis as an
from app_api import WEB_DIR
from tests.app.test_app import shipped, view  # noqa: F401 (the shipped models' Explorer is a fixture)

LESSONS = json.loads((WEB_DIR / "lessons.json").read_text(encoding="utf-8"))
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?!\w)")  # a number in prose, not a digit of a name (`conv2d`)


def _overlap(found: an.QueryNeighbors, a: str, b: str) -> float:
    return found.overlaps[(a, b)] if (a, b) in found.overlaps else found.overlaps[(b, a)]


def _rank(found: an.QueryNeighbors, rule: str) -> int:
    return [tuple(cell) for cell in found.sets[rule].cells.tolist()].index(tuple(found.query_cell))


def _share(loaded: an.LoadedModel, image: an.InputImage, query: an.Query):
    return 100 * an.branch_mix(loaded, image, query.layer, query.draw).share


# quantity → what the app computes for it: f(loaded, image, query, neighbours of the query, claim)
QUANTITIES = {
    "K": lambda loaded, image, query, found, claim: found.options.num_neighbors,
    "R": lambda loaded, image, query, found, claim: found.options.window_size,
    "r": lambda loaded, image, query, found, claim: found.options.num_candidates,
    "seed": lambda loaded, image, query, found, claim: found.options.seed,
    "λ": lambda loaded, image, query, found, claim: loaded.layer_info(query.layer).branch_ratio,
    "N": lambda loaded, image, query, found, claim: found.layer.height * found.layer.width,
    "mix kernel": lambda loaded, image, query, found, claim: loaded.model.get_submodule(query.layer).mix.kernel_size[0],
    "mean distance": lambda loaded, image, query, found, claim: found.sets[claim["rule"]].mean_distance,
    "in R×R": lambda loaded, image, query, found, claim: 100 * found.sets[claim["rule"]].window_share,
    "query rank": lambda loaded, image, query, found, claim: _rank(found, claim["rule"]),
    "Jaccard": lambda loaded, image, query, found, claim: _overlap(found, claim["rule"], claim["with"]),
    "probability": lambda loaded, image, query, found, claim: 100 * an.top_classes(
        loaded, image, count=len(loaded.card.classes), draw=query.draw)[claim["class"]],
    "ConvNN share": lambda loaded, image, query, found, claim: _share(loaded, image, query)[found.query_cell],
    "mean ConvNN share": lambda loaded, image, query, found, claim: _share(loaded, image, query).mean(),
    "draw": lambda loaded, image, query, found, claim: query.draw,
    "draws": lambda loaded, image, query, found, claim: an.SPREAD_DRAWS,
}
KEYS = {"shows", "predicted", "value", "of", "tol", "rule", "with", "class", "at"}


def page_query(out: dict) -> an.Query:
    """The query the page sends once a step's (or a link's) updates are applied: each control's value."""
    shown = {item.name: out[item.name] for item, _ in an.settings(an.Query) if item.name in out}
    return an.Query(**{name: update["value"] if isinstance(update, dict) else update for name, update in shown.items()})


def steps():
    """Every step of every lesson: (lesson, index, step), with a readable test id."""
    return [pytest.param(lesson, index, step, id=f"{lesson['title'][0]}.{index + 1}")
            for lesson in LESSONS for index, step in enumerate(lesson["steps"])]


@pytest.mark.parametrize(("lesson", "index", "step"), steps())
def test_a_lesson_step_s_claims_are_what_the_app_shows(shipped, lesson, index, step):  # noqa: F811
    """Lesson 2 said "Click the dog" where vit-convnn16 predicts cat (49.5 %), lesson 3 that the set changes with
    the seed while the large panel showed what the layer used, and that r = 128 finds more of the exhaustive picks
    where its overlap with them stayed 0.06: each claim is now checked on the view the step opens."""
    out = shipped.lesson_step(lesson["title"], index, view("cnn-l0.5"))
    assert out["link_note"] == "" and out["lesson_text"].split("\n\n*")[0].endswith(step["text"])
    for claim in step["claims"]:
        if "shows" in claim:
            assert out["focus_rule"].split("@")[0] == claim["shows"]
            continue
        params = {**dict(parse_qsl(step["link"])), **claim.get("at", {})}
        shown = out if "at" not in claim else shipped.view({k: v for k, v in params.items() if v is not None},
                                                           view("cnn-l0.5"))
        query = page_query(shown)
        loaded, image, found = shipped.neighbors(query)
        if "predicted" in claim:
            top_class, probability = next(iter(an.top_classes(loaded, image, draw=query.draw).items()))
            actual = (top_class, 100 * probability)
            assert actual[0] == claim["predicted"], (claim, actual)
            assert abs(actual[1] - claim["value"]) <= claim.get("tol", 0) + 1e-9, (claim, actual)
        else:
            actual = QUANTITIES[claim["of"]](loaded, image, query, found, claim)
            assert abs(actual - claim["value"]) <= claim.get("tol", 0) + 1e-9, (claim, actual)


def test_a_number_in_a_lesson_step_s_text_is_one_of_its_claims(shipped):  # noqa: F811
    """A lint of ``web/lessons.json``: every number a step's text says is the value of one of its claims, a class it
    says the model predicts is named in the text, each step says which rule it shows large, each claim is one the
    test above can check, and each lesson names the models its steps open with the weights the shipped cards
    record (a retrained checkpoint makes it check its claims again)."""
    weights = shipped.weights()
    for lesson in LESSONS:
        for index, step in enumerate(lesson["steps"]):
            where = (lesson["title"], index + 1)
            values = {float(claim["value"]) for claim in step["claims"] if "value" in claim}
            said = [float(number) for number in NUMBER.findall(step["text"])]
            assert [number for number in said if number not in values] == [], where
            assert [claim["shows"] for claim in step["claims"] if "shows" in claim] in (
                [[rule] for rule in an.page_rules()]), where
            for claim in step["claims"]:
                assert set(claim) <= KEYS and (claim.get("of") in QUANTITIES) != ("shows" in claim or
                                                                                "predicted" in claim), (where, claim)
                assert claim.get("predicted", "") in step["text"], (where, claim)
                model = claim.get("at", {}).get("model") or dict(parse_qsl(step["link"]))["model"]
                assert model in lesson["models"], (where, model)
        assert {name: weights.get(name) for name in lesson["models"]} == lesson["models"], lesson["title"]


def test_a_lesson_over_models_it_was_not_written_for_says_so_and_opens_nothing(explorer):
    """On a server of other checkpoints under the shipped names (the small test models: ``--checkpoints`` of
    someone's own), a lesson's step narrated the shipped models; now it says so and leaves the view as it is."""
    for lesson in LESSONS:
        out = explorer.lesson_step(lesson["title"], 0, view("cnn-l0.5"))
        assert "this server lists" in out["lesson_text"] and lesson["steps"][0]["text"] not in out["lesson_text"]
        assert out["layer"] == gr.skip() and out["checkpoint"] == gr.skip() and out["lesson_step"] == 0
