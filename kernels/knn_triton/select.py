"""Scores and the streaming exact top-K of the fused kernel (jit helpers; docs/kernel.md, "Selection").

A candidate is kept as one int64 key: the high 32 bits an order-preserving int32 image of its fp32 score, the low 32
bits ``0x7FFFFFFF − column``, so that a larger key is a larger score and, among equal scores, the lower column (the
reference's tie rule). A query's running top K lives in ``K_PAD`` = next power of two ≥ K slots of an int64
``[rows, K_PAD]`` block: the top K_PAD − K slots are dead (always the empty key), the others hold the K best keys seen
so far, in no particular order. The row's threshold is the score of its smallest live key.

A score tile is merged in one of two ways (:func:`merge_tile`):

- while some row holds fewer than K keys and knows no floor (the first tile): the tile is packed, its top K_PAD
  taken with ``tl.topk`` and merged with the sorted accumulator (``max`` of an ascending and a descending list is
  the top half of their union, as a bitonic sequence);
- afterwards, candidates enter one row maximum at a time: as many times as the most entries a row has (at most K,
  since a tile's K best are all it can contribute), each row's tile maximum, if it beats the row's threshold,
  replaces the row's smallest live key and is removed from the tile. Tiles where no row's maximum beats its
  threshold cost one row-max reduction: about as much as flash attention's running max. Keys are visited in
  increasing column order, so a score equal to the threshold has a larger column and cannot enter: the strict test
  is exact.

A warm start (``WARM``) gives each row a floor before the stream: a score that at least as many candidates reach
as the row must find, so no key below it can rank. A row not yet full then takes only keys ≥ its floor, one row
maximum at a time as a full row does (its smallest live slot is empty), so tiles far below every floor cost one
row-max reduction from the first tile on. Ties with the floor all enter; among them the packed keys keep the lower
columns, and once the row is full the strict test applies as above.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NORM_EPS = 1e-12  # F.normalize's eps: x̂ = x / max(‖x‖, eps)
_NORM_EPS = tl.constexpr(NORM_EPS)
INDEX_MASK = tl.constexpr(0x7FFFFFFF)  # low half of a key: column ^ mask = 0x7FFFFFFF − column
EMPTY_KEY = tl.constexpr(-(2**63))  # an empty slot: below the packed −inf of every real candidate
_TOP_KEY = tl.constexpr(2**63 - 1)
NEG_INF = tl.constexpr(float("-inf"))
POS_INF = tl.constexpr(float("inf"))  # the ranking score of a forced (self_first) candidate
_MAX_SCORE = tl.constexpr(torch.finfo(torch.float32).max)  # +∞ scores count as this (reference.canonical_scores)
TINY = tl.constexpr(torch.finfo(torch.float32).tiny)  # the blend's smallest spread (reference.blend_scores)


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    """a @ b with fp32 accumulation; exact fp32 products for fp32 inputs (TF32 changes selections)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def inv_norm(x):
    """1 / max(‖x‖, eps) per row of an fp32 [rows, D] block (F.normalize semantics)."""
    return 1.0 / tl.maximum(tl.sqrt(tl.sum(x * x, axis=1)), _NORM_EPS)


@triton.jit
def canonical(s):
    """The reference's rule for non-finite scores: NaN → −∞, +∞ → the largest finite fp32."""
    return tl.where(s == s, tl.minimum(s, _MAX_SCORE), NEG_INF)


@triton.jit
def pack(scores, cols):
    """int64 key: order-preserving int32 image of the fp32 score (high) | 0x7FFFFFFF − column (low)."""
    scores = tl.where(scores == 0.0, 0.0, scores)  # −0.0 and +0.0 must tie
    return (image(scores).to(tl.int64) << 32) | (cols ^ INDEX_MASK).to(tl.int64)


@triton.jit
def image(s):
    """The order-preserving int32 image of fp32 ``s``: negative floats' bits reversed (NaN above +∞ or below −∞)."""
    bits = s.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & INDEX_MASK)


@triton.jit
def from_image(i):
    """The fp32 of an int32 image (:func:`image`'s inverse)."""
    return (i ^ ((i >> 31) & INDEX_MASK)).to(tl.float32, bitcast=True)


@triton.jit
def unpack_score(keys):
    return from_image((keys >> 32).to(tl.int32))


@triton.jit
def unpack_column(keys):
    return ((keys & INDEX_MASK) ^ INDEX_MASK).to(tl.int32)


