"""The covering subsets the interpreter runs hold every combination they promise (tests/kernels/cases.py)."""

from __future__ import annotations

import itertools

import pytest

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
