"""What a user of the app feels, measured in headless Chromium: click → overlay, and new image → first render.

    .venv/bin/pip install -r bench/requirements.txt   # scikit-image, for its bundled photos
    .venv/bin/python bench/app_latency.py [--clicks 120] [--out bench/results/app.json]

Starts ``app.py`` on the shipped checkpoints (CPU), opens it in Debian's Chromium at 1280×800 and, for a CNN hybrid
(cnn-l0.5) and a ViT (vit-convnn16):

* **click → overlay**: ≥ 100 clicks on varied pixels of the explorer's focus panel, each timed in the page from the
  click's dispatch to the frame after the explorer redrew (``requestAnimationFrame`` after its ``data-drawn``
  changes); the requests the page sent meanwhile are counted (the target: none);
* **new image → first render**: every CIFAR example of ``examples/`` (a click on the gallery) and photos as people
  bring them (scikit-image's bundled photos saved as JPEG, two of them upscaled to 12 MP phone-camera size, one PNG
  with transparency; uploaded through the page's upload button), each timed from the click (or the upload's start)
  to the frame after the explorer drew that image (``data-image`` = its digest) with the prediction.

Writes ``{"models": {NAME: {"click_p50_ms", "click_p95_ms", "first_render_p50_ms", "first_render_p95_ms", …}},
"cpu", "date"}`` to ``--out`` and prints a Markdown table for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import skimage.data
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import analysis as an  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-quic", "--no-first-run"]
MODELS = ("cnn-l0.5", "vit-convnn16")
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "retina", "immunohistochemistry",
          "colorwheel")  # scikit-image's bundled photos (no download)
PHONE_PHOTO_PX = (4032, 3024)  # a 12 MP phone photo


# The page's side of a click: dispatch it at a pixel and resolve with the time to the frame after the redraw.
CLICK_JS = """async ([x, y]) => {
  const root = document.querySelector('.cx');
  const canvas = document.querySelector('#explorer .cx-canvas');
  const box = canvas.getBoundingClientRect();
  const before = root.dataset.drawn;
  const drawn = new Promise((resolve) => {
    const observer = new MutationObserver(() => {
      if (root.dataset.drawn !== before) { observer.disconnect(); requestAnimationFrame(() => resolve(true)); }
    });
    observer.observe(root, {attributes: true, attributeFilter: ['data-drawn']});
    setTimeout(() => resolve(false), 5000);  // not redrawn (a click off the image): recorded as a failure
  });
  const query = () => [...document.querySelectorAll('#row_px input, #col_px input')].map((b) => b.value).join();
  const shown = query();
  const start = performance.now();
  canvas.dispatchEvent(new MouseEvent('click', {bubbles: true, clientX: box.left + x, clientY: box.top + y}));
  if (query() === shown) return -1;  // the pixel already shown: nothing to redraw, not timed
  return (await drawn) ? performance.now() - start : null;
}"""

# The page's side of a new image: a promise that resolves with the time at which the explorer showed ``digest``.
WATCH_JS = """(digest) => {
  const root = document.querySelector('.cx');
  window.cxShown = new Promise((resolve) => {
    const observer = new MutationObserver(() => {
      if (root.dataset.image === digest) {
        observer.disconnect();
        requestAnimationFrame(() => resolve(performance.now()));
      }
    });
    observer.observe(root, {attributes: true, attributeFilter: ['data-image', 'data-drawn']});
    setTimeout(() => resolve(null), 60000);  // never shown (an error in the page): recorded as a failure
  });
  return performance.now();
}"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def photos(folder: Path) -> list[Path]:
    """scikit-image's bundled photos as a phone would send them: JPEGs, two at 12 MP, and a transparent PNG."""
    files = []
    for i, name in enumerate(PHOTOS):
        pixels = getattr(skimage.data, name)()
        image = Image.fromarray(pixels).convert("RGB")
        if i < 2:
            image = image.resize(PHONE_PHOTO_PX if image.width >= image.height else PHONE_PHOTO_PX[::-1],
                                 Image.Resampling.BICUBIC)
        files.append(folder / f"{name}.jpg")
        image.save(files[-1], quality=90)
    logo = Image.fromarray(skimage.data.logo())  # RGBA
    files.append(folder / "logo.png")
    logo.save(files[-1])
    return files


def wait_settled(page, quiet_s: float = 0.6, timeout_s: float = 90) -> None:
    """Until no queue request has been in flight for ``quiet_s`` (every event chain delivered)."""
    start = quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < quiet_s and time.monotonic() - start < timeout_s:
        page.wait_for_timeout(50)
        if page.pending:
            quiet_since = time.monotonic()


