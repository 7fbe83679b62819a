"""Load, latency and memory of the explorer under many clients, through ``gradio_client`` against a served app.

    python bench/robustness.py --out /tmp/robustness_results.md [--app-args="--cache-mb 512"]

Starts ``python app.py`` in a subprocess on a free port (the shipped checkpoints, CPU unless a GPU is visible) and
measures two things; the Markdown it writes has both tables, the hardware, the versions and the date.

1. **Queue isolation.** The time of a click (``/neighbors`` at a new pixel of an image already seen) and of a
   prediction (``/predict`` on an image never seen, so a forward pass runs) alone, as the median of ``--repeats``
   calls; then the same calls while ``--slow-jobs`` other sessions have an occlusion attribution (64 forward passes,
   each on an image of its own so nothing is cached) queued or running. Target: each loaded median ≤ 2× alone.
2. **Memory under repeated load.** ``--rounds`` rounds of ``--clients`` new sessions (threads), each sending the
   same ``--requests`` requests every round (predictions, clicks at several K, tables, multi-hop, spectrum,
   saliency, model switches, exports). The server's resident set size (``VmRSS``) after each round. Target: after the
   last round within 10 % of after the first (the caches are full after the first round; what follows must not grow).
3. **Storage shares** (``--storage-only`` runs just this): one visitor uploads 95 MiB files until refused, then halving
   ones; another visitor's upload and export must still succeed (:func:`storage_shares`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import random
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
from gradio_client import Client, handle_file
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = "cnn-l0.5"  # the app's default model
OTHER_CHECKPOINTS = ("cnn-l0", "vit-convnn16")  # switched to in the memory rounds
LAYERS = {"cnn-l0.5": ("stages.0.0.conv1", "stages.1.0.conv1", "stages.2.0.conv1"), "cnn-l0": ("stages.1.0.conv1",),
          "vit-convnn16": ("blocks.0.attn", "blocks.3.attn")}
LATENCY_TARGET = 2.0  # loaded median / alone median, at most
RSS_TARGET = 0.10  # (RSS after the last round − after the first) / after the first, at most
STARTUP_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def served_app(app_args: list[str], env: dict[str, str] | None = None) -> Iterator[tuple[str, int]]:
    """``python app.py`` on a free port until the block ends, with ``env`` added to this process's environment:
    yields its URL and process id."""
    port = _free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})}
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # kept: its tail explains a failed start
    process = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), *app_args], cwd=ROOT,
                               env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"app.py exited with {process.returncode}: {Path(log.name).read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"app.py did not answer within {STARTUP_TIMEOUT_S} s")
            time.sleep(0.5)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def rss_mb(pid: int) -> float:
    """Resident set size of process ``pid`` in MB (``VmRSS`` of ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def noise_images(folder: Path, count: int, seed: int) -> list[str]:
    """``count`` distinct 32×32 noise PNGs in ``folder`` (so every one is a cache miss for the server)."""
    rng = np.random.default_rng(seed)
    paths = []
    for index in range(count):
        path = folder / f"noise-{seed}-{index}.png"
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


def neighbors_call(client: Client, image: str, row: int, col: int, checkpoint: str = CHECKPOINT,
                   layer: str = LAYERS[CHECKPOINT][1], k: int = 0):
    return client.predict(checkpoint, handle_file(image), layer, row, col, k, 0, 0, 0, 0.5, 0, api_name="/neighbors")


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def queue_isolation(url: str, folder: Path, repeats: int, slow_jobs: int) -> dict:
    """Medians (s) of a click and of a prediction alone and with ``slow_jobs`` occlusions of other sessions queued."""
    client = Client(url, verbose=False)
    example = str(ROOT / "examples" / "cat_0.png")
    neighbors_call(client, example, 0, 0)  # the trace of this image and layer is then cached: a click is a lookup
    fresh = iter(noise_images(folder, 2 * repeats + 1, seed=1))
    client.predict(CHECKPOINT, handle_file(next(fresh)), api_name="/predict")  # warm the code paths
    pixels = iter((row, col) for row in range(1, 32) for col in range(0, 32, 3))

    def measure() -> tuple[float, float]:
        clicks = [timed(lambda: neighbors_call(client, example, *next(pixels))) for _ in range(repeats)]
        predictions = [timed(lambda: client.predict(CHECKPOINT, handle_file(next(fresh)), api_name="/predict"))
                       for _ in range(repeats)]
        return statistics.median(clicks), statistics.median(predictions)

    alone = measure()
    others = [Client(url, verbose=False) for _ in range(slow_jobs)]
    slow_images = noise_images(folder, slow_jobs, seed=2)
    start = time.perf_counter()
    jobs = [other.submit(CHECKPOINT, handle_file(image), "occlusion", "", api_name="/attribution")
            for other, image in zip(others, slow_images, strict=True)]
    while not all(job.status().code.name in ("IN_QUEUE", "PROCESSING", "FINISHED") for job in jobs):
        time.sleep(0.05)
    loaded = measure()
    pending_after = sum(not job.done() for job in jobs)
    for job in jobs:
        job.result()
    return {"alone": alone, "loaded": loaded, "slow_jobs": slow_jobs, "pending_after": pending_after,
            "slow_total_s": time.perf_counter() - start}


def client_requests(index: int, examples: list[str], noise: list[str]) -> list[tuple]:
    """The same 25-ish requests for client ``index`` in every round: (api name, arguments)."""
    rng = random.Random(index)
    requests: list[tuple] = []
    while True:
        checkpoint = CHECKPOINT if rng.random() < 0.6 else rng.choice(OTHER_CHECKPOINTS)
        image = rng.choice(examples + noise)
        layer = rng.choice(LAYERS[checkpoint])
        row, col = rng.randrange(32), rng.randrange(32)
        kind = rng.choice(("predict", "neighbors", "neighbors", "neighbors", "table", "multihop", "spectrum",
                           "saliency", "export"))
        if kind == "predict":
            requests.append(("/predict", checkpoint, image))
        elif kind == "neighbors":
            requests.append(("/neighbors", checkpoint, image, layer, row, col, rng.choice((0, 16, 64)), 0, 0,
                             rng.randrange(3), 0.5, 0))
        elif kind == "export":
            requests.append(("/export", checkpoint, image, layer, row, col, 0, 0, 0, 0, 0.5, 0))
        elif kind == "table":
            requests.append(("/table", checkpoint, image, layer, row, col))
        elif kind == "multihop":
            requests.append(("/multihop", checkpoint, image, layer, row, col, 2, 0))
        elif kind == "spectrum":
            requests.append(("/spectrum", checkpoint, image))
        else:
            requests.append(("/attribution", checkpoint, image, "saliency", ""))
        if len(requests) == 25:
            return requests


def _run_client(url: str, requests: list[tuple], failures: list[str], lock: threading.Lock) -> None:
    client = Client(url, verbose=False)
    for api_name, *args in requests:
        args = [handle_file(a) if isinstance(a, str) and a.endswith(".png") else a for a in args]
        try:
            client.predict(*args, api_name=api_name)
        except Exception as err:  # a refused request is counted, and the round goes on
            with lock:
                failures.append(f"{api_name}: {type(err).__name__}: {str(err)[:120]}")


def memory_rounds(url: str, pid: int, folder: Path, rounds: int, clients: int, requests: int) -> dict:
    """RSS (MB) at start and after each round of ``clients`` × ``requests``; failures per round."""
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.png"))
    noise = noise_images(folder, 12, seed=3)
    plans = [client_requests(index, examples, noise)[:requests] for index in range(clients)]
    rss, failures, seconds = [rss_mb(pid)], [], []
    for _ in range(rounds):
        failed: list[str] = []
        lock = threading.Lock()
        start = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(_run_client, [url] * clients, plans, [failed] * clients, [lock] * clients))
        seconds.append(time.perf_counter() - start)
        time.sleep(2)  # let the last responses be released
        rss.append(rss_mb(pid))
        failures.append(failed)
    return {"rss": rss, "failures": failures, "seconds": seconds, "clients": clients, "requests": requests}