@triton.jit
def column(x, slots, t):
    """x[:, t] of a [rows, K_PAD] block, t a run-time integer."""
    return tl.sum(tl.where(slots[None, :] == t, x, 0), axis=1)


@triton.jit
def kth_key(acc, live):
    """Per row: the smallest live key of the accumulator — its K-th key once full, EMPTY_KEY before."""
    return tl.min(tl.where(live[None, :], acc, _TOP_KEY), axis=1)


@triton.jit
def threshold(acc, live):
    """Per row: the score a candidate must beat (that of the smallest live key) and whether K keys are held."""
    kth = kth_key(acc, live)
    return unpack_score(kth), kth != EMPTY_KEY


@triton.jit
def enters(score, thr, full, floor, WARM: tl.constexpr):
    """Whether ``score`` may enter its row's accumulator: it beats the row's threshold ``thr`` (strict: a later
    column loses the tie); with ``WARM``, a row not yet ``full`` takes any score ≥ its floor instead. Arguments
    broadcast: a row's values ([rows]) against [rows] scores, or [rows, 1] against a [rows, BLOCK_N] tile."""
    ok = score > thr
    if WARM:
        ok = tl.where(full, ok, score >= floor)
    return ok


@triton.jit
def merge_top(acc, keys, live):
    """The accumulator ``acc`` [rows, K_PAD] and packed keys [rows, ≥ K_PAD] (EMPTY_KEY: none) → the top keys of
    both in the live slots, ascending: ``max`` of an ascending and a descending list is the top half of their union,
    a bitonic sequence, which one merge sorts. Returns acc."""
    acc = tl.bitonic_merge(tl.maximum(tl.sort(acc), tl.topk(keys, acc.shape[1])))
    return tl.where(live[None, :], acc, EMPTY_KEY)  # ascending: the K_PAD − K smallest slots are dead


