"""What opening a link or a lesson's step does to the view (analysis.session.links): open_link from the view shown,
fit_to_model against the model, lesson_step from the lessons; pure functions, checked on small models."""

from __future__ import annotations

import dataclasses

import pytest

from analysis import LESSON_END, LESSON_UNKNOWN, LessonStep, Query, ViewState, fit_to_model, lesson_step, open_link

TABS = ["weights", "mix", "hops", "compare"]
RULES = ["window", "all", "random", "blend", "layer"]  # the last one is the default
SHIPPED = ["cnn-l0.5", "vit-convnn"]
EXAMPLES = {"cat_0": "/examples/cat_0.png"}


@pytest.fixture(scope="module")
def models(load_small) -> dict:
    return {name: load_small(name) for name in SHIPPED}


def shown() -> ViewState:
    """The view a page shows before the link: an upload, a knob, compare mode's columns."""
    return ViewState(query=Query(checkpoint="cnn-l0.5", image_file="/uploads/photo.png", layer="stages.2.0.conv1",
                                 row_px=3, col_px=4, num_neighbors=5, fit="letterbox"),
                     tab="mix", compare_models=("cnn-l0", "cnn-l0.5"), compare_depth=0.25)


def test_a_link_sets_what_it_names_keeps_model_image_and_tab_and_defaults_the_rest(models):
    params = {"model": "vit-convnn", "layer": "blocks.1.attn", "row": "10", "k": "16", "head": "1", "tab": "hops",
              "rule": "window"}
    opened = open_link(params, shown(), SHIPPED, EXAMPLES, models.__getitem__, TABS, RULES)
    assert opened.state == ViewState(
        query=Query(checkpoint="vit-convnn", image_file="/uploads/photo.png", layer="blocks.1.attn", row_px=10,
                    col_px=16, num_neighbors=16, head=1, fit="letterbox"),  # col and K: the defaults, not 4 and 5
        tab="hops", compare_models=("cnn-l0", "cnn-l0.5"), compare_depth=0.25, rule="window")
    assert opened.named == {"checkpoint", "layer", "row_px", "num_neighbors", "head", "tab"}
    assert opened.note == ""
    assert opened.focus_rule == "window@model=vit-convnn&layer=blocks.1.attn&row=10&k=16&head=1&tab=hops&rule=window"


def test_a_plain_address_opens_the_model_s_own_first_layer_at_the_defaults(models):
    opened = open_link({}, shown(), SHIPPED, EXAMPLES, models.__getitem__, TABS, RULES)
    assert opened.state.query == Query(checkpoint="cnn-l0.5", image_file="/uploads/photo.png",
                                       layer="stages.1.0.conv1", fit="letterbox")
    assert (opened.state.tab, opened.state.rule, opened.named, opened.note) == ("mix", "layer", frozenset(), "")
    assert opened.focus_rule == "layer@"


def test_every_value_a_link_cannot_set_is_named_and_the_rest_still_opens(models):
    params = {"model": "nope", "image": "dog_9", "layer": "blocks.7", "row": "32", "k": "-1", "alpha": "0.75",
              "tab": "secret", "rule": "bogus", "compare": "cnn-l0.5,unknown", "depth": "2"}
    opened = open_link(params, shown(), SHIPPED, EXAMPLES, models.__getitem__, TABS, RULES)
    assert opened.state == ViewState(  # all the page's or the defaults, but α, which the link could set
        query=Query(checkpoint="cnn-l0.5", image_file="/uploads/photo.png", layer="stages.1.0.conv1",
                    blend_alpha=0.75, fit="letterbox"),
        tab="mix", compare_models=("cnn-l0", "cnn-l0.5"), compare_depth=0.25, rule="layer")
    assert opened.note.startswith("**This link could not set everything:** the link's model `nope` is not one of")
    for part in ("image `dog_9`", "layer `blocks.7` is not a layer", "row must be below 32 for this model, got 32",
                 "the link's knobs: K (neighbours per query) must be from 1 to 256",
                 "tab `secret` is not one of: weights, mix, hops, compare",
                 "rule `bogus` is not one of", "compare must name shipped models only", "the link's depth:"):
        assert part in opened.note, part
    assert opened.note.count(";") == 8 and opened.note.endswith(".")  # nine problems, one sentence


