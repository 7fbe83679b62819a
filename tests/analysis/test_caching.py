"""One byte budget over every analysis cache (analysis/caching.py), checked on the caches' own accounting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import analysis as an
from analysis import RuleOptions, attribution_map, image_from_array, rule_selection, trace_image
from analysis.session.caching import bounded_cache, nbytes
from analysis.session.models import _load_cached
from analysis.session.selections import Selection, _selection
from analysis.session.traces import _trace

MB = 2**20


@pytest.fixture
def budget():
    """``budget(max_bytes)`` sets the shared budget for this test; the default comes back after it."""
    before = an.cache_budget()
    yield an.set_cache_budget
    an.set_cache_budget(before)


def selection(size: int) -> Selection:
    return Selection(np.zeros(size, np.uint8), np.zeros(0, bool), np.zeros(0, np.float32))


def test_nbytes_counts_what_a_result_keeps_alive_once():
    tensor = torch.zeros(1000)  # 4000 bytes
    assert nbytes(tensor) == nbytes(tensor[10:20]) == 4000  # a view keeps its whole storage
    assert nbytes({"a": tensor, "b": (tensor[1:], tensor.numpy())}) == 4000  # one storage, however it is reached
    assert nbytes(selection(40)) == 40 and nbytes(torch.nn.Linear(10, 5)) == (50 + 5) * 4
    assert nbytes(np.zeros((4, 4), np.float64)[::2]) == 128  # a NumPy view: its base


def test_bounded_cache_evicts_the_least_recently_used_by_bytes_and_entries(budget):
    budget(100)
    calls = []

    @bounded_cache(max_entries=3)
    def make(size: int, tag: str) -> Selection:
        calls.append((size, tag))
        return selection(size)

    make(40, "a"), make(40, "b")
    make(40, "a")  # a is now the most recent
    make(40, "c")  # 120 bytes > 100: b goes
    assert make.cache_info().bytes == 80 and make.cache_info().currsize == 2
    make(40, "a"), make(40, "b")  # a hit, b recomputed (c goes)
    assert calls == [(40, "a"), (40, "b"), (40, "c"), (40, "b")]
    make(500, "huge"), make(500, "huge")  # larger than the budget on its own: returned, never kept
    assert calls[-2:] == [(500, "huge")] * 2 and make.cache_info().bytes == 80
    for tag in "xyz":
        make(1, tag)
    assert make.cache_info().currsize == 3  # the entry bound holds too
    make.cache_clear()
    assert make.cache_info() == (0, 0, 3, 0, 100, 0)


def test_an_object_many_keys_hold_is_counted_once_and_goes_with_its_last_entry(budget):
    budget(10 * MB)
    image = image_from_array(np.zeros((100, 100, 3), np.uint8))  # 30,000 bytes of pixels

    @bounded_cache(max_entries=2)
    def summarise(picture: an.InputImage, tag: int) -> Selection:
        return selection(1000)

    summarise(image, 1), summarise(image, 2)
    assert summarise.cache_info().bytes == 2 * 1000 + 30_000
    summarise(image_from_array(np.ones((10, 10, 3), np.uint8)), 3)  # entry bound 2: (image, 1) goes
    assert summarise.cache_info().bytes == 2 * 1000 + 30_000 + 300
    summarise(image_from_array(np.ones((10, 10, 3), np.uint8) * 2), 4)  # (image, 2) goes, and the image with it
    assert summarise.cache_info().bytes == 2 * 1000 + 2 * 300


def test_a_result_goes_with_the_cached_value_its_key_holds(budget):
    """A trace keyed by a loaded model would keep the model alive after the model cache let it go."""
    budget(10 * MB)

    @bounded_cache(max_entries=1)
    def parent(tag: str) -> Selection:
        return selection(100)

    @bounded_cache(max_entries=8)
    def child(value: Selection, tag: int) -> Selection:
        return selection(10)

    first = parent("a")
    child(first, 1), child(first, 2)
    assert child.cache_info().currsize == 2 and child.cache_info().bytes == 20  # the parent is counted by parent()
    child(first, 1)  # a hit renews the parent too
    parent("b")  # entry bound 1: "a" goes, and what was derived from it
    assert child.cache_info().currsize == 0 and child.cache_info().bytes == 0


def test_one_budget_bounds_every_analysis_cache(load_small, fresh_image, budget):
    """K = 1024 on a 32×32 map: each selection holds 1024 × 1024 × (2 int64 + bool + float32) = 21 MB. Selections
    were bounded on their own (128 MB), traces, q/k features, models, attributions… only in entries; now one budget
    (here 60 MB) holds them all, and what the caches count is what the results hold."""
    budget(60 * MB)
    _load_cached.cache_clear()  # every model, and with them everything derived from them
    loaded, layer = load_small("cnn-l0.5"), "stages.0.0.conv1"
    entry = 1024 * 1024 * (2 * 8 + 1 + 4)
    _selection.cache_clear()
    for alpha in np.linspace(0, 1, 6):
        options = RuleOptions(num_neighbors=1024, blend_alpha=float(alpha))
        assert nbytes(rule_selection(loaded, fresh_image, layer, "blend", options)) == entry
        attribution_map(loaded, fresh_image, "saliency", None)
        assert an.cache_usage()[1] <= 60 * MB
    info = _selection.cache_info()
    assert (info.misses, info.max_bytes) == (6, 60 * MB)
    assert info.currsize == 2 and info.bytes == 2 * entry + nbytes(fresh_image)  # 60 MB less models, traces, …
    trace = trace_image(loaded, fresh_image)
    assert _trace.cache_info().bytes == nbytes(trace) + nbytes(fresh_image)
    assert _load_cached.cache_info()[3:] == (1, 60 * MB, nbytes(loaded.model))
    rule_selection(loaded, fresh_image, layer, "blend", options)  # the latest is still kept
    rule_selection(loaded, fresh_image, layer, "blend", RuleOptions(num_neighbors=1024, blend_alpha=0.0))  # evicted
    assert _selection.cache_info()[:2] == (1, 7)


def test_a_smaller_budget_evicts_at_once(load_small, image, budget):
    trace_image(load_small("vit-convnn"), image)
    assert an.cache_usage()[1] > 0
    budget(0)
    assert an.cache_usage() == (0, 0)
    with pytest.raises(ValueError, match="the cache budget must be a whole number of bytes ≥ 0, got -1"):
        an.set_cache_budget(-1)