@triton.jit
def merge_tile(acc, s, start, valid, live, floor, num_neighbors, WARM: tl.constexpr, K_PAD: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """Merge a [rows, BLOCK_N] tile of canonical fp32 scores of columns ``start + [0, BLOCK_N)`` into the
    accumulator ``acc`` [rows, K_PAD] (``live``: its live slots). ``valid`` [rows, BLOCK_N] marks real candidates;
    the others must score −∞. With ``WARM``, ``floor`` [rows] fp32 is a score at least as many candidates reach as
    the row must find (−∞: none known): a row not yet full takes only keys ≥ its floor, one row maximum at a time
    like a full row, and a tile whose maxima are all below what each row needs costs one row-max reduction.
    Returns acc."""
    thr, full = threshold(acc, live)
    offs = tl.arange(0, BLOCK_N)
    slots = tl.arange(0, K_PAD)
    if WARM:
        whole = (full == 0) & (floor == NEG_INF)  # rows without a floor take the tile's top K_PAD at once
    else:
        whole = full == 0
    if tl.max(whole.to(tl.int32), axis=0) > 0:
        keys = tl.where(valid & (s >= floor[:, None]), pack(s, start + offs[None, :]), EMPTY_KEY)
        acc = merge_top(acc, keys, live)
    elif tl.max(enters(tl.max(s, axis=1), thr, full, floor, WARM).to(tl.int32), axis=0) > 0:
        beats = enters(s, thr[:, None], full[:, None], floor[:, None], WARM)
        # At most a row's count of entries, and never more than K: its K best are all a tile can contribute.
        entries = tl.minimum(tl.max(tl.sum(beats.to(tl.int32), axis=1), axis=0), num_neighbors)
        for _ in range(entries):
            best, at = tl.max(s, axis=1, return_indices=True, return_indices_tie_break_left=True)
            enter = enters(best, thr, full, floor, WARM)
            # live keys are distinct; a row not yet full has an empty live slot, its smallest
            smallest = tl.argmin(tl.where(live[None, :], acc, _TOP_KEY), axis=1)
            acc = tl.where(enter[:, None] & (slots[None, :] == smallest[:, None]),
                           pack(best, start + at)[:, None], acc)
            s = tl.where(enter[:, None] & (offs[None, :] == at[:, None]), NEG_INF, s)
            thr, full = threshold(acc, live)
    return acc


# Lane selection (docs/kernel.md, "Lane selection"): the tile's column j is lane j. Each (row, lane) keeps its
# three best candidates of the stream — scores a1 ≥ a2 ≥ a3 with their columns c1, c2, c3 (−1: empty) — and
# ``over``, the largest score it dropped. Every step is elementwise (three compares and a fixed chain of min/max and
# selects): no reduction, no data-dependent round, so no row waits for the busiest one of its block.
LANE_ROTATION = tl.constexpr(13)  # tile t puts column start + (j + 13·t) mod BLOCK_N in lane j


@triton.jit
def lane_columns(start, t, BLOCK_N: tl.constexpr):
    """The columns of tile ``t`` (first column ``start``; ``t`` counted from the first tile of the whole candidate
    range, so a split range puts every column where the unsplit one does) in lane order: rotated by 13·t, so that a
    map's cells BLOCK_N apart (vertical neighbours, in raster order) fall into different lanes. Within a lane the
    columns still increase from tile to tile, so a later candidate of a lane loses a tie, as the reference's rule
    says."""
    return start + ((tl.arange(0, BLOCK_N) + t * LANE_ROTATION) & (BLOCK_N - 1))  # BLOCK_N: a power of two


@triton.jit
def lane_empty(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The lane state of no candidate: (a1, a2, a3, c1, c2, c3, over), each [BLOCK_M, BLOCK_N]."""
    a = tl.full([BLOCK_M, BLOCK_N], NEG_INF, tl.float32)
    c = tl.full([BLOCK_M, BLOCK_N], -1, tl.int32)
    return a, a, a, c, c, c, a


@triton.jit
def lane_insert(a1, a2, a3, c1, c2, c3, over, s, cols):
    """Enter the scores ``s`` [rows, BLOCK_N] of columns ``cols`` [BLOCK_N] (lane j ← column cols[j]): each lane
    keeps its three best (strict tests: an equal later score ranks below) and ``over`` takes the largest score that
    leaves the lane. The scores need not be canonical: every step is a compare or a select on the compares, and a
    NaN fails every compare, so it never enters a lane and leaves ``over`` as it was (``max`` takes the number), as
    −∞ does (an empty slot is −∞ too); a +∞ enters like any score (:func:`lane_merge` does not certify its row).
    Returns the new state."""
    col = cols[None, :]
    g1 = s > a1
    g2 = s > a2
    g3 = s > a3
    over = tl.maximum(over, tl.where(g3, a3, s))  # what leaves: a3 if s enters, else s
    c3 = tl.where(g2, c2, tl.where(g3, col, c3))
    c2 = tl.where(g1, c1, tl.where(g2, col, c2))
    c1 = tl.where(g1, col, c1)
    a3 = tl.where(g2, a2, tl.where(g3, s, a3))
    a2 = tl.where(g1, a1, tl.where(g2, s, a2))
    a1 = tl.where(g1, s, a1)
    return a1, a2, a3, c1, c2, c3, over


@triton.jit
def lane_insert2(a1, a2, c1, c2, over, s, cols):
    """:func:`lane_insert` for lanes of two entries (``LANE_DEPTH`` = 2): each lane keeps its two best, ``over``
    takes the largest score that leaves it. Returns (a1, a2, c1, c2, over)."""
    col = cols[None, :]
    g1 = s > a1
    g2 = s > a2
    over = tl.maximum(over, tl.where(g2, a2, s))
    c2 = tl.where(g1, c1, tl.where(g2, col, c2))
    c1 = tl.where(g1, col, c1)
    a2 = tl.where(g1, a1, tl.where(g2, s, a2))
    a1 = tl.where(g1, s, a1)
    return a1, a2, c1, c2, over


@triton.jit
def lane_merge(acc, live, a1, a2, a3, c1, c2, c3, over, num_neighbors):
    """Take each row's K best candidates from its lanes and ``acc`` (at most one key: the query's own), best first:
    a round takes the row's best lane head — the largest score (an fp32 row maximum), then among the heads with that
    score the lowest column (an int32 row minimum): the larger key, as :func:`pack` orders them; a lane's list is
    sorted that way, so the row's best remaining candidate is a head — and moves that lane's list up by one (columns
    are distinct, so the column alone finds the lane). K rounds of two 32-bit row reductions; no int64 copy of the
    lanes. Returns ``acc`` (ascending, [rows, K_PAD], the K keys in its top K slots as :func:`merge_tile` keeps them),
    whether each row is certified — it holds K keys, no lane holds a +∞ (the stream's scores are not canonical: the
    repair ranks +∞ as the largest finite score, as the reference does) and every score a lane dropped is below its
    K-th score (a dropped candidate ranks below the K-th then, whatever its column) —, the row's K-th key [rows]
    int64 (EMPTY_KEY: not full) and the one lane a row not certified must have rescanned (−1: rescan every lane):
    a full row whose lanes hold no +∞ and where one lane alone dropped, or still holds past the rounds, a score
    within :func:`lowered`'s margin of the K-th. Every key of the row's true top K is then among its K keys or that
    lane's columns, whatever bits its scores get where they are scored again (the deferred repair's gather).
    """
    K_PAD: tl.constexpr = acc.shape[1]
    slots = tl.arange(0, K_PAD)
    finite_top = tl.max(a1, axis=1) < POS_INF  # a +∞ (the stream's scores are not canonical): the repair ranks it
    first = tl.max(acc, axis=1)
    acc = tl.full(acc.shape, EMPTY_KEY, tl.int64)
    for r in range(num_neighbors):
        best_score = tl.max(a1, axis=1)
        best_col = tl.min(tl.where(a1 == best_score[:, None], c1, INDEX_MASK), axis=1)  # −1: the lanes are empty
        best = tl.where(best_col >= 0, pack(best_score, best_col), EMPTY_KEY)
        from_lane = best > first
        taken = from_lane[:, None] & (c1 == best_col[:, None])
        a1 = tl.where(taken, a2, a1)
        a2 = tl.where(taken, a3, a2)
        a3 = tl.where(taken, NEG_INF, a3)
        c1 = tl.where(taken, c2, c1)
        c2 = tl.where(taken, c3, c2)
        c3 = tl.where(taken, -1, c3)
        best = tl.maximum(best, first)
        first = tl.where(from_lane, first, EMPTY_KEY)
        acc = tl.where(slots[None, :] == K_PAD - 1 - r, best[:, None], acc)
    kth = kth_key(acc, live)
    full = kth != EMPTY_KEY
    certified = full & finite_top & (tl.max(over, axis=1) < unpack_score(kth))
    low = unpack_score(lowered(kth))[:, None]
    suspect = (over >= low) | (a1 >= low)  # [rows, lanes]: a key of the true top K may have left or stayed here
    lanes = tl.arange(0, a1.shape[1])
    lane = tl.max(tl.where(suspect, lanes[None, :], -1), axis=1)
    lane = tl.where(full & finite_top & (tl.sum(suspect.to(tl.int32), axis=1) == 1), lane, -1)
    return acc, certified, kth, lane


@triton.jit
def repair_tile(acc, keys, live, floor, num_neighbors):
    """Enter a tile's packed keys [rows, BLOCK_N] (EMPTY_KEY: not a candidate) into ``acc`` (ascending, [rows,
    K_PAD]), in any column order: a row not yet full takes the keys ≥ its ``floor`` key [rows] one row maximum at a
    time, a full row those above its K-th key. Keys compare whole (score, then the lower column), so ties need no
    order of the stream. The lanes' repair: their K-th key is each failed row's floor (K candidates reach it, so
    every key of the row's true top K does). Returns acc."""
    slots = tl.arange(0, acc.shape[1])
    keys = tl.where(keys >= floor[:, None], keys, EMPTY_KEY)
    kth = kth_key(acc, live)
    entries = tl.minimum(tl.max(tl.sum((keys > kth[:, None]).to(tl.int32), axis=1), axis=0), num_neighbors)
    for _ in range(entries):
        best = tl.max(keys, axis=1)
        smallest = tl.argmin(tl.where(live[None, :], acc, _TOP_KEY), axis=1)  # a row not full: an empty slot
        enter = best > kth
        acc = tl.where(enter[:, None] & (slots[None, :] == smallest[:, None]), best[:, None], acc)
        keys = tl.where(keys == best[:, None], EMPTY_KEY, keys)
        kth = kth_key(acc, live)
    return acc


REPAIR_MARGIN = tl.constexpr(2.0**-10)  # lowered: relative, and the same times 2^-6 absolute


@triton.jit
def lowered(floor):
    """A floor key [rows] int64 lowered to the smallest key of a score below the floor's by 2^-10 of its magnitude
    plus 2^-16: every score within that of the floor's score passes it, whatever bits the score gets where it is
    recomputed (the same columns in the same places of their tiles, but the row in another block: fp32 dot
    products that round differently there stay far inside that). EMPTY_KEY stays EMPTY_KEY (a row not full: no
    floor)."""
    score = tl.minimum(unpack_score(floor), _MAX_SCORE)  # a forced self ranks +∞
    low = score - (tl.abs(score) * REPAIR_MARGIN + REPAIR_MARGIN * 2.0**-6)
    return tl.where(floor == EMPTY_KEY, EMPTY_KEY, pack(low, tl.full(floor.shape, 0x7FFFFFFF, tl.int32)))


# Packed lanes (docs/kernel.md, "Packed lanes"): a lane's entry is one int32, the order-preserving image of its fp32
# score with its low bits replaced by its tile's code (earlier tiles larger): entries compare whole with one integer
# min or max, and a lane's list stays sorted by a fixed min/max chain — no compare, no select, no column carried. The
# column is the lane and the tile (:func:`lane_columns`). The score keeps 19 of its 23 mantissa bits: two scores
# closer than 2^-19 of their magnitude may swap, a near-tie within the every-row check's tolerance.
PACKED_TILES = tl.constexpr(16)  # the most tiles a packed stream takes: their codes fill the low 4 bits
_TILE_MASK = tl.constexpr(PACKED_TILES.value - 1)
EMPTY_ENTRY = tl.constexpr(-(2**31))  # below the entry of every score, −∞ and NaN included
_IMAGE_POS_INF = tl.constexpr(0x7F800000)  # the image of +∞: an entry at or above it is a +∞ or a NaN
_IMAGE_NEG_INF = tl.constexpr(-(2**31) + 0x7FFFFF)  # the image of −∞: 0xFF800000 ^ 0x7FFFFFFF as an int32


@triton.jit
def entry(s, code, SHIFTED: tl.constexpr):
    """A packed lane entry (int32, ``s``'s shape) of raw fp32 scores ``s`` from the tile of ``code`` (int32,
    PACKED_TILES − 1 − the tile's index in its range; 0 gives the lowest entry of a score's bits): the score's
    order-preserving image, its low bits the code. ``SHIFTED`` (cosine scores, in [−1, 1]): the image is the bits of
    s + 1, which are ordered as integers while s + 1 ≥ 0 (an entry below 0 is a score below −1 by rounding, or −∞:
    never certified as a K-th); one instruction instead of four. Otherwise any fp32 (−0.0 counts as +0.0)."""
    if SHIFTED:
        bits = (s + 1.0).to(tl.int32, bitcast=True)
    else:
        bits = image(s + 0.0)  # −0.0 + 0.0 = +0.0
    return (bits & ~_TILE_MASK) | code


@triton.jit
def entry_score(e, SHIFTED: tl.constexpr):
    """The fp32 score of packed entries: the code's bits cleared, which rounds the score down (toward −∞) by less
    than 2^-19 of its magnitude (``SHIFTED``: of s + 1, so by less than 2^-19 + 2^-24)."""
    e = e & ~_TILE_MASK
    if SHIFTED:
        return e.to(tl.float32, bitcast=True) - 1.0
    return from_image(e)


@triton.jit
def packed_empty(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DEPTH: tl.constexpr):
    """The packed lane state of no candidate: (e1, e2, e3, e4, over), [BLOCK_M, BLOCK_N] int32 each (the levels
    past ``DEPTH``: a scalar, never read)."""
    e = tl.full([BLOCK_M, BLOCK_N], EMPTY_ENTRY, tl.int32)
    e3 = EMPTY_ENTRY
    if DEPTH >= 3:
        e3 = e
    e4 = EMPTY_ENTRY
    if DEPTH >= 4:
        e4 = e
    return e, e, e3, e4, e


@triton.jit
def packed_insert(e1, e2, e3, e4, over, x, DEPTH: tl.constexpr):
    """Enter packed entries ``x`` [rows, BLOCK_N] into lanes of ``DEPTH`` (2–4) sorted entries e1 ≥ e2 ≥ …: each
    level becomes max(itself, min(the level above, x)) — the sorted insertion, since min(e_i, x) is what moves down
    from the level above — and ``over`` max(over, min(the last level, x)), what leaves: 2·DEPTH + 1 integer min/max,
    the same chain for every row and lane. Each level is computed from the old state alone, the deepest first, so
    the new state takes the old one's registers (the chain written level by level left Triton 3.6 ≈ 65 register
    copies a tile at the loop's end: 556 → 489 SASS instructions a tile, bench/sass_count.py). Returns the new
    state."""
    if DEPTH >= 4:
        over = tl.maximum(over, tl.minimum(e4, x))
        e4 = tl.maximum(e4, tl.minimum(e3, x))
    elif DEPTH == 3:
        over = tl.maximum(over, tl.minimum(e3, x))
    else:
        over = tl.maximum(over, tl.minimum(e2, x))
    if DEPTH >= 3:
        e3 = tl.maximum(e3, tl.minimum(e2, x))
    e2 = tl.maximum(e2, tl.minimum(e1, x))
    return tl.maximum(e1, x), e2, e3, e4, over


@triton.jit
def packed_merge(acc, live, e1, e2, e3, e4, over, num_neighbors, col_lo, first_tile, DEPTH: tl.constexpr,
                 SHIFTED: tl.constexpr):
    """:func:`lane_merge` for packed lanes (tile t of the range ``col_lo`` onwards, tile ``first_tile`` + t of the
    whole range, put column col_lo + t·BLOCK_N + (j + 13·(first_tile + t)) mod BLOCK_N in lane j, with code
    PACKED_TILES − 1 − t): K rounds, each taking the row's largest head (an int32 row maximum; among equal heads
    the lowest lane, an int32 row minimum) or its key in ``acc`` (the query's own, forced or first), whichever
    is larger, and moving that lane up by one. Returns (acc — ascending, [rows, K_PAD], the K keys in its top K
    slots, each an int64 key of its entry's score and column —, certified, the K-th key [rows]; EMPTY_KEY: not
    full). A row is certified when it holds K keys, no lane holds a +∞ or NaN entry, every entry a lane dropped is
    below its K-th, and no two entries it took or the next one after them are equal (equal entries are one tile's
    equal scores in two lanes, which the lowest lane need not rank by column)."""
    K_PAD: tl.constexpr = acc.shape[1]
    BLOCK_N: tl.constexpr = e1.shape[1]
    slots = tl.arange(0, K_PAD)
    lanes = tl.arange(0, BLOCK_N)
    finite_top = tl.max(e1, axis=1) < _IMAGE_POS_INF
    first = tl.max(acc, axis=1)
    acc = tl.full(acc.shape, EMPTY_KEY, tl.int64)
    last = tl.full(first.shape, EMPTY_ENTRY, tl.int32)  # the last entry taken from a lane
    kth_entry = last  # the K-th as an entry: the last taken, or the own key's score's image, code cleared
    tie = tl.zeros(first.shape, tl.int1)
    for r in range(num_neighbors):
        best = tl.max(e1, axis=1)
        lane = tl.min(tl.where(e1 == best[:, None], lanes[None, :], BLOCK_N), axis=1)
        t = _TILE_MASK - (best & _TILE_MASK)
        col = col_lo + t * BLOCK_N + ((lane + (first_tile + t) * LANE_ROTATION) & (BLOCK_N - 1))
        # canonical: a NaN entry (above +∞; its row is not certified) must not make the repair's floor NaN
        key = tl.where(best != EMPTY_ENTRY, pack(canonical(entry_score(best, SHIFTED)), col), EMPTY_KEY)
        from_lane = key > first
        tie = tie | (from_lane & (best == last))
        last = tl.where(from_lane, best, last)
        kth_entry = tl.where(from_lane, best, entry(unpack_score(first), 0, SHIFTED))
        taken = from_lane[:, None] & (lanes[None, :] == lane[:, None])
        e1 = tl.where(taken, e2, e1)
        if DEPTH == 2:
            e2 = tl.where(taken, EMPTY_ENTRY, e2)
        else:
            e2 = tl.where(taken, e3, e2)
            if DEPTH == 3:
                e3 = tl.where(taken, EMPTY_ENTRY, e3)
            else:
                e3 = tl.where(taken, e4, e3)
                e4 = tl.where(taken, EMPTY_ENTRY, e4)
        acc = tl.where(slots[None, :] == K_PAD - 1 - r, tl.maximum(key, first)[:, None], acc)
        first = tl.where(from_lane, first, EMPTY_KEY)
    tie = tie | ((last != EMPTY_ENTRY) & (tl.max(e1, axis=1) == last))
    kth = kth_key(acc, live)
    full = kth != EMPTY_KEY
    if SHIFTED:
        finite_kth = kth_entry >= 0
    else:
        finite_kth = kth_entry > _IMAGE_NEG_INF
    certified = full & finite_top & finite_kth & (tl.max(over, axis=1) < kth_entry) & (tie == 0)
    return acc, certified, kth
