"""A class of honest visitors with one hostile visitor, against a served explorer (issue "Class server II").

    python bench/class_load.py --json bench/results/class.json            # 30 visitors, 3 minutes, with and without
    python bench/class_load.py --visitors 6 --minutes 1 --json /tmp/c.json  # a reduced run

Each run starts ``python app.py`` in a subprocess on a free port, in a temporary folder of its own (``TMPDIR``: the
app's run folder, its uploads and Gradio's cache), with ``CONVNN_TRUSTED_PROXIES=127.0.0.1`` (the trusted-proxy
option being added) and each visitor's requests carrying its own ``X-Forwarded-For`` through 127.0.0.1. Without that
option the server sees them all the same: Gradio's server (uvicorn) already takes the client's address from
``X-Forwarded-For`` when the connection comes from 127.0.0.1 (``proxy_headers``, ``FORWARDED_ALLOW_IPS`` defaults to
127.0.0.1), so :func:`server.visitor` gives each visitor its own address on main too. ``--addresses loopback``
instead connects each visitor from a local address of its own (127.0.x.y) and trusts no proxy. Two runs, each on a
fresh server: the class alone, then the class with the hostile visitor (``--no-hostile``: the first only).

**The honest visitors** drive the page as a browser does (:mod:`page_client`: the page's own events, each with its
chain of views, one session per visitor, its own cookies and ``X-Forwarded-For: 10.0.x.y``). Each opens the page,
then does a fixed mix per 3 minutes (:data:`MIX`; scaled to ``--minutes``) in a seeded order, with a think time of
2–10 s before each action (:func:`visitor_schedule`):

- **example**: a click on one of the 20 examples (the gallery's select: the image's chain of views);
- **upload**: a 12 MP JPEG photo of its own uploaded through "Upload a photo" (upload, then its chain);
- **click**: a click on a pixel of the image. The page answers it from the neighbour table it holds and sends
  nothing (``web/explorer.js``), unless the table holds one query's row (K above 64) or the multi-hop view's table
  does not hold the clicked query, when it asks for that row (``explorer.row``, ``hop_view.field``): a click here
  sends exactly those, so most clicks send nothing and are counted, not timed;
- **knob**: one of K, r, the seed or α set (:data:`KNOBS`) and applied (a number box's blur, a slider's release);
  K = 100 makes the next clicks ask the server;
- **saliency**: the Attribution tab, then "Compute attribution" with the default method (saliency);
- **compare**: the "Compare models" tab (its columns' layers, then the columns).

An action's time runs from its first request to the answer that shows it (:data:`ANSWERS`: the explorer's first
render, the new table, the clicked row, the attribution, the columns); the rest of its chain is waited for before the
next think time. An action is refused when any request of it was (an HTTP error such as "Queue is full", or an error
message); one not answered within ``--patience`` seconds is given up and counts at that time in the p95.

**The hostile visitor** (:mod:`class_hostile`, ``X-Forwarded-For: 10.0.255.254``) opens the page, uploads a heavy
checkpoint within the card budget (:func:`heavy_checkpoint`: a 64 px ConvNN ResNet of 45 G multiply-adds per image,
int8, 35 MB), uploads noise
images and fills the rest of its storage share (``bench/robustness.py``'s :func:`fill_share`), then until the class
ends floods the queue (``--flood`` requests in flight, twice the queue's places: ``/predict`` and ``/spectrum`` of
the heavy model on fresh images in its page's session, each refused one sent again 0.5 s later) and starts and
cancels occlusions of the heavy model on fresh images (method change, "Compute attribution", Cancel 1 s later).

Per action the JSON holds ``honest_p95_ms`` (with the hostile visitor), ``honest_p95_alone_ms``, their ratio and
``honest_refused``, with counts, the machine and the date. The product's target: ratio ≤ 2 and no refusal.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: convnn, for the heavy checkpoint
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: page_client, robustness

from class_hostile import FLOOD, Hostile, heavy_checkpoint
from page_client import Page, Refused
from robustness import hardware, served_app

ROOT = Path(__file__).resolve().parents[1]
MIX = {"example": 5, "upload": 2, "click": 40, "knob": 3, "saliency": 1, "compare": 1}  # per visitor, per 3 minutes
MIX_MINUTES = 3
THINK_S = (2.0, 10.0)  # the pause before each action, drawn uniformly, then fitted to the duration
KNOBS = (("num_neighbors", 16), ("num_neighbors", 25), ("num_neighbors", 100), ("num_candidates", 128), ("seed", 3),
         ("seed", 7), ("blend_alpha", 0.25), ("blend_alpha", 0.75))  # valid together on the default layer (16×16)
ANSWERS = {"open": "on_first_render", "example": "on_first_render", "upload": "on_first_render", "click":
           "on_table_row", "knob": "on_table", "saliency": "on_attribution", "compare": "on_compare"}
INPUT_PX = 32  # the default model's input: where a click lands
PHOTO_PX = (4032, 3024)  # a 12 MP phone photo
TARGET_RATIO = 2.0
CLIENT_NICE = 10  # the visitors' threads yield the shared cores to the server (class_hostile's too)


# -- the schedule (pure) -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Action:
    """One thing a visitor does, after a pause of ``think_s`` seconds: ``kind`` (:data:`ANSWERS`' keys) and its
    argument (an example's index, a photo's index, a pixel (row, col), a knob (name, value))."""

    kind: str
    think_s: float
    arg: int | tuple | None = None


def mix_for(minutes: float) -> dict[str, int]:
    """:data:`MIX` scaled from 3 minutes to ``minutes`` (at least one of each)."""
    return {kind: max(1, round(count * minutes / MIX_MINUTES)) for kind, count in MIX.items()}


def think_times(count: int, duration_s: float, rng: random.Random) -> list[float]:
    """``count`` pauses drawn uniformly in :data:`THINK_S`, their excess over the shortest scaled down (never up)
    so that together they last at most ``duration_s``: all stay within 2–10 s; when even 2 s each is too long, each
    is 2 s and the schedule lasts longer than ``duration_s``."""
    low, high = THINK_S
    drawn = [rng.uniform(low, high) for _ in range(count)]
    excess = sum(value - low for value in drawn)
    scale = min(1.0, max(0.0, (duration_s - low * count) / excess)) if excess > 0 else 0.0
    return [low + (value - low) * scale for value in drawn]


def visitor_schedule(visitor: int, minutes: float = MIX_MINUTES, seed: int = 0, num_examples: int = 20) -> list[Action]:
    """Visitor ``visitor``'s actions: opening the page, then :func:`mix_for` ``(minutes)`` in a random order, each
    after a think time (:func:`think_times`, all of them together ``minutes``). The same arguments give the same
    schedule (a string seed: independent of Python's hash seed)."""
    rng = random.Random(f"class-load-{seed}-{visitor}")
    mix = mix_for(minutes)
    kinds = [kind for kind, count in mix.items() for _ in range(count)]
    rng.shuffle(kinds)
    examples = iter(rng.sample(range(num_examples), min(mix["example"], num_examples)) * mix["example"])
    photos = iter(range(mix["upload"]))
    args: dict[str, Callable[[], int | tuple]] = {
        "example": lambda: next(examples), "upload": lambda: next(photos),
        "click": lambda: (rng.randrange(INPUT_PX), rng.randrange(INPUT_PX)), "knob": lambda: rng.choice(KNOBS)}
    thinks = think_times(len(kinds) + 1, minutes * 60, rng)
    return [Action("open", thinks[0]), *(Action(kind, think, args[kind]() if kind in args else None)
                                          for kind, think in zip(kinds, thinks[1:], strict=True))]


# -- the numbers (pure) ------------------------------------------------------------------------------------------------
def p95(values: list[float]) -> float | None:
    """The 95th percentile by nearest rank (the ⌈0.95·n⌉-th smallest); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


def ratio(loaded: float | None, alone: float | None) -> float | None:
    """``loaded / alone``, rounded to 2 decimals; None when either is missing or ``alone`` is 0."""
    return None if loaded is None or not alone else round(loaded / alone, 2)


@dataclass
class Record:
    """One honest action as measured: ``answer_s`` (None: refused, or a click with no request), ``requests`` sent,
    ``refused`` (the first refusal's text), ``gave_up`` (no answer within the patience: ``answer_s`` is that)."""

    kind: str
    visitor: int
    answer_s: float | None
    chain_s: float
    requests: int
    refused: str = ""
    gave_up: bool = False


def summarize(records: list[Record]) -> dict[str, dict]:
    """Per action kind: counts, refusals, give-ups, and p50/p95 (ms) of the answered and given-up ones."""
    out = {}
    for kind in ANSWERS:
        mine = [record for record in records if record.kind == kind]
        timed = [record.answer_s * 1000 for record in mine if record.answer_s is not None]
        refused = [record for record in mine if record.refused and not record.gave_up]
        out[kind] = {"count": len(mine), "timed": len(timed), "in_page": sum(not r.requests for r in mine),
                     "refused": len(refused), "gave_up": sum(r.gave_up for r in mine),
                     "p50_ms": None if not timed else round(float(np.median(timed)), 1),
                     "p95_ms": None if not timed else round(p95(timed), 1),
                     "refusals": sorted({r.refused[:160] for r in refused})[:5]}
    return out


def compare(loaded: dict[str, dict] | None, alone: dict[str, dict]) -> dict[str, dict]:
    """The issue's numbers per action: ``honest_p95_ms`` (with the hostile visitor), ``honest_p95_alone_ms``, their
    ``honest_p95_ratio`` and ``honest_refused`` (with the hostile visitor; ``*_alone`` without), and whether the
    action meets the target (ratio ≤ 2, no refusal)."""
    out = {}
    for kind, without in alone.items():
        with_ = (loaded or {}).get(kind)
        row = {"honest_p95_ms": with_ and with_["p95_ms"], "honest_p95_alone_ms": without["p95_ms"],
               "honest_p95_ratio": ratio(with_ and with_["p95_ms"], without["p95_ms"]),
               "honest_refused": with_ and with_["refused"], "honest_refused_alone": without["refused"],
               "honest_gave_up": with_ and with_["gave_up"], "count": with_ and with_["count"],
               "count_alone": without["count"], "timed": with_ and with_["timed"], "timed_alone": without["timed"]}
        if with_ is None or (row["honest_p95_ratio"] is None and not row["honest_refused"]):
            row["met"] = None  # nothing to judge: no hostile run, or nothing timed nor refused (clicks in the page)
        else:
            row["met"] = row["honest_refused"] == 0 and (row["honest_p95_ratio"] or math.inf) <= TARGET_RATIO
        out[kind] = row
    return out


# -- the visitors ------------------------------------------------------------------------------------------------------
def visitor_client(address: str, loopback: str | None, timeout: float) -> httpx.Client:
    """A visitor's HTTP client: its own cookie jar, ``X-Forwarded-For: address``, and with ``loopback`` its
    connections made from that local address."""
    transport = httpx.HTTPTransport(local_address=loopback) if loopback else None
    return httpx.Client(headers={"X-Forwarded-For": address}, timeout=httpx.Timeout(timeout, connect=30),
                        transport=transport)


def make_photos(folder: Path, visitors: int, per_visitor: int, seed: int) -> list[list[Path]]:
    """Each visitor's photos: 12 MP JPEGs (quality 90) of a smooth random picture with noise, none alike."""
    rng = np.random.default_rng(seed)
    photos = []
    width, height = PHOTO_PX
    for visitor in range(visitors):
        mine = []
        for index in range(per_visitor):
            small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)  # a few colour blobs, upscaled smoothly
            picture = Image.fromarray(small).resize((width, height), Image.BICUBIC)
            noise = rng.integers(-12, 13, (height // 4, width // 4, 1), dtype=np.int16).repeat(4, 0).repeat(4, 1)
            pixels = np.clip(np.asarray(picture, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
            path = folder / f"photo-{visitor}-{index}.jpg"
            Image.fromarray(pixels).save(path, quality=90)
            mine.append(path)
        photos.append(mine)
    return photos


def _asks_server(table: object, row: int, col: int) -> bool:
    """Whether the page asks the server about a click at (row, col) on the view holding ``table``: only when the
    table lists the queries it holds (``queries``) and the clicked cell is not among them."""
    if not isinstance(table, dict) or table.get("queries") is None:
        return False
    cell = (table["row_cell_of_px"][row], table["col_cell_of_px"][col])
    return cell[0] * table["grid"][1] + cell[1] not in table["queries"]


class Visitor:
    """One honest visitor: its client, its schedule, its photos; :meth:`run` returns its records."""

    def __init__(self, index: int, url: str, http: httpx.Client, actions: list[Action], photos: list[Path],
                 patience: float, stop_at: float) -> None:
        self.index, self.url, self.http, self.actions, self.photos = index, url, http, actions, photos
        self.patience, self.stop_at = patience, stop_at
        self.page: Page | None = None

    def run(self) -> list[Record]:
        os.nice(CLIENT_NICE)  # this thread only (Linux): the server keeps the cores it needs
        records = []
        for action in self.actions:
            time.sleep(action.think_s)
            if time.monotonic() > self.stop_at:
                break  # the class is over: the rest is not run (counted by the caller)
            if self.page is None and action.kind != "open":
                break  # the page never opened
            records.append(self.act(action))
        if self.page is not None:
            self.page.close()
        return records

    def act(self, action: Action) -> Record:
        start = time.perf_counter()
        try:
            chains = self._chains(action)
        except Refused as err:  # the page or an upload refused
            return Record(action.kind, self.index, None, time.perf_counter() - start, 1, str(err))
        answer = None
        for chain in chains:
            at = chain.until(ANSWERS[action.kind]) or chain.until("on_hops_row")
            if at is not None:
                answer = chain.start - start + at
                break
        gave_up = any(chain.gave_up for chain in chains)
        if gave_up:
            answer = self.patience
        refused = next((chain.refused for chain in chains if chain.refused), "")
        return Record(action.kind, self.index, answer, time.perf_counter() - start,
                      sum(len(chain.steps) for chain in chains), refused, gave_up)

    def _chains(self, action: Action) -> list:
        fire = self._fire
        if action.kind == "open":
            self.page = Page.open(self.url, self.http)
            return [fire(None, "load")]
        page = self.page
        if action.kind == "example":
            return [fire("examples", "select", {"index": action.arg, "value": None, "selected": True})]
        if action.kind == "upload":
            path = self.photos[action.arg]
            page.upload("image_upload", [(path.name, path.read_bytes())])
            return [fire("image_upload", "upload")]
        if action.kind == "knob":
            name, value = action.arg
            page.set(name, value)
            return [fire(name, "release" if name == "blend_alpha" else "blur")]
        if action.kind == "click":
            row, col = action.arg
            page.set("row_px", row)
            page.set("col_px", col)
            return [fire(view, trigger, {"index": [row, col], "value": None})
                    for view, trigger in (("explorer", "row"), ("hop_view", "field"))
                    if _asks_server(page.value(view), row, col)]
        if action.kind == "saliency":
            fire("tab:attribution", "select")  # the tab, then its button (timed from the button)
            page.set("method", "saliency")
            return [fire("attribution_button", "click")]
        if action.kind == "compare":
            return [fire("compare_tab", "select")]
        raise ValueError(f"unknown action {action.kind!r}")

    def _fire(self, elem_id, trigger, event_data=None):
        return self.page.fire(elem_id, trigger, event_data, timeout=self.patience)


# -- a run -------------------------------------------------------------------------------------------------------------
def addresses(index: int, mode: str) -> tuple[str, str | None]:
    """Visitor ``index``'s forwarded address (10.0.x.y) and, for ``mode == "loopback"``, its local address
    (127.0.x.y); the hostile visitor is index -1."""
    if index < 0:
        return "10.0.255.254", "127.0.255.254" if mode == "loopback" else None
    x, y = divmod(index, 250)
    return f"10.0.{x}.{y + 1}", f"127.0.{x + 1}.{y + 1}" if mode == "loopback" else None


def class_run(args: argparse.Namespace, photos: list[list[Path]], heavy_files: list[Path] | None) -> dict:
    """One run on a fresh server: the class (and the hostile visitor if ``heavy_files``). Returns the records
    summarized, the not-run count, the hostile visitor's stats and the run's seconds."""
    work = tempfile.mkdtemp(prefix="class-load-")  # the app's TMPDIR: its run folder, uploads, Gradio's cache
    env = {"TMPDIR": work}
    if args.addresses == "forwarded":
        env["CONVNN_TRUSTED_PROXIES"] = "127.0.0.1"
    num_examples = len(list((ROOT / "examples").glob("*.png")))
    schedules = [visitor_schedule(index, args.minutes, args.seed, num_examples) for index in range(args.visitors)]
    load_before = os.getloadavg()
    with served_app(shlex.split(args.app_args), env=env) as (url, _):
        hostile = None
        if heavy_files is not None:
            hostile = Hostile(url, visitor_client(*addresses(-1, args.addresses), 600), heavy_files, args.flood,
                              args.seed, CLIENT_NICE)
            hostile.prepare()
            threading.Thread(target=hostile.run, daemon=True).start()
            time.sleep(5)  # the flood under way before the class arrives
        start = time.monotonic()
        stop_at = start + 2 * args.minutes * 60 + args.patience  # a class that overruns twice its length ends
        visitors = [Visitor(index, url, visitor_client(*addresses(index, args.addresses), args.patience + 60),
                            schedules[index], photos[index], args.patience, stop_at)
                    for index in range(args.visitors)]
        with ThreadPoolExecutor(args.visitors) as pool:
            results = list(pool.map(Visitor.run, visitors))
        seconds = time.monotonic() - start
        if hostile is not None:
            hostile.stop.set()
            with hostile.lock:  # what it did while the class ran (its threads end with the server)
                hostile_stats = json.loads(json.dumps(hostile.stats))
        load_after = os.getloadavg()
    shutil.rmtree(work, ignore_errors=True)
    records = [record for result in results for record in result]
    planned = sum(len(schedule) for schedule in schedules)
    return {"summary": summarize(records), "not_run": planned - len(records), "seconds": round(seconds, 1),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_end": [round(x, 2) for x in load_after], "hostile": hostile and hostile_stats,
            "records": [asdict(record) for record in records]}


def markdown(result: dict) -> str:
    """The per-action table of ``result`` (:func:`main`'s JSON) for bench/RESULTS.md."""
    lines = ["| action | p95 with hostile (ms) | p95 alone (ms) | ratio | refused with hostile | refused alone | "
             "given up | count (timed) with / alone | target |", "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    def cell(value) -> str:
        return "–" if value is None else f"{value:,}" if isinstance(value, int | float) else str(value)

    for kind, row in result["actions"].items():
        met = {None: "–", True: "met", False: "not met"}[row["met"]]
        if row["count"] and not row["timed"] and row["honest_refused"] == row["count"]:
            row = {**row, "honest_p95_ms": "all refused"}
        lines.append(f"| {kind} | {cell(row['honest_p95_ms'])} | {cell(row['honest_p95_alone_ms'])} | "
                     f"{cell(row['honest_p95_ratio'])} | {cell(row['honest_refused'])} | "
                     f"{cell(row['honest_refused_alone'])} | {cell(row['honest_gave_up'])} | "
                     f"{cell(row['count'])} ({cell(row['timed'])}) / {cell(row['count_alone'])} "
                     f"({cell(row['timed_alone'])}) | {met} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--visitors", type=int, default=30, help="honest visitors (default: 30)")
    parser.add_argument("--minutes", type=float, default=MIX_MINUTES, help="the class's length; the mix per visitor "
                        "scales with it (default: 3)")
    parser.add_argument("--no-hostile", action="store_true", help="only the class alone (no ratio)")
    parser.add_argument("--json", type=Path, help="write the results here (default: print only the table)")
    parser.add_argument("--seed", type=int, default=0, help="the schedules' and pictures' seed (default: 0)")
    parser.add_argument("--patience", type=float, default=180, help="seconds an honest visitor waits for an "
                        "action's answer before giving up (default: 180)")
    parser.add_argument("--flood", type=int, default=FLOOD, help=f"hostile requests in flight (default: {FLOOD})")
    parser.add_argument("--addresses", choices=("forwarded", "loopback"), default="forwarded",
                        help="forwarded: X-Forwarded-For 10.0.x.y through 127.0.0.1, trusted as a proxy (default); "
                        "loopback: each visitor connects from 127.0.x.y")
    parser.add_argument("--app-args", default="", help="extra arguments for app.py")
    args = parser.parse_args()
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="class-load-files-") as folder:
        photos = make_photos(Path(folder), args.visitors, mix_for(args.minutes)["upload"], args.seed)
        heavy_files, heavy = (None, None) if args.no_hostile else heavy_checkpoint(Path(folder))
        alone = class_run(args, photos, None)
        loaded = None if args.no_hostile else class_run(args, photos, heavy_files)
    result = {"issue": "Class server II", "date": started, "machine": hardware(),
              "command": shlex.join(["python", *sys.argv]), "visitors": args.visitors, "minutes": args.minutes,
              "mix": mix_for(args.minutes), "think_s": THINK_S, "seed": args.seed, "patience_s": args.patience,
              "addresses": args.addresses, "knobs": KNOBS, "answers": ANSWERS,
              "actions": compare(loaded and loaded["summary"], alone["summary"]),
              "alone": {key: value for key, value in alone.items() if key != "records"},
              "with_hostile": loaded and {key: value for key, value in loaded.items() if key != "records"},
              "heavy_checkpoint": heavy, "target": {"honest_p95_ratio_at_most": TARGET_RATIO, "honest_refused": 0}}
    result["done"] = all(row["met"] for row in result["actions"].values() if row["met"] is not None) and \
        loaded is not None
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
