"""A CPU model of the fused forward's selection work per score: the insertion rounds against the lane selection,
simulated on the same streams the kernel sees, on random and on real layer features (no GPU needed).

    python bench/selection_model.py --json bench/results/selection_model.json

For each case (random q, k at the CIFAR kernel configuration; the features entering the ConvNN layers of shipped
checkpoints on test images, `all` and `blend` rules) and K, it replays the stream of one query block (64 rows,
64-column tiles, the query forced first):

- **rounds** (:func:`kernels.knn_triton.select.merge_tile`): the first tile is merged whole; every later tile costs
  one row-max test, plus as many insertion rounds as its busiest row has entries (at most K);
- **lanes** (:func:`kernels.knn_triton.select.lane_insert`): three candidates per (row, lane), tiles rotated by 13
  columns per tile; a row is certified when every score its lanes dropped is below its K-th; a block with a row
  that is not certified streams again with the rounds, from each such row's K-th score as its floor (the repair).

Each tile pass is counted in *operations per score* with fixed weights (``WEIGHTS``: a score, a row-max test, an
insertion round, a lane insertion, the final merge of the lanes), the instruction counts of their Triton spelling
read from the compiled sm_90 kernels (``bench/compile_sm90.py``) to within a factor, so the model ranks designs;
the GPU times them (bench/kernel.py, bench/RESULTS.md §1f).
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
WEIGHTS = {"score": 8.0, "test": 3.0, "round": 10.0, "lane": 15.0, "final": 6.0}  # operations per score of a tile


def _topk_sorted(x: np.ndarray, k: int) -> np.ndarray:
    """The k largest of each row, descending (ties: any order; real scores have none)."""
    part = -np.partition(-x, min(k, x.shape[1]) - 1, axis=1)[:, :k]
    return -np.sort(-part, axis=1)


def rounds_cost(scores: np.ndarray, wanted: int, floor: np.ndarray | None = None) -> tuple[float, int]:
    """Operations of the insertion rounds over one block's stream ``scores`` [rows, N] (−∞: not a candidate), the
    rows finding ``wanted`` keys each; with ``floor`` [rows] the rows take only scores ≥ it (the repair). Returns
    (operations, rounds)."""
    rows, n = scores.shape
    acc = np.full((rows, wanted), -np.inf)
    ops, rounds = 0.0, 0
    tile_size = rows * BLOCK_N
    for t, start in enumerate(range(0, n, BLOCK_N)):
        tile = scores[:, start:start + BLOCK_N]
        if floor is not None:
            tile = np.where(tile >= floor[:, None], tile, -np.inf)
        ops += tile_size * (WEIGHTS["score"] + WEIGHTS["test"])
        merged = _topk_sorted(np.concatenate([acc, tile], axis=1), wanted)
        if t == 0 and floor is None:  # rows not yet full take the tile whole
            ops += tile_size * WEIGHTS["round"]
        else:
            entries = (tile[:, :, None] >= merged[:, None, -1:]).sum(axis=(1, 2)) * np.isfinite(merged[:, -1])
            entries = np.minimum(entries, (tile > acc[:, -1:]).sum(axis=1))
            busiest = int(min(wanted, entries.max()))
            rounds += busiest
            ops += tile_size * WEIGHTS["round"] * busiest
        acc = merged
    return ops, rounds


def lanes_certified(scores: np.ndarray, wanted: int) -> tuple[np.ndarray, np.ndarray]:
    """Which rows of ``scores`` [rows, N] the lane selection certifies, and each row's K-th score (its floor)."""
    rows, n = scores.shape
    tiles = -(-n // BLOCK_N)
    t = np.arange(tiles)[:, None]
    cols = t * BLOCK_N + (np.arange(BLOCK_N)[None, :] + t * ROTATION) % BLOCK_N
    lanes = np.where(cols < n, scores[:, np.minimum(cols, n - 1)], -np.inf)  # [rows, tiles, lanes]
    ordered = -np.sort(-lanes, axis=1, kind="stable")
    kept = ordered[:, :DEPTH, :].reshape(rows, -1)
    dropped = ordered[:, DEPTH:, :].max(axis=(1, 2)) if tiles > DEPTH else np.full(rows, -np.inf)
    kth = _topk_sorted(kept, wanted)[:, -1]
    return dropped < kth, kth


def lanes_cost(scores: np.ndarray, wanted: int) -> tuple[float, bool]:
    """Operations of the lane selection over one block's stream, and whether the block needed its repair."""
    rows, n = scores.shape
    certified, kth = lanes_certified(scores, wanted)
    ops = rows * n * (WEIGHTS["score"] + WEIGHTS["lane"]) + rows * BLOCK_N * DEPTH * WEIGHTS["final"]
    if certified.all():
        return ops, False
    failing = scores[~certified]
    repair, _ = rounds_cost(failing, wanted, floor=kth[~certified])
    return ops + repair * rows / len(failing), True  # the whole block streams the repair


def _random_case(n: int = 1024, dim: int = 64, samples: int = 2) -> list[np.ndarray]:
    gen = np.random.default_rng(0)
    out = []
    for _ in range(samples):
        q, k = gen.standard_normal((n, dim)), gen.standard_normal((n, dim))
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        out.append(q @ k.T)
    return out


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


def model_table(ks: list[int]) -> dict:
    """Operations per score of both loops, rounds per block and the share of blocks repaired, per case and K."""
    cases = {"random 1024": _random_case()}
    for name, rule in (("cnn-l0.5", "all"), ("cnn-l0.5-blend0.5", "blend")):
        for size, streams in _layer_streams(name, rule).items():
            cases[f"{rule} {size}"] = streams
    table = {}
    for case, blocks in cases.items():
        for k in ks:
            wanted = k - 1  # the query is forced first
            rounds = [rounds_cost(block, wanted) for block in blocks]
            lanes = [lanes_cost(block, wanted) for block in blocks]
            scores = sum(block.size for block in blocks)
            table[f"{case} K={k}"] = {
                "rounds_ops_per_score": sum(ops for ops, _ in rounds) / scores,
                "rounds_per_block": float(np.mean([r for _, r in rounds])),
                "lanes_ops_per_score": sum(ops for ops, _ in lanes) / scores,
                "blocks_repaired": float(np.mean([repaired for _, repaired in lanes])),
            }
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, nargs="+", default=[9, 16, 32, 64])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    table = model_table(args.k)
    print("| case | rounds ops/score | rounds per block | lanes ops/score | blocks repaired | lanes/rounds |")
    print("|---|---:|---:|---:|---:|---:|")
    for case, row in table.items():
        print(f"| {case} | {row['rounds_ops_per_score']:.1f} | {row['rounds_per_block']:.1f} | "
              f"{row['lanes_ops_per_score']:.1f} | {100 * row['blocks_repaired']:.0f} % | "
              f"{row['lanes_ops_per_score'] / row['rounds_ops_per_score']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"weights": WEIGHTS, "cases": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
