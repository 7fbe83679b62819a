"""Large checkpoints open in the app: the ImageNet ViT-B/16 preset (86.8 M parameters, 87 MB in int8) from a folder
(``python app.py --checkpoints DIR``) and as an upload (within the 100 MB default cap), then answer a click.

    python bench/open_large.py [--out bench/results/open_large.json]

Random weights (no ImageNet here): what is measured is that the card passes the checks, the model loads, the
explorer's first table is built and a click is answered, and how long each step takes on this machine. Too slow
for the test suite on 2 cores (each step builds or reads 87 MB), so it lives here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import analysis as an
import app
import app_limits
from convnn import ModelCard, create_model, save_checkpoint
from convnn.presets import preset

PRESET = "imagenet-vit-b16-convnn"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/open_large.json"))
    args = parser.parse_args()
    fields = preset(PRESET)
    timings: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        torch.manual_seed(0)
        model = create_model(fields["model"], **fields["model_args"]).eval()
        card = ModelCard(name="vit-b16", model=fields["model"], model_args=fields["model_args"],
                         classes=[f"class {i}" for i in range(1000)], input_size=224, mean=[0.485, 0.456, 0.406],
                         std=[0.229, 0.224, 0.225])
        weights, _ = save_checkpoint(model, Path(folder) / "vit-b16", card, dtype=torch.int8)
        timings["build_and_save_s"] = time.perf_counter() - started
        size_mb = weights.stat().st_size / 2**20
        explorer = app.Explorer(Path(folder), device="cpu")
        image = explorer.examples[0]
        started = time.perf_counter()
        shown = explorer.on_model("vit-b16")  # from the folder, as --checkpoints DIR lists it
        timings["open_from_folder_s"] = time.perf_counter() - started
        layer = shown["layer"]["value"]
        started = time.perf_counter()
        table = explorer.on_first_render("vit-b16", image, "crop", layer, 100, 120, 0, 0, 0, 0, 0.5, 0)
        timings["first_table_s"] = time.perf_counter() - started
        started = time.perf_counter()
        loaded = explorer.model("vit-b16")
        result = an.query_neighbors(loaded, explorer.image(image), layer, (100, 120))
        timings["click_in_python_s"] = time.perf_counter() - started
        assert table["layer"] == layer and len(result.sets["layer"].cells) == loaded.layer_info(layer).num_neighbors
        started = time.perf_counter()
        upload = explorer.on_checkpoint_upload([str(weights), str(Path(folder) / "vit-b16.json")], [])
        timings["upload_s"] = time.perf_counter() - started
        assert upload["uploads"][0][1]
    record = {"preset": PRESET, "weights_mb": round(size_mb, 1), "upload_cap_mb": app_limits.MAX_UPLOAD_MB,
              "layer": layer, "layers": len(shown["layer"]["choices"]),
              **{key: round(value, 2) for key, value in timings.items()},
              "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
              "date": datetime.date.today().isoformat()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
