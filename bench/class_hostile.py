"""The hostile visitor of ``bench/class_load.py`` (issue "Class server II"): one visitor who tries everything a
single visitor can do to the rest of a class, through the page's session it opens (:class:`Hostile`).

1. **A heavy checkpoint** within the card budget that is slow to run (:func:`heavy_checkpoint`), uploaded through the
   page's checkpoint upload: the server loads it for this session, and every request below runs on it.
2. **Its storage share filled**: 96 noise images of its own (fresh inputs, so that nothing comes from a cache), then
   ``bench/robustness.py``'s :func:`fill_share` (95 MiB uploads until refused, then halving ones).
3. **The queue flooded**: ``flood`` requests in flight at all times (``/predict`` and ``/spectrum`` of the heavy
   model on its fresh images, in its page's session), each refused one sent again :data:`FLOOD_RETRY_S` later.
4. **Slow views started and cancelled**: an occlusion of the heavy model on a fresh image, Cancel 1 s later; a start or
   a Cancel the queue refuses is sent again 0.1 s later.
"""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from page_client import Page
from PIL import Image
from robustness import fill_share

__all__ = ["FLOOD", "Hostile", "heavy_checkpoint"]

FLOOD = 128  # hostile requests kept in flight: twice the queue's places on main (app_limits.MAX_QUEUED_EVENTS, 64;
#              Gradio counts only the waiting events), so that the queue stays full while some run
FLOOD_RETRY_S = 0.5  # a refused flood request is sent again this much later
HEAVY_ARGS = dict(widths=[160, 320, 640], depths=[3, 3, 3], num_neighbors=9, branch_ratio=0.5, num_classes=10)
HEAVY_INPUT_PX = 64  # 4,096 tokens in its first stage, the most an exhaustive layer may score
NOISE_IMAGES = 96  # the hostile visitor's fresh images (64 px noise PNGs), so that its requests miss every cache


def heavy_checkpoint(folder: Path) -> tuple[list[Path], dict]:
    """A checkpoint within the card budget that is slow to run: :data:`HEAVY_ARGS` at :data:`HEAVY_INPUT_PX` px
    (exhaustive selection over 4,096 tokens in its first stage), random weights, int8. Returns its two files and its
    cost (checked against the budget as the app checks an upload)."""
    import torch

    from convnn import ModelCard, create_model, save_checkpoint
    from convnn.budget import check_model
    from convnn.data import CIFAR10_CLASSES, CIFAR10_MEAN, CIFAR10_STD
    from convnn.models import model_cost

    card = ModelCard(name="heavy", model="convnn_resnet_cifar", model_args=dict(HEAVY_ARGS),
                     classes=list(CIFAR10_CLASSES), input_size=HEAVY_INPUT_PX, mean=list(CIFAR10_MEAN),
                     std=list(CIFAR10_STD))
    check_model(card, "heavy card")  # raises if over the budget
    torch.manual_seed(0)
    model = create_model(card.model, **card.model_args).eval()
    save_checkpoint(model, folder / "heavy", card, dtype=torch.int8)
    cost = model_cost(card.model, card.input_size, **card.model_args)
    files = [folder / "heavy.json", folder / "heavy.safetensors"]
    return files, {"model": card.model, "model_args": HEAVY_ARGS, "input_size": HEAVY_INPUT_PX,
                   "multiply_adds": cost.flops, "values": cost.values, "activations": cost.activations,
                   "upload_mb": round(sum(path.stat().st_size for path in files) / 2**20, 1)}


