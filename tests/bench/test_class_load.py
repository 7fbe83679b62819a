"""bench/class_load.py's pure parts: each visitor's schedule (the issue's mix, think times, reproducible) and the
p95 / ratio arithmetic, against numbers computed here by hand. The load run itself is not a test."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import class_load
from class_load import Record, compare, mix_for, p95, ratio, summarize, think_times, visitor_schedule


def test_three_minutes_hold_the_issues_mix_after_opening_the_page():
    actions = visitor_schedule(7)
    assert actions[0].kind == "open"
    assert Counter(action.kind for action in actions[1:]) == {"example": 5, "upload": 2, "click": 40, "knob": 3,
                                                              "saliency": 1, "compare": 1}


def test_think_times_stay_within_2_to_10_s_and_fill_the_duration():
    actions = visitor_schedule(3, minutes=3)
    thinks = [action.think_s for action in actions]
    assert all(2.0 <= value <= 10.0 for value in thinks)
    assert sum(thinks) == pytest.approx(180.0)  # 53 draws of mean 6 s are scaled down into 3 minutes


def test_think_times_are_never_stretched_past_their_draws():
    import random

    rng, again = random.Random(1), random.Random(1)
    thinks = think_times(4, 3600.0, rng)
    assert thinks == [again.uniform(2.0, 10.0) for _ in range(4)]
    assert think_times(10, 5.0, random.Random(2)) == [2.0] * 10  # too short for the minimum: all 2 s


def test_schedules_are_reproducible_and_differ_between_visitors():
    assert visitor_schedule(4, seed=5) == visitor_schedule(4, seed=5)
    assert visitor_schedule(4, seed=5) != visitor_schedule(5, seed=5)
    examples = [action.arg for action in visitor_schedule(4) if action.kind == "example"]
    assert len(set(examples)) == 5 and all(0 <= index < 20 for index in examples)
    assert all(action.arg in class_load.KNOBS for action in visitor_schedule(4) if action.kind == "knob")


def test_a_shorter_class_scales_the_mix_keeping_one_of_each():
    assert mix_for(1) == {"example": 2, "upload": 1, "click": 13, "knob": 1, "saliency": 1, "compare": 1}
    assert mix_for(6) == {"example": 10, "upload": 4, "click": 80, "knob": 6, "saliency": 2, "compare": 2}


def test_p95_is_the_nearest_rank():
    assert p95(list(range(1, 21))) == 19  # ⌈0.95 · 20⌉ = 19th smallest
    assert p95([5.0, 1.0, 3.0]) == 5.0  # ⌈2.85⌉ = 3rd
    assert p95(list(range(100, 0, -1))) == 95
    assert p95([]) is None


def test_ratio_and_the_per_action_rows():
    assert ratio(450.0, 150.0) == 3.0
    assert ratio(100.0, 300.0) == 0.33
    assert ratio(None, 10.0) is None and ratio(10.0, 0.0) is None
    alone = [Record("knob", 0, seconds, 0.5, 1) for seconds in (0.1, 0.2, 0.3, 0.4)]
    loaded = [Record("knob", 0, seconds, 0.5, 1) for seconds in (0.2, 0.4)]
    loaded += [Record("knob", 1, None, 0.1, 1, "503: Queue is full"), Record("knob", 2, 3.0, 3.0, 1, "no answer", True)]
    loaded += [Record("click", 0, None, 0.0, 0)]  # answered in the page: counted, not timed
    rows = compare(summarize(loaded), summarize(alone))
    knob = rows["knob"]
    assert (knob["honest_p95_ms"], knob["honest_p95_alone_ms"]) == (3000.0, 400.0)  # the give-up counts at its time
    assert knob["honest_p95_ratio"] == 7.5 and knob["honest_refused"] == 1 and knob["honest_gave_up"] == 1
    assert knob["met"] is False and (knob["count"], knob["timed"]) == (4, 3)
    assert compare(summarize(loaded[2:3]), summarize(alone))["knob"]["met"] is False  # all refused: no p95, not met
    click = rows["click"]
    assert click["count"] == 1 and click["timed"] == 0 and click["honest_p95_ms"] is None and click["met"] is None
