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
    bits = scores.to(tl.int32, bitcast=True)
    image = bits ^ ((bits >> 31) & INDEX_MASK)  # negative floats: reverse their order
    return (image.to(tl.int64) << 32) | (cols ^ INDEX_MASK).to(tl.int64)


@triton.jit
def unpack_score(keys):
    image = (keys >> 32).to(tl.int32)
    bits = image ^ ((image >> 31) & INDEX_MASK)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def unpack_column(keys):
    return ((keys & INDEX_MASK) ^ INDEX_MASK).to(tl.int32)


@triton.jit
def column(x, slots, t):
    """x[:, t] of a [rows, K_PAD] block, t a run-time integer."""
    return tl.sum(tl.where(slots[None, :] == t, x, 0), axis=1)


@triton.jit
def threshold(acc, live):
    """Per row: the score a candidate must beat (that of the smallest live key) and whether K keys are held."""
    kth = tl.min(tl.where(live[None, :], acc, _TOP_KEY), axis=1)
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
        acc = tl.bitonic_merge(tl.maximum(tl.sort(acc), tl.topk(keys, K_PAD)))
        acc = tl.where(live[None, :], acc, EMPTY_KEY)  # ascending: the K_PAD − K smallest slots are dead
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