def _noise_png(rng: np.random.Generator) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (HEAVY_INPUT_PX, HEAVY_INPUT_PX, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


class Hostile:
    """The hostile visitor: :meth:`prepare` (page, heavy checkpoint, noise images, storage share), then :meth:`run`
    until ``stop`` is set (the queue flood and the start-and-cancel loop). Its counts are in :attr:`stats`."""

    def __init__(self, url: str, http: httpx.Client, heavy_files: list[Path], flood: int = FLOOD, seed: int = 0,
                 nice: int = 0) -> None:
        self.url, self.http, self.heavy_files, self.flood, self.nice = url, http, heavy_files, flood, nice
        self.rng = np.random.default_rng(seed + 1)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.stats: dict = {"flood_sent": 0, "flood_refused": 0, "flood_answered": 0, "flood_errors": 0,
                            "cancel_cycles": 0, "cancel_start_refused": 0, "cancel_refused": 0}
        self.page: Page | None = None
        self.images: list[dict] = []

    def prepare(self) -> None:
        start = time.perf_counter()
        self.page = page = Page.open(self.url, self.http)
        page.fire(None, "load")
        page.upload("checkpoint_files", [(path.name, path.read_bytes()) for path in self.heavy_files], multiple=True)
        chain = page.fire("checkpoint_files", "upload")
        self.stats["heavy_upload_s"] = round(time.perf_counter() - start, 1)
        self.stats["heavy_upload_refused"] = chain.refused
        self.heavy = page.value("checkpoint")
        for index in range(NOISE_IMAGES):
            page.upload("image_upload", [(f"noise-{index}.png", _noise_png(self.rng))])
            self.images.append(page.value("image_upload"))
        self.stats["storage"] = fill_share(self.http, self.url)

    def run(self) -> None:
        os.nice(self.nice)  # this thread and the ones it starts (Linux), as the honest visitors' threads
        threads = [threading.Thread(target=self._flood, args=(index,), daemon=True) for index in range(self.flood)]
        threads.append(threading.Thread(target=self._start_and_cancel, daemon=True))
        for thread in threads:
            thread.start()
        self.stop.wait()

    def _count(self, key: str, refusal: str = "") -> None:
        with self.lock:
            self.stats[key] += 1
            seen = self.stats.setdefault("refusals", [])
            if refusal and len(seen) < 8 and refusal[:120] not in seen:
                seen.append(refusal[:120])  # what the server answered it, a few distinct ones

    def _image(self) -> dict:
        with self.lock:
            return self.images[int(self.rng.integers(len(self.images)))]

    def _flood(self, index: int) -> None:
        api_name = ("predict", "spectrum")[index % 2]
        while not self.stop.is_set():
            self._count("flood_sent")
            step = self.page.call(api_name, [self.heavy, self._image(), "crop", 0], timeout=600)
            if not step.taken:
                self._count("flood_refused", step.refused)
                time.sleep(FLOOD_RETRY_S)
            else:
                self._count("flood_errors" if step.refused else "flood_answered")

    def _start(self, started: list) -> None:
        started.append(self.page.fire("attribution_button", "click", None, 600))

    def _start_and_cancel(self) -> None:
        """Occlusions of the heavy model started and cancelled 1 s later, each on a fresh image (a result is kept
        per image); a start or a Cancel the queue refuses (its own flood fills it) is sent again 0.1 s later."""
        page = self.page
        page.set("method", "occlusion")
        page.fire("method", "change", timeout=60)
        while not self.stop.is_set():
            page.set("image_file", self._image())
            started: list = []  # a daemon thread, not an executor: Python waits for an executor's threads at exit
            starter = threading.Thread(target=self._start, args=(started,), daemon=True)
            starter.start()
            starter.join(1.0)
            if started and not started[0].steps[0].taken:
                self._count("cancel_start_refused", started[0].refused)
                time.sleep(0.1)
                continue
            for _ in range(50):  # Cancel, sent again while the queue refuses it
                if self.stop.is_set():
                    return
                cancel = page.fire("attribution_cancel", "click", timeout=60)
                if cancel.steps[0].taken:
                    break
                self._count("cancel_refused", cancel.refused)
                time.sleep(0.1)
            self._count("cancel_cycles")
            starter.join()  # a dropped run's event ends at once ("no change to the page")
            time.sleep(1.0)