def choose_model(page, name: str) -> None:
    page.locator("#checkpoint input").click()
    page.locator("#checkpoint input").fill(name)
    page.get_by_role("option").filter(has_text=f"{name}:").first.click()
    page.wait_for_function(f"document.querySelector('.cx').dataset.model === {json.dumps(name)}", timeout=90_000)
    wait_settled(page)


def click_latencies(page, count: int, rng: np.random.Generator) -> tuple[list[float], int]:
    box = page.locator("#explorer .cx-canvas").bounding_box()
    requests_before = len(page.requests)
    times = []
    while len(times) < count:
        x, y = rng.uniform(0.2, 0.8, 2) * (box["width"], box["height"])  # inside the image, off the padding cells
        elapsed = page.evaluate(CLICK_JS, [float(x), float(y)])
        if elapsed is None:
            raise RuntimeError(f"a click at ({x:.0f}, {y:.0f}) of the focus panel was not answered")
        if elapsed >= 0:  # a click on the pixel already shown changes nothing in the page (web/explorer.js)
            times.append(elapsed)
    return times, len(page.requests) - requests_before


def first_render_latencies(page, examples: list[Path], uploads: list[Path], fit: str = "crop") -> list[dict]:
    results = []
    for index, path in enumerate([*examples, *uploads]):
        digest = an.fit_image(an.load_image(path), fit).digest
        if page.locator(".cx").get_attribute("data-image") == digest:
            continue  # already shown: no event would fire
        start = page.evaluate(WATCH_JS, digest)
        if index < len(examples):
            page.locator("#examples .thumbnail-item").nth(index).click()
        else:
            page.set_input_files("input[type=file][data-testid$=\"-upload-button\"]", str(path))
        shown = page.evaluate("window.cxShown")
        if shown is None:
            raise RuntimeError(f"{path.name} was never shown: {page.locator('.toast-body').all_inner_texts()}")
        results.append({"image": path.name, "ms": shown - start, "upload": index >= len(examples)})
        print(f"  {path.name}: {shown - start:.0f} ms", flush=True)
        wait_settled(page)
    return results


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clicks", type=int, default=120, help="clicks per model (≥ 100)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "app.json")
    args = parser.parse_args()
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "CUDA_VISIBLE_DEVICES": ""}
    server = subprocess.Popen([sys.executable, str(REPO / "app.py"), "--port", str(port)], env=env, cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    examples = sorted((REPO / "examples").glob("*.png"))
    report = {"models": {}, "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
              f"({Path('/proc/cpuinfo').read_text().split('model name')[1].split(':')[1].splitlines()[0].strip()})",
              "date": datetime.date.today().isoformat(), "browser": "headless Chromium (Debian), 1280×800"}
    try:
        with tempfile.TemporaryDirectory() as folder, sync_playwright() as playwright:
            uploads = photos(Path(folder))
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
            page.requests, page.pending = [], set()
            page.on("request", lambda r: (page.requests.append(r.url), "/queue/" in r.url and page.pending.add(r)))
            page.on("requestfinished", lambda r: page.pending.discard(r))
            page.on("requestfailed", lambda r: page.pending.discard(r))
            for _ in range(120):
                try:
                    page.goto(f"http://127.0.0.1:{port}/")
                    break
                except Exception:  # the server is still starting
                    time.sleep(1)
            page.wait_for_selector(".cx[data-drawn]", timeout=120_000)
            wait_settled(page)
            rng = np.random.default_rng(0)
            for name in MODELS:
                choose_model(page, name)
                clicks, sent = click_latencies(page, args.clicks, rng)
                renders = first_render_latencies(page, examples, uploads)
                times = [r["ms"] for r in renders]
                report["models"][name] = {
                    "click_p50_ms": round(percentile(clicks, 50), 2), "click_p95_ms": round(percentile(clicks, 95), 2),
                    "clicks": len(clicks), "requests_during_clicks": sent,
                    "first_render_p50_ms": round(percentile(times, 50), 1),
                    "first_render_p95_ms": round(percentile(times, 95), 1), "images": len(times),
                    "first_render_ms": {r["image"]: round(r["ms"], 1) for r in renders}}
                print(name, {k: v for k, v in report["models"][name].items() if k != "first_render_ms"}, flush=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{report['date']}, {report['cpu']}, {report['browser']}\n")
    print("| model | click → overlay p50 / p95 (ms) | requests during clicks | new image → first render p50 / p95 "
          "(ms) | images |")
    print("|---|---|---|---|---|")
    for name, row in report["models"].items():
        print(f"| {name} | {row['click_p50_ms']} / {row['click_p95_ms']} ({row['clicks']} clicks) | "
              f"{row['requests_during_clicks']} | {row['first_render_p50_ms']} / {row['first_render_p95_ms']} | "
              f"{row['images']} |")


if __name__ == "__main__":
    main()
