"""Which combinations of a kernel test's factors run where: every combination on a GPU, a covering subset in
Triton's interpreter (CPU, CI), where one case costs seconds of per-op Python instead of microseconds.

A covering subset of strength t holds every combination of values of any t factors at least once (a covering
array): each kernel flag meets every other flag's values (t = 2) or every pair of them (t = 3), the interactions
the kernel's constexpr branches have, in a fraction of the full product's cases.
"""

from __future__ import annotations

import collections
import itertools

from tests.kernels.every_row import DEVICE


def covering(factors: list[list], strength: int) -> list[tuple]:
    """Rows of ``itertools.product(*factors)`` such that every combination of values of any ``strength`` factors
    appears in at least one row: greedy, deterministic (each step takes the row that covers the most combinations
    not yet covered; among those, the one whose values the rows taken so far hold least often, then the first in
    product order). Returns the rows in product order. ``strength`` ≥ the number of factors gives the whole
    product. Raises ``ValueError`` for a strength below 1."""
    if strength < 1:
        raise ValueError(f"strength must be ≥ 1, got {strength}")
    product = list(itertools.product(*factors))
    groups = list(itertools.combinations(range(len(factors)), min(strength, len(factors))))

    def combos(row):
        return {(group, tuple(row[i] for i in group)) for group in groups}

    uncovered = set().union(*(combos(row) for row in product))
    chosen, used = [], collections.Counter()
    while uncovered:
        best = max(product, key=lambda row: (len(combos(row) & uncovered),  # max keeps the first of equals
                                             -sum(used[i, value] for i, value in enumerate(row))))
        chosen.append(best)
        used.update(enumerate(best))
        uncovered -= combos(best)
    return sorted(chosen, key=product.index)


def covers(rows: list[tuple], factors: list[list], strength: int) -> bool:
    """Whether ``rows`` (rows of ``itertools.product(*factors)``) hold every combination of values of any
    ``strength`` factors."""
    groups = itertools.combinations(range(len(factors)), min(strength, len(factors)))
    return all(any(all(row[i] == v for i, v in zip(group, values, strict=True)) for row in rows)
               for group in groups for values in itertools.product(*(factors[i] for i in group)))


def kernel_cases(factors: list[list], strength: int, rows: list[tuple] | None = None) -> list[tuple]:
    """The whole product on a CUDA device; in the interpreter ``rows`` — picked by hand among the cheap cases, the
    interpreter's cost of a case differing by 10× (the repairs of many rows at large K) — or else the greedy covering
    subset of ``strength``.

    Raises:
        ValueError: ``rows`` that are not rows of the product or do not cover every combination of ``strength``.
    """
    if DEVICE == "cuda":
        return list(itertools.product(*factors))
    if rows is None:
        return covering(factors, strength)
    if not set(rows) <= set(itertools.product(*factors)) or not covers(rows, factors, strength):
        raise ValueError(f"the rows {rows} do not cover every combination of {strength} factors of {factors}")
    return rows
