"""The covering subsets the interpreter runs hold every combination they promise (tests/kernels/cases.py)."""

from __future__ import annotations

import itertools

import pytest

from tests.kernels import cases
from tests.kernels.cases import covering

FACTORS = [["cosine", "dot"], ["none", "softmax", "uniform"], ["standard", "depthwise"], ["all", "random"],
           [False, True]]


@pytest.mark.parametrize("strength", [1, 2, 3])
def test_every_combination_of_any_strength_factors_is_in_some_row(strength):
    rows = covering(FACTORS, strength)
    product = list(itertools.product(*FACTORS))
    assert set(rows) <= set(product) and len(set(rows)) == len(rows)
    assert len(rows) < len(product)
    for group in itertools.combinations(range(len(FACTORS)), strength):
        for values in itertools.product(*(FACTORS[i] for i in group)):
            assert any(all(row[i] == v for i, v in zip(group, values, strict=True)) for row in rows), (group, values)


def test_a_strength_of_every_factor_is_the_whole_product_and_below_one_is_refused():
    assert covering(FACTORS, 5) == covering(FACTORS, 9) == list(itertools.product(*FACTORS))
    with pytest.raises(ValueError, match="strength"):
        covering(FACTORS, 0)


def test_hand_picked_interpreter_rows_must_cover_the_strength_they_claim(monkeypatch):
    """kernel_cases takes hand-picked rows in the interpreter only when they cover (rows built here to miss a value,
    a pair, or to leave the product), and runs the whole product on a GPU whatever rows are given."""
    factors = [["a", "b", "c"], [1, 2], [False, True]]
    rows = [("a", 1, False), ("b", 2, True), ("c", 1, True)]
    monkeypatch.setattr(cases, "DEVICE", "cpu")
    assert cases.kernel_cases(factors, 1, rows) == rows
    with pytest.raises(ValueError, match="do not cover"):
        cases.kernel_cases(factors, 1, rows[:2])  # "c" missing
    with pytest.raises(ValueError, match="do not cover"):
        cases.kernel_cases(factors, 2, rows)  # ("a", 2) missing, among others
    with pytest.raises(ValueError, match="do not cover"):
        cases.kernel_cases(factors, 1, [*rows, ("d", 1, False)])  # not a row of the product
    monkeypatch.setattr(cases, "DEVICE", "cuda")
    assert cases.kernel_cases(factors, 1, rows) == list(itertools.product(*factors))