def _visitor_client(address: str) -> httpx.Client:
    """An HTTP client whose connections come from ``address`` (a loopback address: 127.0.0.0/8 is all local on Linux),
    so that the server sees a visitor of its own (``server.visitor``: the token its cookie jar keeps) at an address
    of its own (``server.address``, whose ceiling it does not share)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=120)


def _upload(http: httpx.Client, url: str, name: str, data: bytes) -> httpx.Response:
    return http.post(f"{url}gradio_api/upload", files=[("files", (name, data))])


def _export(http: httpx.Client, url: str, image_path: str) -> str:
    """One ``/export`` call through Gradio's REST API: the last event of its stream (``complete`` with the files'
    data, or ``error`` with the message)."""
    image = {"path": image_path, "meta": {"_type": "gradio.FileData"}}
    data = [CHECKPOINT, image, LAYERS[CHECKPOINT][1], 10, 20, 0, 0, 0, 0, 0.5, 0, "crop", 0]  # … fit, draw
    event = http.post(f"{url}gradio_api/call/export", json={"data": data}).json()["event_id"]
    lines = http.get(f"{url}gradio_api/call/export/{event}").text.strip().splitlines()
    return "\n".join(lines[-2:])


def fill_share(http: httpx.Client, url: str, upload_mb: int = 95) -> dict:
    """The visitor of ``http`` uploads ``upload_mb`` MiB files until refused, then halves the size down to 1 MiB (the
    attack that filled the shared 2 GB bound in ≈ 2 s). Returns the MiB stored, the seconds taken and the last
    refusal."""
    stored, refusal, size = 0, "", upload_mb * 2**20
    start = time.perf_counter()
    while size >= 2**20:
        answer = _upload(http, url, "fill.bin", b"\0" * size)
        if answer.status_code == 200:
            stored += size
        else:
            refusal = f"{answer.status_code}: {answer.text[:160]}"
            size //= 2
    return {"attacker_mb": stored / 2**20, "fill_s": time.perf_counter() - start, "refusal": refusal}


def storage_shares(url: str, upload_mb: int = 95) -> dict:
    """One visitor (127.0.0.2) fills its share (:func:`fill_share`); then another visitor (127.0.0.3) uploads an
    image and exports a query. Returns what each got."""
    attacker, other = _visitor_client("127.0.0.2"), _visitor_client("127.0.0.3")
    filled = fill_share(attacker, url, upload_mb)
    image = (ROOT / "examples" / "cat_0.png").read_bytes()
    upload = _upload(other, url, "cat.png", image)
    export = _export(other, url, upload.json()[0]) if upload.status_code == 200 else ""
    return {**filled, "upload": upload.status_code, "export": export}


def hardware() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    memory_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemTotal:"))
    import gradio
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (models on CPU)"
    return (f"{cpu}, {os.cpu_count()} cores visible, {memory_kb / 2**20:.1f} GiB RAM; {gpu}; Python "
            f"{platform.python_version()}, torch {torch.__version__}, gradio {gradio.__version__}")


def report(queue: dict, memory: dict, command: str, started: str, app_args: list[str]) -> str:
    (click, predict), (click_loaded, predict_loaded) = queue["alone"], queue["loaded"]
    rows = [("click (`/neighbors`, new pixel)", click, click_loaded),
            ("prediction (`/predict`, new image)", predict, predict_loaded)]
    lines = [
        "## Robustness under load (`bench/robustness.py`)",
        "",
        f"- measured {started} on {hardware()}",
        f"- `{command}`; app started as `{' '.join(['python app.py --port N', *app_args])}`",
        "",
        f"**Queue isolation**: medians of the calls alone, then while {queue['slow_jobs']} other sessions had an "
        f"occlusion attribution queued or running ({queue['pending_after']} still pending when the measurement "
        f"ended; all {queue['slow_jobs']} took {queue['slow_total_s']:.1f} s).",
        "",
        "| call | alone (s) | with slow jobs queued (s) | ratio | target ≤ 2× |",
        "|---|---:|---:|---:|---|",
    ]
    for name, alone, loaded in rows:
        ratio = loaded / alone
        met = "met" if ratio <= LATENCY_TARGET else "not met"
        lines.append(f"| {name} | {alone:.3f} | {loaded:.3f} | {ratio:.2f} | {met} |")
    rss = memory["rss"]
    growth = (rss[-1] - rss[1]) / rss[1]
    lines += [
        "",
        f"**Memory**: {len(rss) - 1} rounds of {memory['clients']} new sessions × {memory['requests']} requests "
        "(the same requests every round); server RSS.",
        "",
        "| after | RSS (MB) | round time (s) | refused requests |",
        "|---|---:|---:|---:|",
        f"| start | {rss[0]:.0f} | | |",
    ]
    for index, (value, seconds, failed) in enumerate(zip(rss[1:], memory["seconds"], memory["failures"],
                                                         strict=True)):
        lines.append(f"| round {index + 1} | {value:.0f} | {seconds:.1f} | {len(failed)} |")
    lines += ["", f"Last round vs first: {100 * growth:+.1f} % (target ≤ +{100 * RSS_TARGET:.0f} %: "
              f"{'met' if growth <= RSS_TARGET else 'not met'})."]
    refused = sorted({f for round_failures in memory["failures"] for f in round_failures})
    if refused:
        lines += ["", "Refused requests (first kinds):", *[f"- {f}" for f in refused[:5]]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the Markdown section here (default: print it)")
    parser.add_argument("--app-args", default="", help="extra arguments for app.py, e.g. '--cache-mb 256'")
    parser.add_argument("--repeats", type=int, default=11, help="calls per latency median")
    parser.add_argument("--slow-jobs", type=int, default=6, help="occlusions queued by other sessions")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=25, help="requests per client and round")
    parser.add_argument("--storage-only", action="store_true",
                        help="only the storage case: one visitor fills its share, another uploads and exports")
    args = parser.parse_args()
    app_args = shlex.split(args.app_args)
    if args.storage_only:
        with served_app(app_args) as (url, _):
            result = storage_shares(url)
        print(f"one visitor stored {result['attacker_mb']:.0f} MiB in {result['fill_s']:.1f} s, then was refused "
              f"({result['refusal']}); another visitor's upload: {result['upload']}, export: {result['export']}")
        ok = result["upload"] == 200 and result["export"].startswith("event: complete")
        sys.exit(0 if ok else 1)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory() as folder:
        with served_app(app_args) as (url, _):
            queue = queue_isolation(url, Path(folder), args.repeats, args.slow_jobs)
        with served_app(app_args) as (url, pid):
            memory = memory_rounds(url, pid, Path(folder), args.rounds, args.clients, args.requests)
    text = report(queue, memory, shlex.join(["python", *sys.argv]), started, app_args)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
