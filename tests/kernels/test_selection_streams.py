"""The streaming top-K against key orders built to defeat a threshold: ascending scores (every tile beats the
running threshold: the most insertions), descending (none after the first tile), all equal (ties everywhere:
lower index first), many +∞ (overflowing products rank as the largest finite score, ties to the lower index),
NaN keys (rank last, weigh 0), K = 1 and K = 128, N = 139: not a multiple of any block size, and past the 128
columns of the repair's tiles (and of K = 128's), so that every stream ends in a partial tile.

Integer-valued features make every fp32 score exact, so the kernel must return the reference's sets exactly,
in the same order, on every row (``every_row.check_every_row`` with no near-tie allowed). Tiles of 16 keys
(config override) give many tiles at interpreter-friendly sizes; the rows of a query block stream the same tiles
independently, so the plain streams take the kernel's default 64-row query blocks (the interpreter's cost is per
block and tile). The same streams with a warm start (``WARM``: two tiles around each query block set the rows'
floors first) test the floor against ties with it (all equal), −∞ floors (NaN keys) and ascending keys that beat
the floor late, on 16-row query blocks: 9 blocks, each warmed by the tiles around its own middle query.

Both selection loops run every stream (``LANES``: the lane selection, its certificate and the deferred repair; the
insertion rounds alone); the lanes with K = 1, 9, 16, 64 and 128, and lanes of two entries at K = 9, 16. Further
streams aimed at the lanes: one that puts a row's best keys into a single lane, so that the certificate fails and
the repair must find them (split and unsplit; deferred, with two or three entries a lane, or in the row's own
block), and spatially smooth features in raster order (a map's neighbours a tile apart share a lane without the
rotation).

On a GPU every combination of stream, K and candidate set runs; in the interpreter (CI) a covering subset
(``cases.kernel_cases``): every stream and every K still, in fewer of their combinations.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernels.knn_triton import forward, function
from tests.kernels.cases import kernel_cases
from tests.kernels.every_row import DEVICE, check_every_row


def _keys(stream: str, n: int, dim: int, gen: torch.Generator) -> torch.Tensor:
    j = torch.arange(n, dtype=torch.float32)
    if stream == "ascending":
        first = j
    elif stream == "descending":
        first = n - j
    elif stream == "equal":
        first = torch.ones(n)
    else:  # "inf", "nan": small random integers, a third of the keys overflowing or NaN
        first = torch.randint(-4, 5, (n,), generator=gen).float()
    k = torch.zeros(n, dim)
    k[:, 0] = first
    k[:, 1:] = torch.randint(-2, 3, (n, dim - 1), generator=gen).float() if stream in ("inf", "nan") else 0
    if stream == "inf":
        k[::3, 0] = 3e38  # × q's 2 overflows to +∞ in fp32
    if stream == "nan":
        k[1::3, 0] = math.nan
    return k


STREAMS = ["ascending", "descending", "equal", "inf", "nan"]


def _lane_cases() -> list[tuple]:
    """Every stream at every (K, candidates) on a GPU; in the interpreter every stream and every (K, candidates)
    once, the slowest cases there (repairs of many rows at K = 64 and 128) on the streams that repair least."""
    sizes = [(1, "all"), (9, "all"), (16, "all"), (64, "all"), (128, "all"), (9, "random")]
    cheap = [("ascending", (64, "all")), ("descending", (128, "all")), ("equal", (16, "all")), ("inf", (9, "all")),
             ("nan", (9, "random")), ("descending", (1, "all"))]
    return [(stream, k, candidates) for stream, (k, candidates) in kernel_cases([STREAMS, sizes], 1, cheap)]


@pytest.mark.parametrize("stream, num_neighbors, candidates",
                         kernel_cases([STREAMS, [1, 9, 128], ["all", "random"]], strength=1))
def test_adversarial_streams_select_exactly_the_reference_sets(stream, num_neighbors, candidates):
    _check_stream(stream, num_neighbors, candidates, warm=0, lanes=False)


@pytest.mark.parametrize("stream, num_neighbors, candidates", _lane_cases())
def test_the_lane_selection_selects_exactly_the_reference_sets(stream, num_neighbors, candidates):
    _check_stream(stream, num_neighbors, candidates, warm=0, lanes=True)


@pytest.mark.parametrize("stream, num_neighbors, candidates, depth", kernel_cases(
    [STREAMS, [1, 9, 16, 64, 128], ["all", "random"], [2, 3, 4]], strength=1,
    rows=[("ascending", 64, "all", 4), ("descending", 128, "all", 3), ("inf", 16, "random", 2),
          ("equal", 9, "all", 3), ("nan", 1, "random", 4)]))  # not K = 64 with sampled +∞: 36 s in the interpreter
def test_packed_lanes_select_exactly_the_reference_sets(stream, num_neighbors, candidates, depth):
    """``PACKED``: a lane's entries are one int32 each (the score's image, its low bits the tile), kept by a min/max
    chain; equal entries (one tile's equal scores in two lanes) send the row to the repair."""
    _check_stream(stream, num_neighbors, candidates, warm=0, lanes=True, depth=depth, packed=True)


@pytest.mark.parametrize("stream, num_neighbors", kernel_cases([STREAMS, [9, 16]], strength=1))
def test_lanes_of_two_entries_select_exactly_the_reference_sets(stream, num_neighbors):
    """``LANE_DEPTH`` = 2: a lane keeps two entries, so many more rows go to the (deferred) repair."""
    _check_stream(stream, num_neighbors, "all", warm=0, lanes=True, depth=2)


@pytest.mark.parametrize("stream, num_neighbors", [  # the interpreter: four streams at K = 1, 9, 128 (ascending: 11 s)
    ("descending", 1), ("equal", 9), ("inf", 9), ("nan", 128),
    *([("ascending", 9), ("descending", 9), ("nan", 9), ("equal", 128)] if DEVICE == "cuda" else [])])
def test_a_warm_start_selects_exactly_the_reference_sets(stream, num_neighbors):
    _check_stream(stream, num_neighbors, "all", warm=2, lanes=False)


def _check_stream(stream, num_neighbors, candidates, warm, lanes, depth=3, defer=True, packed=False):
    # N = 139: not a multiple of 16, 64 or 128, and just past 128, so that the stream's tiles (16 to 128 keys) and
    # the deferred repair's (128) end in a partial one; 3 query blocks of 64 rows (9 of 16 with a warm start). K = 128
    # (128-key tiles, slow in the interpreter) on one sample. Every key set is shared by the batch, so a second
    # sample only adds one for sampled candidates (its own draw, read at its own row of the candidate tensor); for
    # every key it would repeat the first sample's scores (ascending, descending, equal: the queries' other features
    # meet zeros) or just draw other small integers.
    batch, n, dim = 2 if candidates == "random" and num_neighbors < 128 else 1, 139, 4
    gen = torch.Generator().manual_seed(num_neighbors + 2)  # + 2: the lanes' NaN stream (K = 9) has rows to repair
    k = _keys(stream, n, dim, gen)
    q = torch.zeros(batch, 1, n, dim)
    q[..., 0] = 2.0
    q[:, :, :, 1:] = torch.randint(-1, 2, (batch, 1, n, dim - 1), generator=gen).float()
    k = k.expand(batch, 1, n, dim).contiguous()
    v = torch.randint(-3, 4, (batch, 1, n, 3), generator=gen).float()
    weight = torch.randint(-2, 3, (5, 3, num_neighbors), generator=gen).float()
    cand = None
    if candidates == "random":  # 130 of the keys, each sample its own draw: candidate columns 1–130
        cand = torch.stack([torch.randperm(n, generator=gen)[:130] for _ in range(batch)])
    options = dict(num_neighbors=num_neighbors, similarity="dot", weighting="softmax", temperature=1.0, groups=1,
                   candidates=cand, self_first=stream == "descending")
    q, k, v, weight = (x.to(DEVICE) for x in (q, k, v, weight))
    cand = None if cand is None else cand.to(DEVICE)
    options["candidates"] = cand
    result = function.launch_forward(q, k, v, weight, None, *options.values(),
                                     config=dict(BLOCK_M=16 if warm else 64, BLOCK_N=max(16, num_neighbors),
                                                 LANES=lanes, LANE_DEPTH=depth, DEFER=defer, WARM=warm,
                                                 PACKED=packed))
    check_every_row(result, q, k, v, weight, **options, max_tie_share=0)


def _one_lane_keys(n: int, block_n: int, wanted: int) -> torch.Tensor:
    """Keys whose ``wanted`` highest dot scores with q = e₀ all fall into lane 0 of the lane selection's tiles of
    ``block_n`` columns (tile t puts column t·block_n + (13·t mod block_n) there): 3 of them stay in the lane, so
    the row's other best keys come from elsewhere and the dropped score beats its K-th: the certificate fails."""
    k = torch.zeros(n, 4)
    k[:, 0] = torch.arange(n) % 7 - 3.0  # everything else scores −3 … 3
    tiles = torch.arange(wanted)
    lane0 = tiles * block_n + (13 * tiles) % block_n
    assert lane0.max() < n
    k[lane0, 0] = 100.0 - tiles.float()  # the best keys, distinct scores
    return k


@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("defer, depth, packed", [(True, 3, False), (True, 2, False), (False, 3, False),
                                                  (True, 3, True), (False, 4, True)])
def test_a_row_the_lanes_cannot_certify_is_repaired(num_splits, defer, depth, packed):
    """Every query's 8 best keys sit in one lane (:func:`_one_lane_keys`): the lanes keep 3 (or 2) of them, the row
    is not certified, and the repair streams the tiles again (packed keys compared whole) from the lanes' K-th key
    as the floor: deferred (``DEFER``: the failed rows of every block in one list per sample and split, repaired
    together by ``knn_fwd_repair``) or in the failed row's own block; lanes of separate scores and columns, or
    packed (``PACKED``).
    Rows of other blocks (keys of their own) are certified and must come through the repair untouched. Exact
    integer scores: the reference's sets, ties included, with and without a split candidate range."""
    n, block_n, K = 139, 16, 9
    k = _one_lane_keys(n, block_n, K - 1).expand(2, 1, n, 4).contiguous()
    q = torch.zeros(2, 1, n, 4)
    q[..., 0] = 1.0
    q[1, :, :70, 0] = -1.0  # sample 1: half its rows prefer the other end of the stream
    gen = torch.Generator().manual_seed(3)
    v = torch.randint(-3, 4, (2, 1, n, 3), generator=gen).float()
    weight = torch.randint(-2, 3, (5, 3, K), generator=gen).float()
    options = dict(num_neighbors=K, similarity="dot", weighting="softmax", temperature=1.0, groups=1,
                   candidates=None, self_first=False)
    q, k, v, weight = (x.to(DEVICE) for x in (q, k, v, weight))
    result = function.launch_forward(q, k, v, weight, None, *options.values(), num_splits=num_splits,
                                     config=dict(BLOCK_M=64, BLOCK_N=block_n, LANES=True, DEFER=defer,
                                                 LANE_DEPTH=depth, PACKED=packed))
    check_every_row(result, q, k, v, weight, **options, max_tie_share=0)


@pytest.mark.parametrize("depth, self_first", [(2, False), (3, True)])
def test_a_row_with_one_lane_to_rescan_is_repaired_from_its_keys_and_that_lane(depth, self_first, monkeypatch):
    """As above, but every other key scores distinctly below the lane's 8 (−column): a failed row's one suspect
    lane is lane 0, so the deferred repair with ``GATHER`` scores only the row's K keys and lane 0's 9 columns
    (``forward._gather_repair``) and streams no tile; the reference's sets, exactly, with and without a forced self.
    In the interpreter the launch is watched: every repaired block gathers."""
    n, block_n, K = 139, 16, 9
    k = _one_lane_keys(n, block_n, K - 1)
    k[:, 0] = torch.where(k[:, 0] >= 90, k[:, 0], -torch.arange(n).float())
    k = k.expand(2, 1, n, 4).contiguous()
    q = torch.zeros(2, 1, n, 4)
    q[..., 0] = 1.0
    q[1, :, :70, 0] = -1.0  # sample 1: half its rows prefer the other end of the stream (certified)
    gen = torch.Generator().manual_seed(4)
    v = torch.randint(-3, 4, (2, 1, n, 3), generator=gen).float()
    weight = torch.randint(-2, 3, (5, 3, K), generator=gen).float()
    options = dict(num_neighbors=K, similarity="dot", weighting="softmax", temperature=1.0, groups=1,
                   candidates=None, self_first=self_first)
    paths = []
    if DEVICE == "cpu":
        for name in ("_gather_repair", "_repair"):
            helper = getattr(forward, name)
            monkeypatch.setattr(forward, name, lambda *a, name=name, helper=helper, **kw: paths.append(name)
                                or helper(*a, **kw))
    q, k, v, weight = (x.to(DEVICE) for x in (q, k, v, weight))
    result = function.launch_forward(q, k, v, weight, None, *options.values(), num_splits=1,
                                     config=dict(BLOCK_M=64, BLOCK_N=block_n, LANES=True, DEFER=True,
                                                 LANE_DEPTH=depth, GATHER=True, PACKED=False))
    check_every_row(result, q, k, v, weight, **options, max_tie_share=0)
    if DEVICE == "cpu":
        assert paths and set(paths) == {"_gather_repair"}


# K = 16 on a GPU only: 6 s more in the interpreter
@pytest.mark.parametrize("num_neighbors", [9, *([16] if DEVICE == "cuda" else [])])
def test_spatially_smooth_features_in_raster_order_select_the_reference_sets(num_neighbors):
    """Features that vary slowly over a 10×16 map, streamed in raster order: a query's best keys are its
    neighbourhood, and cells a tile (16 columns here, the map's width) apart are vertical neighbours. Integer
    features (rounded from a smooth field) and dot scores keep every score exact, so both loops must return the
    reference's sets."""
    gen = torch.Generator().manual_seed(num_neighbors)
    height, width, dim = 10, 16, 4
    field = torch.nn.functional.interpolate(torch.randn(1, dim, 4, 4, generator=gen) * 6, size=(height, width),
                                            mode="bilinear", align_corners=True)
    x = field.round().flatten(2).transpose(1, 2)[:, None].contiguous()  # (1, 1, 160, 4)
    v = torch.randint(-3, 4, (1, 1, height * width, 3), generator=gen).float()
    weight = torch.randint(-2, 3, (5, 3, num_neighbors), generator=gen).float()
    options = dict(num_neighbors=num_neighbors, similarity="dot", weighting="softmax", temperature=1.0, groups=1,
                   candidates=None, self_first=True)
    x, v, weight = (t.to(DEVICE) for t in (x, v, weight))
    for lanes, packed in ((True, False), (True, True), (False, False)):
        result = function.launch_forward(x, x, v, weight, None, *options.values(),
                                         config=dict(BLOCK_N=16, LANES=lanes, PACKED=packed))
        check_every_row(result, x, x, v, weight, **options, max_tie_share=0)


def test_a_dropped_score_equal_to_the_kth_sends_the_row_to_the_repair():
    """Columns 0, 29, 42 and 55 share lane 0 of 16-column tiles (rotated by 13 per tile): 0 scores 1, the others
    9. The lane keeps the three 9s and drops column 0, whose score equals the row's K-th (K = 4: column 60's 1, in
    another lane). Certifying on "dropped ≤ K-th" would return column 60; the certificate is strict, the row is
    repaired, and column 0 wins the tie, as in the reference."""
    n, K = 64, 4
    k = torch.zeros(1, 1, n, 4)
    k[0, 0, [29, 42, 55], 0] = 9.0
    k[0, 0, [0, 60], 0] = 1.0
    q = torch.zeros(1, 1, n, 4)
    q[..., 0] = 1.0
    v = torch.randint(-3, 4, (1, 1, n, 3), generator=torch.Generator().manual_seed(4)).float()
    weight = torch.randint(-2, 3, (5, 3, K), generator=torch.Generator().manual_seed(5)).float()
    options = dict(num_neighbors=K, similarity="dot", weighting="softmax", temperature=1.0, groups=1,
                   candidates=None, self_first=False)
    q, k, v, weight = (x.to(DEVICE) for x in (q, k, v, weight))
    for packed in (False, True):
        result = function.launch_forward(q, k, v, weight, None, *options.values(),
                                         config=dict(BLOCK_N=16, LANES=True, PACKED=packed))
        assert result[1][0, 0, 0].tolist() == [29, 42, 55, 0]
        check_every_row(result, q, k, v, weight, **options, max_tie_share=0)


@pytest.mark.parametrize("defer", [True, False])
def test_rows_with_fewer_usable_candidates_than_k_read_nothing_past_the_candidates(defer):
    """K = r + 1 sampled candidates: a sampled copy of the query scores −∞, so such rows have r usable candidates
    and the lanes leave them not full. The lanes' end (weights, Conv1D) runs on those rows before the deferred
    repair rewrites them, and an empty slot's column (0x7FFFFFFF) addressed candidates[b, 2³¹ − 2]: the interpreter
    died reading past the tensor. Now an empty slot reads nothing; the reference's sets, ties included."""
    n, r = 64, 8
    gen = torch.Generator().manual_seed(11)
    q, k = (torch.randint(-3, 4, (1, 1, n, 4), generator=gen).float() for _ in range(2))
    v = torch.randint(-3, 4, (1, 1, n, 3), generator=gen).float()
    weight = torch.randint(-2, 3, (5, 3, r + 1), generator=gen).float()
    options = dict(num_neighbors=r + 1, similarity="dot", weighting="softmax", temperature=1.0, groups=1,
                   candidates=torch.arange(r).view(1, r).to(DEVICE), self_first=False)
    q, k, v, weight = (x.to(DEVICE) for x in (q, k, v, weight))
    result = function.launch_forward(q, k, v, weight, None, *options.values(),
                                     config=dict(BLOCK_N=16, LANES=True, DEFER=defer))
    check_every_row(result, q, k, v, weight, **options, max_tie_share=0)
