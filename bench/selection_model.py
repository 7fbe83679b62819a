"""A CPU model of the fused forward's selection work, the insertion rounds against the lane selection, simulated on
the streams the kernel sees, with per-unit costs fitted to one GPU's measurements (no GPU needed to run it).

    python bench/selection_model.py --json bench/results/selection_model.json

It replays the stream of query blocks (64 rows, 64-column tiles) of each case — random q, k at the CIFAR kernel
configuration (N = 1024), as ``bench/kernel.py --parts by_k`` times them; the features entering the ConvNN layers
of shipped checkpoints on example images (``all`` and ``blend`` rules, the query forced first) — and counts:

- **rounds** (:func:`kernels.knn_triton.select.merge_tile`): tiles, and insertion rounds per block (the first tile
  merged whole; each later tile as many rounds as its busiest row has entries, at most K);
- **lanes** (:func:`kernels.knn_triton.select.lane_insert`): three candidates per (row, lane), tile t rotated by 13·t
  columns; whether each row is certified, and for a block with a row that is not, the rounds its repair takes (the
  rows not certified, each from its K-th score as the floor).

Time per block is then ``a·tiles + rounds·(b + c·K_PAD)`` for the rounds and ``d·tiles + e·K + (repaired: a·tiles
+ repair rounds·(b + c·K_PAD))`` for the lanes (``e·K``: the end of the row, K rounds of a row maximum); ``a``,
``b``, ``c`` are fitted to the rounds' times and ``d``, ``e`` to the lanes' times at K = 9 and 32 on the H100 of
bench/RESULTS.md §1g (``MEASURED``, one call). The model then predicts the lanes at K = 16 and 64 from the simulated
repairs, and the table says whether it orders the two loops as the GPU did. The simulation counts work; the fit
turns it into time on one GPU (its occupancy and MMA waits are in the fitted units, not modelled).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BLOCK_M, BLOCK_N, ROTATION, DEPTH = 64, 64, 13, 3
# bench/kernel.py --parts by_k on one H100 (2026-12-06, logs/2026-12-06_lane_end): fused forward ms, random q, k,
# cosine, softmax, d = 64, bf16; (N, number of query blocks, K) → (rounds, lanes).
MEASURED = {(1024, 2048, 9): (0.961, 0.891), (1024, 2048, 16): (1.584, 1.712), (1024, 2048, 32): (7.000, 4.155),
            (1024, 2048, 64): (12.940, 8.645)}
LANES_FITTED_AT = (9, 32)  # the lanes' d and e come from these K; the others are predicted
# bench/RESULTS.md §1j, one H100 (2026-12-06, logs/2026-12-06_deferred/ablate3.json): the lanes repaired in their
# own block against the deferred repair, same shapes, same call; K → (in-block ms, deferred ms).
MEASURED_DEFERRED = {9: (0.539, 0.553), 16: (0.963, 0.840), 32: (1.989, 1.496), 64: (5.588, 5.417)}


def _topk_sorted(x: np.ndarray, k: int) -> np.ndarray:
    """The k largest of each row, descending (ties: any order; real scores have none)."""
    part = -np.partition(-x, min(k, x.shape[1]) - 1, axis=1)[:, :k]
    return -np.sort(-part, axis=1)


def rounds_count(scores: np.ndarray, wanted: int, floor: np.ndarray | None = None) -> int:
    """Insertion rounds of one block's stream ``scores`` [rows, N] (−∞: not a candidate), each row finding
    ``wanted`` keys; with ``floor`` [rows] the rows take only scores ≥ it and start empty (the lanes' repair)."""
    rows, n = scores.shape
    acc = np.full((rows, wanted), -np.inf)
    rounds = 0
    for t, start in enumerate(range(0, n, BLOCK_N)):
        tile = scores[:, start:start + BLOCK_N]
        if floor is not None:
            tile = np.where(tile >= floor[:, None], tile, -np.inf)
        merged = _topk_sorted(np.concatenate([acc, tile], axis=1), wanted)
        if t > 0 or floor is not None:  # the first tile of the plain stream is merged whole
            entries = np.minimum((tile >= merged[:, -1:]).sum(axis=1), (tile > acc[:, -1:]).sum(axis=1))
            rounds += int(min(wanted, entries.max()))
        acc = merged
    return rounds


def lanes_certified(scores: np.ndarray, wanted: int, depth: int = DEPTH) -> tuple[np.ndarray, np.ndarray]:
    """Which rows of ``scores`` [rows, N] the lane selection with ``depth`` entries a lane certifies, and each row's
    K-th score (its floor)."""
    rows, n = scores.shape
    tiles = -(-n // BLOCK_N)
    t = np.arange(tiles)[:, None]
    cols = t * BLOCK_N + (np.arange(BLOCK_N)[None, :] + t * ROTATION) % BLOCK_N
    lanes = np.where(cols < n, scores[:, np.minimum(cols, n - 1)], -np.inf)  # [rows, tiles, lanes]
    ordered = -np.sort(-lanes, axis=1, kind="stable")
    kept = ordered[:, :depth, :].reshape(rows, -1)
    dropped = ordered[:, depth:, :].max(axis=(1, 2)) if tiles > depth else np.full(rows, -np.inf)
    kth = _topk_sorted(kept, wanted)[:, -1]
    return dropped < kth, kth


def simulate(blocks: list[np.ndarray], wanted: int) -> dict:
    """Per block on average: tiles, rounds, the share of blocks the lanes repair in their own block and that
    repair's rounds; and for the deferred repair (``knn_fwd_repair``: the failed rows of all blocks, 64 to a
    gathered block), per lane depth 3 and 2, the share of failed rows and the gathered blocks' tiles-streams and
    rounds per original block."""
    lanes = {depth: [lanes_certified(block, wanted, depth) for block in blocks] for depth in (DEPTH, 2)}
    repaired, repair_rounds = [], []
    for block, (certified, kth) in zip(blocks, lanes[DEPTH], strict=True):
        repaired.append(not certified.all())
        repair_rounds.append(0 if certified.all() else rounds_count(block[~certified], wanted, kth[~certified]))
    features = {"tiles": -(-blocks[0].shape[1] // BLOCK_N),
                "rounds": float(np.mean([rounds_count(block, wanted) for block in blocks])),
                "repaired": float(np.mean(repaired)), "repair_rounds": float(np.mean(repair_rounds))}
    for depth, certifications in lanes.items():
        failed = np.concatenate([block[~certified]
                                 for block, (certified, _) in zip(blocks, certifications, strict=True)])
        floor = np.concatenate([kth[~certified] for certified, kth in certifications])
        gathered = -(-len(failed) // BLOCK_M)
        rounds = sum(rounds_count(failed[i:i + BLOCK_M], wanted, floor[i:i + BLOCK_M])
                     for i in range(0, len(failed), BLOCK_M))
        features[f"deferred{depth}"] = {"failed_rows": len(failed) / (BLOCK_M * len(blocks)),
                                        "streams": gathered / len(blocks), "rounds": rounds / len(blocks)}
    return features


def fit(features: dict) -> dict:
    """Per-unit costs (ms per block) from :data:`MEASURED` and the simulated features of its cases."""
    rows, times = [], []
    for (n, _, k), (rounds_ms, _) in MEASURED.items():
        f, blocks = features[(n, k)], MEASURED_BLOCKS[(n, k)]
        k_pad = max(2, 1 << (k - 1).bit_length())
        rows.append([f["tiles"], f["rounds"], f["rounds"] * k_pad])
        times.append(rounds_ms / blocks)
    a, b, c = _nonnegative_lstsq(np.array(rows), np.array(times))
    units = {"a": a, "b": b, "c": c, "d": 0.0, "e": 0.0}
    rows, times = [], []
    for k in LANES_FITTED_AT:  # what the repair costs is modelled with a, b, c; the rest is the lanes' own
        f, blocks = features[(1024, k)], MEASURED_BLOCKS[(1024, k)]
        rows.append([f["tiles"], k])
        times.append(MEASURED[(1024, blocks, k)][1] / blocks - predict(units, f, k, 1)[1])
    units["d"], units["e"] = _nonnegative_lstsq(np.array(rows), np.array(times))
    return units


MEASURED_BLOCKS = {(n, k): blocks for n, blocks, k in MEASURED}


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares over the columns of ``x`` with every coefficient ≥ 0: the best fit of each subset of columns
    whose unconstrained solution is non-negative (a cost per unit of work is never negative)."""
    best, best_error = np.zeros(x.shape[1]), np.inf
    for mask in range(1, 2 ** x.shape[1]):
        cols = [i for i in range(x.shape[1]) if mask >> i & 1]
        coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        error = float(np.sum((x[:, cols] @ coef - y) ** 2))
        if (coef >= 0).all() and error < best_error:
            best, best_error = np.zeros(x.shape[1]), error
            best[cols] = coef
    return best


def predict(units: dict, f: dict, k: int, blocks: int) -> tuple[float, float, float]:
    """(rounds ms, lanes ms, deferred lanes ms) for ``blocks`` query blocks with features ``f`` at K = ``k``: the
    deferred repair streams its gathered blocks (``deferred3``) at the rounds' cost a tile and a round."""
    k_pad = max(2, 1 << (k - 1).bit_length())
    per_round = units["b"] + units["c"] * k_pad
    rounds = units["a"] * f["tiles"] + f["rounds"] * per_round
    own = units["d"] * f["tiles"] + units["e"] * k
    lanes = own + f["repaired"] * units["a"] * f["tiles"] + f["repair_rounds"] * per_round
    deferred = own + f["deferred3"]["streams"] * units["a"] * f["tiles"] + f["deferred3"]["rounds"] * per_round
    return rounds * blocks, lanes * blocks, deferred * blocks


def _random_blocks(n: int, count: int, dim: int = 64) -> list[np.ndarray]:
    """``count`` query blocks of cosine scores of random q, k (the kernel benchmark's inputs), [64, n] each."""
    gen = np.random.default_rng(0)
    blocks = []
    for _ in range(count):
        q, k = gen.standard_normal((BLOCK_M, dim)), gen.standard_normal((n, dim))
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        blocks.append(q @ k.T)
    return blocks


def _layer_streams(name: str, rule: str, images: int = 2) -> dict[str, list[np.ndarray]]:
    """Per ConvNN layer of a shipped checkpoint (keyed by its map size), the score rows of the first query block on
    each of the first ``images`` example images: cosine scores of the features the layer scores (``all``), or the
    blend rule's scores over the zero-padded map (``blend``); the query's own cell is −∞ (it is forced first)."""
    from PIL import Image

    from convnn.checkpoint import load_checkpoint
    from convnn.layers.convnn2d import ConvNN2d
    from kernels.reference import blend_scores, query_positions_in_padded, similarity_scores, spatial_scores

    model, _ = load_checkpoint(Path(__file__).resolve().parents[1] / "checkpoints" / f"{name}.safetensors")
    model.eval()
    files = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.png"))[:images]
    x = torch.stack([torch.from_numpy(np.asarray(Image.open(f).convert("RGB"))).permute(2, 0, 1) for f in files])
    captured: list[tuple[ConvNN2d, torch.Tensor]] = []
    hooks = [m.register_forward_hook(lambda m, args, out: captured.append((m, args[0].detach().double())))
             for m in model.modules() if isinstance(m, ConvNN2d)]
    with torch.no_grad():
        model(x.float() / 255)
    for hook in hooks:
        hook.remove()
    streams: dict[str, list[np.ndarray]] = {}
    for layer, features in captured:
        H, W = features.shape[2:]
        tokens = features.flatten(2).transpose(1, 2)[:, None]  # (B, 1, N, C)
        if rule == "all":
            scores = similarity_scores(tokens, tokens)
            own = torch.arange(H * W)
        else:
            pad = layer.window_size // 2
            padded = torch.nn.functional.pad(features, (pad, pad, pad, pad)).flatten(2).transpose(1, 2)[:, None]
            scores = blend_scores(similarity_scores(tokens, padded), spatial_scores(H, W, layer.window_size).double(),
                                  layer.blend_alpha)
            own = query_positions_in_padded(H, W, pad)
        scores[..., torch.arange(H * W), own] = -torch.inf
        streams.setdefault(f"{H}x{W}", []).extend(s[0, :BLOCK_M].numpy() for s in scores)
    return streams


def model_table(images: int = 2) -> dict:
    """Simulated work, fitted units, and per case and K the predicted times of both loops (and the measured ones
    where :data:`MEASURED` has them)."""
    features = {(1024, k): simulate(_random_blocks(1024, 24), k) for k in (9, 16, 32, 64)}
    units = fit(features)
    table = {}
    for (n, k), f in features.items():
        blocks = MEASURED_BLOCKS[(n, k)]
        rounds_ms, lanes_ms, deferred_ms = predict(units, f, k, blocks)
        measured = MEASURED[(n, blocks, k)]
        own_block, deferred = MEASURED_DEFERRED[k]
        table[f"random N={n} K={k}"] = {**f, "rounds_ms": rounds_ms, "lanes_ms": lanes_ms, "deferred_ms": deferred_ms,
                                        "measured_rounds_ms": measured[0], "measured_lanes_ms": measured[1],
                                        "same_order": (lanes_ms < rounds_ms) == (measured[1] < measured[0]),
                                        "lanes_fitted_here": k in LANES_FITTED_AT,
                                        "measured_own_block_ms": own_block, "measured_deferred_ms": deferred,
                                        "deferred_same_order": (deferred_ms <= lanes_ms) == (deferred <= own_block)}
    for name, rule in (("cnn-l0.5", "all"), ("cnn-l0.5-blend0.5", "blend")):
        for size, streams in _layer_streams(name, rule, images).items():
            for k in (9, 16, 32):
                f = simulate(streams, k - 1)  # the query is forced first
                rounds_ms, lanes_ms, deferred_ms = predict(units, f, k, 1)
                table[f"{rule} {size} K={k}"] = {**f, "rounds_ms": rounds_ms, "lanes_ms": lanes_ms,
                                                 "deferred_ms": deferred_ms}
    return {"units_ms_per_block": units, "cases": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2, help="example images for the layer features")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = model_table(args.images)
    print("| case | rounds per block | blocks repaired | repair rounds | lanes / rounds (model) "
          "| measured, rounds / lanes | rows deferred | deferred / lanes (model) | measured, lanes / deferred |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---|")
    for case, row in result["cases"].items():
        measured = deferred = ""
        if "measured_rounds_ms" in row:
            measured = (f"{row['measured_rounds_ms']:.3f} / {row['measured_lanes_ms']:.3f} ms, "
                        f"{'same order' if row['same_order'] else 'OTHER ORDER'}")
            deferred = (f"{row['measured_own_block_ms']:.3f} / {row['measured_deferred_ms']:.3f} ms, "
                        f"{'same order' if row['deferred_same_order'] else 'OTHER ORDER'}")
        ratio = f"{row['lanes_ms'] / row['rounds_ms']:.2f}" if row["rounds_ms"] > 0 else "—"
        print(f"| {case} | {row['rounds']:.1f} | {100 * row['repaired']:.0f} % | {row['repair_rounds']:.1f} | "
              f"{ratio} | {measured} | {100 * row['deferred3']['failed_rows']:.2f} % | "
              f"{row['deferred_ms'] / row['lanes_ms']:.2f} | {deferred} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
