"""The answers a later opening makes stale (server/openings.py), by session; the page's sequences that need it are
tried in tests/app/test_browser.py (test_quick_lesson_moves_end_on_the_last_one)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import gradio as gr
import pytest

from server import Openings
from tests.server.test_guards import placed


def held(answer: str, began: threading.Event, release: threading.Event):
    """A wired step that says it began, waits for ``release``, then answers ``answer``."""
    def step(values, request):
        began.set()
        assert release.wait(10)
        return answer
    return step


def answered(answer: str):
    def step(values, request):
        return answer
    return step


def refused(values, request):
    raise gr.Error("unknown checkpoint 'nosuchmodel'")


@pytest.mark.parametrize(("opens", "stale_after", "stale"), [
    ("view", ("view",), True),  # a lesson's step that came late: Next's, begun after it, was answered
    ("model", ("view",), False),  # a model picked is no lesson's step
    ("view", ("view", "model"), True),  # an explorer's table: stale after any opening
])
def test_an_answer_begun_before_an_opening_answered_first_changes_nothing(opens, stale_after, stale):
    openings, began, release = Openings(), threading.Event(), threading.Event()
    session = placed("10.0.0.1", "s1")
    first = openings.wrap(held("first", began, release), "view", stale_after)
    with ThreadPoolExecutor(1) as pool:
        late = pool.submit(first, {}, session)
        assert began.wait(10)
        assert openings.wrap(answered("second"), opens)({}, session) == "second"
        release.set()
        assert late.result(10) == (gr.skip() if stale else "first")


def test_an_opening_refused_or_begun_after_makes_nothing_stale():
    """A model name refused (an unknown name typed and Enter while a pick was answered) opens nothing: the pick's
    steps begun before it keep their answers; so does a step begun after an opening was answered."""
    openings, began, release = Openings(), threading.Event(), threading.Event()
    session = placed("10.0.0.1", "s1")
    with ThreadPoolExecutor(1) as pool:
        table = pool.submit(openings.wrap(held("table", began, release), None, ("model",)), {}, session)
        assert began.wait(10)
        with pytest.raises(gr.Error):
            openings.wrap(refused, "model")({}, session)
        release.set()
        assert table.result(10) == "table"
    assert openings.wrap(answered("model"), "model")({}, session) == "model"
    assert openings.wrap(answered("table"), None, ("model",))({}, session) == "table"


def test_an_opening_makes_only_its_own_visitor_s_session_stale():
    """Another visitor naming the same session id, or the visitor's other tab, opening a view changes nothing of
    this session's answers; a call with no request (a script) is never stale."""
    openings, began, release = Openings(), threading.Event(), threading.Event()
    alice = placed("10.0.0.1", "s1")
    with ThreadPoolExecutor(2) as pool:
        late = pool.submit(openings.wrap(held("alice", began, release), None, ("view",)), {}, alice)
        scripted = pool.submit(openings.wrap(held("script", threading.Event(), release), None, ("view",)), {}, None)
        assert began.wait(10)
        for other in (placed("10.0.0.66", "s1"), placed("10.0.0.1", "s2")):  # another visitor; alice's other tab
            openings.wrap(answered("opened"), "view")({}, other)
        openings.wrap(answered("opened"), "view")({}, None)
        release.set()
        assert (late.result(10), scripted.result(10)) == ("alice", "script")


def test_a_session_s_record_is_kept_only_while_a_step_of_it_runs():
    openings = Openings()
    session = placed("10.0.0.1", "s1")
    openings.wrap(answered("opened"), "view")({}, session)
    assert not openings._opened and not openings._running  # nothing begun before it runs: nothing to keep


def test_a_step_without_inputs_an_example_picked_opens_and_goes_stale_like_the_others():
    """An example picked is a step with no inputs (``on_example(request, evt)``): its request came in the values'
    place and the page's every example pick failed ("'EventData' object has no attribute 'session_hash'")."""
    openings, began, release = Openings(), threading.Event(), threading.Event()
    session, event = placed("10.0.0.1", "s1"), object()

    def example(request, evt):
        assert evt is event
        return "example"

    def late_example(request, evt):
        began.set()
        assert release.wait(10)
        return "late"

    with ThreadPoolExecutor(1) as pool:
        late = pool.submit(openings.wrap(late_example, "image", ("image",)), session, event)
        assert began.wait(10)
        assert openings.wrap(example, "image")(session, event) == "example"
        release.set()
        assert late.result(10) == gr.skip()


def test_a_double_of_a_run_in_flight_is_the_same_opening_and_neither_goes_stale():
    """One pick in the lessons' dropdown sends its step twice on the same values (the pick, then the blur that closes
    the list); the two ran at once and the first was stale once its double had been answered: its answer, which
    changes nothing, reached the page first, and the lesson's chain read the query boxes before the step had set
    them (a lesson started again after a click stayed on the clicked pixel). A run on other values still goes
    stale."""
    openings, began, release = Openings(), threading.Event(), threading.Event()
    session, calls = placed("10.0.0.1", "s1"), []

    def lesson_start(values, request):
        calls.append(values)
        if len(calls) == 1:  # the first run waits; its double is answered first
            began.set()
            assert release.wait(10)
        return f"step of {values['lesson']}"

    step = openings.wrap(lesson_start, "view", ("view",))
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(step, {"lesson": "convolution"}, session)
        assert began.wait(10)
        assert step({"lesson": "convolution"}, placed("10.0.0.1", "s1")) == "step of convolution"
        release.set()
        assert first.result(10) == "step of convolution"
        calls.clear()
        began.clear()
        release.clear()
        first = pool.submit(step, {"lesson": "convolution"}, session)
        assert began.wait(10)
        assert step({"lesson": "attention"}, session) == "step of attention"  # another lesson picked meanwhile
        release.set()
        assert first.result(10) == gr.skip()
    assert not openings._runs and not openings._opened and not openings._running