def test_fit_to_model_replaces_only_what_the_model_cannot_show(models):
    loaded = models["vit-convnn"]  # 32 px input, 8×8 grid, 2 heads
    fine = Query(checkpoint="vit-convnn", layer="blocks.1.attn", row_px=31, col_px=0, num_neighbors=64, head=1)
    assert fit_to_model(fine, loaded, {"layer", "row_px", "col_px", "head"}) == (fine, [])
    wrong = Query(checkpoint="vit-convnn", layer="blocks.9", row_px=32, col_px=40, num_neighbors=65, seed=7,
                  head=2)
    fitted, problems = fit_to_model(wrong, loaded, {"layer", "row_px", "head"})
    assert fitted == Query(checkpoint="vit-convnn", layer="blocks.0.attn", col_px=40, seed=7)  # col: not named
    assert problems == [
        "the link's layer `blocks.9` is not a layer of this model",
        "the link's row must be below 32 for this model, got 32",
        "the link's head must be below 2 for this model, got 2",
        "the link's knobs: K (neighbours per query) must be from 1 to 64 for the 8×8 grid of blocks.0.attn, got 65"]
    kept, problems = fit_to_model(Query(layer="blocks.0.attn", num_neighbors=999, head=1), loaded)
    assert kept == Query(layer="blocks.0.attn", head=1) and len(problems) == 1  # K goes back, the head stays


def test_one_knob_a_layer_cannot_take_resets_that_knob_alone(models):
    """A link with a valid K, r and α and one bad knob keeps the valid ones and names the bad one."""
    loaded = models["cnn-l0.5"]
    asked = Query(checkpoint="cnn-l0.5", layer="stages.1.0.conv1", num_neighbors=16, blend_alpha=0.25,
                  num_candidates=20, seed=2**63)
    fitted, problems = fit_to_model(asked, loaded)
    assert fitted == dataclasses.replace(asked, seed=0)
    assert len(problems) == 1 and "seed" in problems[0]


LESSONS = [{"title": "Windows", "models": {"cnn-l0": "a" * 64},
            "steps": [{"link": "model=cnn-l0&row=3&tab=mix", "text": "Look at the window."},
                      {"link": "k=16", "text": "Now K = 16."}]},
           {"title": "Other", "models": {}, "steps": [{"link": "", "text": "Only step."}]}]
WEIGHTS = {"cnn-l0": "a" * 64, "vit-mhsa": "b" * 64}  # the models a server lists → their weights' sha256


def test_a_lesson_step_is_its_link_s_parameters_and_its_numbered_text():
    assert lesson_step(LESSONS, "Windows", 0, WEIGHTS) == LessonStep({"model": "cnn-l0", "row": "3", "tab": "mix"},
                                                                     "**Step 1 of 2.** Look at the window.", 0)
    last = LessonStep({"k": "16"}, f"**Step 2 of 2.** Now K = 16.\n\n*{LESSON_END}*", 1)
    assert lesson_step(LESSONS, "Windows", 1, WEIGHTS) == last
    assert lesson_step(LESSONS, "Windows", 7, WEIGHTS) == last  # Next past the end stays on the last step
    assert lesson_step(LESSONS, "Windows", -1, WEIGHTS).step == 0  # Back before the first stays on the first
    assert lesson_step(LESSONS, "Other", 0, {}) == LessonStep({}, f"**Step 1 of 1.** Only step.\n\n*{LESSON_END}*",
                                                             0)
    assert lesson_step(LESSONS, "Lesson 99", 0, WEIGHTS) is None and lesson_step(LESSONS, None, 0, WEIGHTS) is None
    for step in ("1", 1.5, None):
        with pytest.raises(ValueError, match="the lesson's step"):
            lesson_step(LESSONS, "Windows", step, WEIGHTS)


@pytest.mark.parametrize(("weights", "listed"), [({"vit-mhsa": "b" * 64}, "no `cnn-l0`"),
                                                 ({"cnn-l0": "c" * 64}, "other weights as `cnn-l0`"),
                                                 ({"cnn-l0": ""}, "other weights as `cnn-l0`")])
def test_a_lesson_over_models_it_was_not_written_for_says_so_instead_of_narrating(weights, listed):
    """A server on another checkpoint folder (``--checkpoints``) narrated the shipped models' lessons over models
    that are not there, or are other weights under the same name (a card that records none counts as other)."""
    step = lesson_step(LESSONS, "Windows", 1, weights)
    assert step == LessonStep({}, "**Step 2 of 2.** " + LESSON_UNKNOWN.format(models="`cnn-l0`", listed=listed), 1,
                              ("cnn-l0",))
    assert "Now K" not in step.text and step.params == {}  # nothing narrated, no view opened


def test_a_link_s_refused_depth_and_empty_values_are_named_once_in_words(models):
    """The depth's refusal names the field once (it read "the link's depth: compare depth must…"), and an empty
    value is called empty (an empty code span read "got ." on the page)."""
    opened = open_link({"depth": "2"}, shown(), SHIPPED, EXAMPLES, models.__getitem__, TABS, RULES)
    assert opened.note == ("**This link could not set everything:** the link's depth: how far through each model "
                           "must be from 0 to 1, got 2.0.")
    opened = open_link({"row": "", "depth": ""}, shown(), SHIPPED, EXAMPLES, models.__getitem__, TABS, RULES)
    assert opened.note == ("**This link could not set everything:** the link's row must be a whole number, got "
                           "nothing; the link's depth must be a number, got nothing.")
