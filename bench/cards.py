"""Re-measure every shipped checkpoint on the full CIFAR-10 test split and record what its card should say.

    python bench/cards.py --data-root /work/shared/data/cifar10 [NAME ...]

Each checkpoint of ``checkpoints/`` (or each NAME given) is loaded as :func:`convnn.load_checkpoint` returns it and
evaluated on the 10,000 test images by ``python -m convnn.evaluate``'s pipeline
(:class:`convnn.evaluate.EvaluationData`: fp32, no autocast; on the CPU unless ``--device cuda``). Its entry in
``bench/results/cards.json`` (written after each checkpoint, so a run can be split or resumed) holds the number of
images it classifies correctly, its top-1 and loss, the card's claimed top-1, the sha256 of the weights measured, the
hardware, versions and date; for a model with random candidates, measured over 5 eval draws (METHOD §3b), also each
draw's count and top-1, the draw scheme, and ``test_top1``/``test_loss`` as their means with ``test_top1_std`` (what its
card records). ``tests/test_shipped_checkpoints.py`` checks the cards against this record (it never reads the test
split, which stays out of the repository); run this again whenever a checkpoint changes. On the CPU set
``OMP_NUM_THREADS=1`` when other work shares the cores (waiting threads spin); the hybrid CNNs with exhaustive selection
take 10–40 minutes each there (dense scores of 1,024 tokens per map).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from convnn import load_checkpoint  # noqa: E402
from convnn.data import load_cifar10  # noqa: E402
from convnn.evaluate import EvaluationData  # noqa: E402
from convnn.metrics import summarize_draws  # noqa: E402
from convnn.train import _hardware, _versions  # noqa: E402  (what a training card records)

RECORD = ROOT / "bench" / "results" / "cards.json"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="NAME", help="checkpoints to measure. Default: every one shipped")
    parser.add_argument("--data-root", required=True, help="CIFAR-10 folder (convnn.data.load_cifar10)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch-size", type=int, default=2,
                        help="images per forward pass (on the CPU a few keep the dense scores in cache). Default: 2")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    cards = [ROOT / "checkpoints" / f"{name}.json" for name in args.names] or sorted(
        (ROOT / "checkpoints").glob("*.json"))
    images, labels = load_cifar10(args.data_root, "test")
    device = torch.device(args.device)
    data = EvaluationData(images, labels, args.batch_size, device)
    record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    for card_path in cards:
        model, card = load_checkpoint(card_path)
        data.check(card)
        start = time.perf_counter()
        measured = data.draw_metrics(model, card)
        metrics = summarize_draws(measured)
        correct = [round(m["test_top1"] * len(labels) / 100) for m in measured]
        entry = {"weights_sha256": card.weights_sha256, "images": len(labels)}
        if len(measured) > 1:  # random candidates: each eval draw, and the card's mean ± std
            entry.update({**data.evaluation(model), "correct_per_draw": correct,
                          "test_top1_per_draw": [round(m["test_top1"], 2) for m in measured],
                          "test_top1_std": round(metrics["test_top1_std"], 2)})
        else:
            entry["correct"] = correct[0]
        entry.update({
            "test_top1": round(metrics["test_top1"], 2), "test_loss": round(metrics["test_loss"], 5),
            "card_test_top1": card.metrics["test_top1"], "hardware": _hardware(device, 1),
            "seconds": round(time.perf_counter() - start, 1), "versions": _versions(),
            "date": datetime.date.today().isoformat()})
        record[card.name] = entry
        RECORD.write_text(json.dumps(dict(sorted(record.items())), indent=1) + "\n")
        print(f"{card.name}: {correct} of {len(labels)} ({metrics['test_top1']:.2f} %), "
              f"card {card.metrics['test_top1']:.2f} %", flush=True)


if __name__ == "__main__":
    main()
