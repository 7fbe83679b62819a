"""ConvNN Explorer: pick a model and an image, click a pixel, and see which neighbours each selection rule picks.

    python app.py [--port 7860] [--checkpoints checkpoints/]

Binds 127.0.0.1; the port comes from ``--port``, else ``$PORT`` / ``$GRADIO_SERVER_PORT``, else 7860. Runs on CPU;
with a GPU the models run there and ConvNN layers use the fused Triton kernel. This file is wiring only: every
number and figure comes from :mod:`analysis`; the explorer's clicks are answered in the page by ``web/explorer.js``
from the neighbour table the server sends (:func:`analysis.page_table`); the layout is :func:`build_layout`, what
each change refreshes is :data:`REFRESH`, and the documented API (``gr.api``, plain values) is the ``api_*``
methods of :class:`Explorer`.

What one visitor can cost is bounded before work starts: a queue of at most MAX_QUEUED_EVENTS waiting events, the
slow views (attribution, the equivalence demo, every model's spectrum) in a group of their own that computes
SLOW_CONCURRENCY at a time, dropped runs included (:class:`SlowRuns`), and admits one request per session and
MAX_SLOW_WAITING waiting in all (:class:`Admission`), a request body of at most
the upload cap (``--max-upload-mb``) plus REQUEST_SLACK_MB, uploads and exports in a per-session work dir of at
most MAX_WORK_DIR_MB together with Gradio's own cache of uploads and downloads, which lives in it (all deleted
FILE_MAX_AGE_S after their last use), the analysis caches within ``--cache-mb`` (``$CONVNN_CACHE_MB``), Gradio's
per-session state to MAX_SESSIONS sessions.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import inspect
import json
import logging
import os
import reprlib
import tempfile
from pathlib import Path
from urllib.parse import parse_qsl

WORK_DIR = Path(tempfile.gettempdir()) / "convnn-explorer"  # all the app stores: sessions/ (uploads and exports,
#                                                             one folder per session) and gradio/ (Gradio's cache)
# Gradio's cache of uploads and downloads goes inside the work dir, in a folder of this app's own, so that one byte
# budget covers it (set GRADIO_TEMP_DIR before starting the app to put it elsewhere: it is counted wherever it is).
# Set before Gradio is imported: its MCP module reads it then.
os.environ.setdefault("GRADIO_TEMP_DIR", str(WORK_DIR / "gradio"))

import gradio as gr
import numpy as np
import torch
from gradio import processing_utils
from gradio.data_classes import FileData
from gradio.route_utils import API_PREFIX
from gradio.utils import get_upload_folder
from starlette.middleware import Middleware

import analysis as an
import app_mcp
from analysis.rendering import figures
from convnn import CheckpointError
from server import (
    Admission,
    CheckedNumber,
    CheckedSlider,
    RequestSizeLimit,
    SlowRuns,
    checked_number,
    user_errors,
    waiting_events,
)

# Gradio's private parts this file touches (tests/server/test_gradio_private.py checks each on the installed Gradio;
# requirements.txt pins Gradio to the minor versions it passed on); the server's guards list theirs.
GRADIO_PRIVATE = {
    "Block._id": "a component's id: the key of its value in a set of inputs' values (wire)",
    "processing_utils.save_file_to_cache": "copies a file into Gradio's cache, which serves it (api_export)",
    "utils.get_upload_folder": "the folder of Gradio's cache of uploads and downloads (GRADIO_TEMP_DIR)",
    "route_utils.API_PREFIX": "the prefix of Gradio's routes (/gradio_api): the upload route's path",
}
REPO = Path(__file__).resolve().parent
CHECKPOINT_DIR = REPO / "checkpoints"
EXAMPLES_DIR = REPO / "examples"
WEB_DIR = REPO / "web"  # the page's own JavaScript and CSS (the explorer and the multi-hop view)
DEFAULT_PORT = 7860
DEFAULT_CHECKPOINT = "cnn-l0.5"  # the paper's hybrid layer: the most to see on first load
MAX_UPLOAD_MB = 100  # larger uploaded files are refused before they are stored (--max-upload-mb); ViT-B/16 int8: 87 MB
REQUEST_SLACK_MB = 10  # one request's body may be this much above the upload cap: a checkpoint's card, form fields
MAX_WORK_DIR_MB = 2048  # all sessions' stored uploads and exports and Gradio's cache of uploads and downloads
#                         together (≈ 40 checkpoints of the largest size); an upload past it is refused (507)
FILE_MAX_AGE_S = 3600  # stored uploads, exports and Gradio's cached files go this long after their last use
FILE_SWEEP_S = 600  # how often the work dir and Gradio's cache are swept for them
MAX_QUEUED_EVENTS = 64  # events waiting in the queue, all sessions together; the next one is refused ("Queue is full")
FAST_CONCURRENCY = 2  # runs of one event at a time (per event; the model's lock serialises their forward passes)
SLOW_GROUP = "slow"  # the concurrency group of the views that take seconds: attribution, the equivalence demo
SLOW_CONCURRENCY = 1  # slow runs at a time, all sessions together: they never take every core from a click
MAX_SLOW_WAITING = 8  # slow runs waiting, all sessions together; the next is refused, so the slow views never hold
#                       more than this of the queue's MAX_QUEUED_EVENTS places (and a session holds one at a time)
MAX_THREADS = 6  # worker threads running handlers (Gradio's max_threads, 40 by default): more add no speed on a few
#                   cores, only memory (each thread's allocations keep a malloc arena of their own)
MALLOC_ARENAS = 2  # glibc malloc arenas (by default up to 8 per core, one per allocating thread, rarely returned)
MAX_SESSIONS = 32  # sessions whose state Gradio keeps (each holds its last outputs, ≈ 0.3 MB of figure JSON); the
#                    least recently used goes first (its uploads stay reachable: they are found by its session id)
GUIDE = [
    "**1 · Pick a model and an image.** Each card says how much of the network is ConvNN (λ) and how it selects.",
    "**2 · Read the prediction** beside the image: the five most probable classes for what the model sees.",
    "**3 · Click or tap a pixel.** The large panel outlines the K cells one rule picks for it, rank 0 darkest; "
    "hover a cell for its rank, score and contribution.",
    "**4 · Compare rules.** Window = convolution, all tokens = attention, random = r sampled candidates, blend = α: "
    "switch the large panel, or read the small ones.",
    "**5 · Open the tabs** below: how neighbours are weighed, how the branches mix, and where the model looks.",
]


# Links and lessons (README, "Teaching with ConvNN Explorer"): a link sets these controls through their checks.
LINK_CONTROLS = {"row": "row_px", "col": "col_px", "k": "num_neighbors", "window": "window_size",
                 "r": "num_candidates", "seed": "seed", "alpha": "blend_alpha", "head": "head"}
TABS = {"weights": "Aggregation weights", "mix": "λ mix", "attribution": "Attribution", "spectrum": "Spectrum",
        "compare": "Compare models", "equivalence": "Equivalence demo", "hops": "Multi-hop",
        "pixels": "Input-level view"}  # id → label
COMPARE_DEFAULT = ("cnn-l0", "cnn-l0.5", "cnn-l1")  # compare mode's first columns: convolution, hybrid, pure ConvNN
COMPARE_LAYERS = [f"compare_layer_{i}" for i in range(an.MAX_COMPARED)]  # each column's layer
LESSON_END = "The lesson's last step: pick another lesson in the list, or explore from here."
LINK_NOTE = "Links name a shipped model and an example image (an uploaded photo or checkpoint stays on this server)."


ATTRIBUTION_PROMPT = (f"Pick a method and press **Compute attribution**: it runs on demand (a few seconds for "
                      f"occlusion and integrated gradients) and is kept for this model and image. {an.GRADIENT_NOTE}")
ATTRIBUTION_CANCELLED = "Cancelled. Press **Compute attribution** to run it again."
EQUIVALENCE_PROMPT = "Press the button to compare on the chosen layer's features of this model and image."


def default_workspace() -> an.Workspace:
    """The work dir's uploads and exports, in WORK_DIR/sessions: at most MAX_WORK_DIR_MB together with Gradio's cache
    (``GRADIO_TEMP_DIR``), each FILE_MAX_AGE_S after its last use."""
    return an.Workspace(WORK_DIR / "sessions", MAX_WORK_DIR_MB * 2**20, FILE_MAX_AGE_S, counted=[get_upload_folder()])


class Explorer:
    """The app's handlers: thin adapters from the page's values to :mod:`analysis`.

    Handlers take the page's values by name, the ``elem_id`` of the component each comes from (:func:`by_name`
    passes them), and the event's ``gr.Request``, whose session owns the uploads and exports it makes (a direct call
    without one is the one local session). The ``api_*`` methods are the documented API: plain values in and out.

    Args:
        checkpoint_dir (Path): folder of shipped checkpoints (``*.json`` + ``*.safetensors``).
        device (str): where models run. Default: CUDA if available, else CPU
        workspace (an.Workspace): where uploads and exports are kept. Default: :func:`default_workspace`
        max_upload_mb (int): the largest file an upload may be, MB. Default: MAX_UPLOAD_MB
    """

    def __init__(self, checkpoint_dir: Path = CHECKPOINT_DIR, device: str | None = None,
                 workspace: an.Workspace | None = None, max_upload_mb: int = MAX_UPLOAD_MB) -> None:
        self.checkpoint_dir = Path(checkpoint_dir).resolve()
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.examples = sorted(str(p) for p in EXAMPLES_DIR.glob("*.png"))
        self.example_paths = {Path(path).stem: path for path in self.examples}  # a link's image → its file
        self.example_digests = {hashlib.sha256(Path(path).read_bytes()).hexdigest(): stem
                                for stem, path in self.example_paths.items()}
        self.lessons = json.loads((WEB_DIR / "lessons.json").read_text(encoding="utf-8"))
        self.controls: dict[str, gr.components.Component] = {}  # LINK_CONTROLS' components (build_demo sets them)
        self.workspace = workspace or default_workspace()
        self.max_upload_mb = max_upload_mb

    # -- resolving the page's values -----------------------------------------------------------------------------
    @staticmethod
    def session(request: gr.Request | None) -> str | None:
        return getattr(request, "session_hash", None)

    def model(self, checkpoint: str | None, request: gr.Request | None = None) -> an.LoadedModel:
        card = an.checkpoint_card(checkpoint, self.checkpoint_dir, self.workspace, self.session(request))
        return an.load_model(card, self.device)

    @staticmethod
    def image(image_file: str | None, fit: str = "crop") -> an.InputImage:
        """The image at a file component's path (Gradio checked it: an upload or an example), fitted to a square."""
        if not image_file or not isinstance(image_file, str):
            raise ValueError("Pick an example or upload an image first.")
        return an.fit_image(an.load_image(image_file), Explorer.text(fit, "the fit"))  # a cache key: hashable

    @staticmethod
    def uploaded(image: object) -> str:
        """The path of the file an API call sent, which must be one Gradio stored in its upload cache (what
        ``gradio_client.handle_file`` uploads; each upload's folder is an unguessable hash, as for Gradio's own file
        components): any other path, however it is spelled (a FileData dict with or without its ``meta``, a plain
        string, a symbolic link out of the cache), is refused before anything opens it.

        Raises:
            ValueError: not a file Gradio stored in its upload cache.
        """
        path = image.get("path") if isinstance(image, dict) else image
        cache = Path(get_upload_folder()).resolve()
        if isinstance(path, str) and path and Path(path).resolve().is_relative_to(cache) and Path(path).is_file():
            return str(Path(path).resolve())
        raise ValueError("send the image as a file uploaded with the request (gradio_client.handle_file): the "
                         "server opens no other path")

    @staticmethod
    def text(value: object, name: str) -> str:
        """``value`` if it is a string (an API call may send anything), else a message naming the field."""
        if not isinstance(value, str):
            raise ValueError(f"{name} must be text, got {reprlib.repr(value)}")
        return value

    @staticmethod
    def pixel(row_px: float, col_px: float) -> tuple[int, int]:
        return an.whole_number(row_px, "query row"), an.whole_number(col_px, "query col")

    @staticmethod
    def clicked(evt: gr.SelectData) -> tuple[int, int]:
        """The pixel ``[row_px, col_px]`` a page's "select" event names (a click the page asks the server about).

        Raises:
            ValueError: not a pair of whole numbers; the message quotes what was sent.
        """
        if not (isinstance(evt.index, list | tuple) and len(evt.index) == 2):
            raise ValueError(f"a clicked pixel is [row, col], got {reprlib.repr(evt.index)}")
        return Explorer.pixel(*evt.index)

    @staticmethod
    def options(num_neighbors, window_size, num_candidates, seed, blend_alpha, head) -> an.RuleOptions:
        return an.RuleOptions.from_ui(num_neighbors, window_size, num_candidates, seed, blend_alpha, head)

    def shipped(self) -> list[str]:
        """The shipped checkpoints' names (stems), as the model list offers them."""
        return [path.stem for _, path in an.list_checkpoints(self.checkpoint_dir).found]

    def left_out(self) -> list[str]:
        """The checkpoint folder's files the model list leaves out, each ``"name: why it cannot be opened"``."""
        return [f"{name}: {why}" for name, why in an.list_checkpoints(self.checkpoint_dir).refused]

    def choices(self, uploads: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The model list: ``(label, choice)``, shipped checkpoints by stem, then this session's uploads."""
        shipped = [(label, path.stem) for label, path in an.list_checkpoints(self.checkpoint_dir).found]
        return shipped + [tuple(upload) for upload in uploads]

    def tool_schema(self) -> dict[str, dict]:
        """What the MCP tools' schemas say of these parameters besides their types (:mod:`app_mcp`): the shipped
        models, the default first, the default model's layers, the fits and the attribution methods, so that a
        call can be built from a tool's schema alone."""
        default = self.default_checkpoint()
        models = sorted(self.shipped(), key=lambda name: name != default)
        layers = [probe.name for probe in self.model(default).probes] if default else []
        return {"checkpoint": {"enum": models, "default": default},
                "checkpoints": {"items": {"enum": models}, "minItems": 2, "maxItems": an.MAX_COMPARED,
                                "default": self.compare_default()},
                "layer": {"examples": layers, "description": "a layer of the model, by name: the layers tool lists "
                                                             f"them (examples: {default}'s)"},
                "fit": {"enum": list(an.FITS)}, "method": {"enum": list(an.ATTRIBUTION_METHODS)}}

    def default_checkpoint(self) -> str | None:
        """The model a page opens with: :data:`DEFAULT_CHECKPOINT` if it is listed, else the first listed, skipping
        one that does not load (weights that do not fit their card pass the listing's checks), so that one bad
        checkpoint never leaves a page with no model; None when none loads."""
        for name in sorted(self.shipped(), key=lambda name: name != DEFAULT_CHECKPOINT):
            try:
                self.model(name)
            except CheckpointError:
                continue
            return name
        return None

    def table(self, checkpoint, image_file, fit, layer, row_px, col_px, num_neighbors, window_size, num_candidates,
              seed, blend_alpha, head, request=None, keep_query: bool = True) -> dict:
        """The explorer page's value (:func:`analysis.page_table`: the table, the prediction and the image's note)
        for the page's values."""
        loaded, image = self.model(checkpoint, request), self.image(image_file, fit)
        size = loaded.card.input_size
        query_px = self.pixel(row_px, col_px)
        an.query_cell(loaded.probe(layer), *query_px)  # a pixel outside the model input is a message
        options = self.options(num_neighbors, window_size, num_candidates, seed, blend_alpha, head)
        table = an.neighbor_table(loaded, image, layer, options, query_px)
        return an.page_table(an.model_view(image, size), table, query_px, loaded.card, an.top_classes(loaded, image),
                             image, keep_query)

    # -- the API: plain values -------------------------------------------------------------------------------------
    @user_errors
    def api_layers(self, checkpoint: str, request: gr.Request | None = None) -> list[dict]:
        """The layers a model's views open, in forward order: ``name``, ``label``, grid ``height``/``width``, K, R,
        r, heads, λ, selection rule… (:class:`analysis.LayerInfo`)."""
        return [dataclasses.asdict(p) | {"label": an.layer_label(p)} for p in self.model(checkpoint, request).probes]

    @user_errors
    def api_predict(self, checkpoint: str, image: FileData, fit: str = "crop",
                    request: gr.Request | None = None) -> dict[str, float]:
        """The five most probable classes of the image (``fit``: crop, letterbox or stretch) → probability."""
        image = self.uploaded(image)
        return an.top_classes(self.model(checkpoint, request), self.image(image, fit))

    @user_errors
    def api_neighbors(self, checkpoint: str, image: FileData, layer: str, row_px: int, col_px: int,
                      num_neighbors: int = 0, window_size: int = 0, num_candidates: int = 0, seed: int = 0,
                      blend_alpha: float = 0.5, head: int = 0, fit: str = "crop",
                      request: gr.Request | None = None) -> dict:
        """One query's neighbours under every rule (:func:`analysis.query_record`: cells, ranks, similarities,
        distances, Jaccard overlaps); 0 for K, R, r or the seed means the layer's own."""
        image = self.uploaded(image)
        loaded, image = self.model(checkpoint, request), self.image(image, fit)
        options = self.options(num_neighbors, window_size, num_candidates, seed, blend_alpha, head)
        result = an.query_neighbors(loaded, image, layer, self.pixel(row_px, col_px), options)
        return an.query_record(loaded, image, result)

    @user_errors
    def api_export(self, checkpoint: str, image: FileData, layer: str, row_px: int, col_px: int,
                   num_neighbors: int = 0, window_size: int = 0, num_candidates: int = 0, seed: int = 0,
                   blend_alpha: float = 0.5, head: int = 0, fit: str = "crop",
                   request: gr.Request | None = None) -> tuple[FileData, FileData]:
        """One query's overlay (PNG, every rule side by side) and neighbours (JSON), as files to download."""
        image = self.uploaded(image)
        files = self.on_export(checkpoint, image, fit, layer, row_px, col_px, num_neighbors, window_size,
                               num_candidates, seed, blend_alpha, head, request)["exports"]
        cached = [processing_utils.save_file_to_cache(path, get_upload_folder()) for path in files]  # served from
        return FileData(path=cached[0]), FileData(path=cached[1])  # Gradio's cache: the work dir is never served

    @user_errors
    def api_spectrum(self, checkpoint: str, image: FileData, fit: str = "crop",
                     request: gr.Request | None = None) -> list[dict]:
        """Every layer's place on the convolution ↔ attention spectrum on this image: ``layer``,
        ``mean_distance`` (cells), ``window_share`` (in [0, 1]) and ``window_size`` R."""
        image = self.uploaded(image)
        rows = an.selection_spectrum(self.model(checkpoint, request), self.image(image, fit))
        return [dataclasses.asdict(row) for row in rows]

    @user_errors
    def api_multihop(self, checkpoint: str, image: FileData, layer: str, row_px: int, col_px: int,
                     num_hops: int = 2, head: int = 0, fit: str = "crop",
                     request: gr.Request | None = None) -> dict:
        """The query's receptive field through ``num_hops`` layers: ``hops`` (S × S, the first hop reaching each
        model-input pixel, −1 for none), ``layers`` (the layer of each hop ≥ 1) and ``pixel_counts``."""
        image = self.uploaded(image)
        field = an.receptive_field(self.model(checkpoint, request), self.image(image, fit), layer,
                                   self.pixel(row_px, col_px), num_hops, head)
        return {"hops": field.hops.tolist(), "layers": field.layers, "pixel_counts": field.pixel_counts}

    @user_errors
    def api_attribution(self, checkpoint: str, image: FileData, method: str = "saliency", target: str = "",
                        fit: str = "crop", request: gr.Request | None = None) -> dict:
        """A Captum attribution map of one class (``target``; empty: the predicted one): ``values`` (S × S,
        |attribution| summed over colours, arbitrary units), ``target``, ``method`` and ``note``."""
        image = self.uploaded(image)
        method, target = self.text(method, "method"), self.text(target, "class")
        result = an.attribution_map(self.model(checkpoint, request), self.image(image, fit), method, target or None)
        return {"values": result.values.tolist(), "target": result.target, "method": result.method,
                "note": result.note}

    @user_errors
    def api_equivalence(self, checkpoint: str, image: FileData, layer: str, fit: str = "crop",
                        request: gr.Request | None = None) -> list[dict]:
        """The equivalence demos of the layer (window ConvNN vs ``conv2d``; ConvNN-attention with K = N vs
        SDPA): ``description``, ``max_abs_diff``, ``max_abs_output``, ``backend``, and the pictures over the
        layer's grid: ``channel``, ``convnn`` and ``reference`` (that channel's H × W outputs), ``difference``
        (H × W, max |difference| over channels)."""
        image = self.uploaded(image)
        results = an.equivalences(self.model(checkpoint, request), self.image(image, fit), layer)
        return [{name: value.tolist() if isinstance(value, np.ndarray) else value
                 for name, value in dataclasses.asdict(result).items()} for result in results]

    @user_errors
    def api_weights(self, checkpoint: str, layer: str, request: gr.Request | None = None) -> dict:
        """The layer's learned aggregation kernel over rank slots: ``kernel`` (C_out × K: the L2 norm over input
        channels, or the signed tap of a depthwise kernel, ``signed``), ``slot_norms`` (K: how much the t-th
        neighbour matters) and ``description``."""
        kernel = an.aggregation_kernel(self.model(checkpoint, request), layer)
        return {"kernel": kernel.kernel.tolist(), "slot_norms": kernel.slot_norms.tolist(), "signed": kernel.signed,
                "description": kernel.description}

    @user_errors
    def api_mix(self, checkpoint: str, image: FileData, layer: str, fit: str = "crop",
                request: gr.Request | None = None) -> dict:
        """A hybrid layer's λ mix on this image: ``branch_ratio`` λ, the channel split, and per cell (H × W) the
        ConvNN ``share`` of the 1×1 mix output and the two branches' norms."""
        image = self.uploaded(image)
        mix = an.branch_mix(self.model(checkpoint, request), self.image(image, fit), layer)
        return {"branch_ratio": mix.branch_ratio, "knn_channels": mix.knn_channels,
                "conv_channels": mix.conv_channels, "share": mix.share.tolist(), "knn_norm": mix.knn_norm.tolist(),
                "conv_norm": mix.conv_norm.tolist()}

    @user_errors
    def api_pixels(self, image: FileData, row_px: int, col_px: int, num_neighbors: int = 64,
                   position_weight: float = 0.0, request: gr.Request | None = None) -> dict:
        """The input-level view (no model): the pixel's K most similar pixels by colour (+ position) and the K of
        its window, as boolean masks over the view (``like``, ``near``), their mean distances (pixels) and
        overlap."""
        image = an.load_image(self.uploaded(image))
        result = an.pixel_neighbors(image, self.pixel(row_px, col_px), num_neighbors, position_weight)
        return {"like": result.like.tolist(), "near": result.near.tolist(), "like_distance": result.like_distance,
                "near_distance": result.near_distance, "overlap": result.overlap, "window_size": result.window_size}

    @user_errors
    def api_table(self, checkpoint: str, image: FileData, layer: str, row_px: int = 16, col_px: int = 16,
                  num_neighbors: int = 0, window_size: int = 0, num_candidates: int = 0, seed: int = 0,
                  blend_alpha: float = 0.5, head: int = 0, fit: str = "crop",
                  request: gr.Request | None = None) -> dict:
        """What the page receives for a layer: every query's neighbours, statistics and contributions
        (:func:`analysis.page_table`; arrays base64-packed, little-endian)."""
        image = self.uploaded(image)
        return self.table(checkpoint, image, fit, layer, row_px, col_px, num_neighbors, window_size,
                          num_candidates, seed, blend_alpha, head, request)

    @user_errors
    def api_compare(self, checkpoints: list[str], image: FileData, row_px: int, col_px: int, depth: float = 0.5,
                    layers: list[str] | None = None, fit: str = "crop",
                    request: gr.Request | None = None) -> list[dict]:
        """Compare mode: 2–4 models' neighbours of one query, the pixel given in the first model's input and mapped
        onto each (:func:`analysis.compare_neighbors`); each column's layer from ``layers``, else the layer ``depth``
        of the way through the model. One :func:`analysis.query_record` per column."""
        image = self.image(self.uploaded(image), fit)
        models = self.compared(checkpoints, request)
        names = layers or [an.layer_at_depth(loaded, depth).name for loaded in models]
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise ValueError("layers must be a list of layer names, one per model")
        results = an.compare_neighbors(models, image, names, self.pixel(row_px, col_px))
        return [an.query_record(loaded, image, result) for loaded, result in zip(models, results, strict=True)]

    # -- compare mode -------------------------------------------------------------------------------------------------
    def compare_default(self) -> list[str]:
        """The models compare mode opens with: :data:`COMPARE_DEFAULT` where shipped, else the first three."""
        shipped = self.shipped()
        wanted = [name for name in COMPARE_DEFAULT if name in shipped]
        return wanted if len(wanted) >= 2 else shipped[:3]

    @staticmethod
    def compare_list(checkpoints: object) -> list:
        """``checkpoints`` if it can be compare mode's list: 2 to :data:`analysis.MAX_COMPARED` different entries
        (what its model list lets a user pick; each entry is checked as a model when it is loaded).

        Raises:
            ValueError: anything else, with the message the page shows.
        """
        if (not isinstance(checkpoints, list) or not 2 <= len(checkpoints) <= an.MAX_COMPARED
                or len({repr(checkpoint) for checkpoint in checkpoints}) != len(checkpoints)):
            raise ValueError(f"Pick 2 to {an.MAX_COMPARED} models to compare, each once.")
        return checkpoints

    def compared(self, checkpoints: object, request=None) -> list[an.LoadedModel]:
        """The models of compare mode's list (:meth:`compare_list`), each checked as the model list checks it.

        Raises:
            ValueError: not a list of 2 to :data:`analysis.MAX_COMPARED` different model names.
        """
        return [self.model(self.text(checkpoint, "a model"), request) for checkpoint in self.compare_list(checkpoints)]

    @staticmethod
    def too_few(compare_models) -> bool:
        """Fewer than 2 models left in compare mode's list (the user removing them): no columns, no error."""
        return isinstance(compare_models, list) and len(compare_models) < 2

    @staticmethod
    def on_compare_pick(compare_models, request=None):
        """Compare mode's list as the user picked it, to :data:`analysis.MAX_COMPARED` models: a model picked past
        them is not added, and the page says so (the list's own limit dropped it silently)."""
        if not isinstance(compare_models, list) or len(compare_models) <= an.MAX_COMPARED:
            return gr.skip()
        gr.Warning(f"Compare mode shows {an.MAX_COMPARED} models at most: remove one to add another.")
        return compare_models[:an.MAX_COMPARED]

    @user_errors
    def on_compare_layers(self, compare_models, compare_depth, request=None):
        """Each column's layer list, set to the layer ``compare_depth`` of the way through its model."""
        if self.too_few(compare_models):
            return {name: gr.update(visible=False) for name in COMPARE_LAYERS}
        models = self.compared(compare_models, request)
        updates = {}
        for index, name in enumerate(COMPARE_LAYERS):
            if index < len(models):
                loaded = models[index]
                short = [(f"{p.name} · {p.height}×{p.width}", p.name) for p in loaded.probes]  # caption: the rest
                updates[name] = gr.update(choices=short,
                                          value=an.layer_at_depth(loaded, compare_depth).name, visible=True,
                                          label=f"{loaded.card.name}: layer")
            else:
                updates[name] = gr.update(visible=False)
        return updates

    @user_errors
    def on_compare(self, compare_models, compare_layer_0, compare_layer_1, compare_layer_2, compare_layer_3,
                   image_file, fit, row_px, col_px, request=None):
        """Compare mode's value: each column's neighbour table (the page's, as the explorer gets it), each layer's
        own K, R and r, at the query of the boxes moved inside each model's input; with fewer than 2 models, no
        columns and a note."""
        if self.too_few(compare_models):
            return {"columns": [], "note": f"Pick 2 to {an.MAX_COMPARED} models to compare."}
        models = self.compared(compare_models, request)
        layers = [compare_layer_0, compare_layer_1, compare_layer_2, compare_layer_3][:len(models)]
        query_px = self.pixel(row_px, col_px)
        columns = []
        for checkpoint, loaded, layer in zip(compare_models, models, layers, strict=True):
            size = loaded.card.input_size
            columns.append(self.table(checkpoint, image_file, fit, layer, *an.clamp_px(query_px, size, size),
                                      0, 0, 0, 0, 0.5, 0, request, keep_query=False))
        return {"columns": columns}

    def on_compare_layers_if_open(self, compare_models, compare_depth, tab, request=None):
        """:meth:`on_compare_layers` after a link or a lesson's step that opens compare mode (``tab=compare``), so
        that the columns follow (:meth:`on_compare_if_open`); nothing when another tab is open."""
        if tab != "compare":
            return {name: gr.skip() for name in COMPARE_LAYERS}
        return self.on_compare_layers(compare_models, compare_depth, request)

    def on_compare_if_open(self, compare_models, compare_layer_0, compare_layer_1, compare_layer_2, compare_layer_3,
                           image_file, fit, row_px, col_px, tab, request=None):
        """:meth:`on_compare` for a new image while compare mode is the open tab; nothing otherwise."""
        if tab != "compare":
            return gr.skip()
        return self.on_compare(compare_models, compare_layer_0, compare_layer_1, compare_layer_2, compare_layer_3,
                               image_file, fit, row_px, col_px, request)

    # -- model, image, prediction ------------------------------------------------------------------------------------
    @user_errors
    def on_model(self, checkpoint, request=None):
        loaded = self.model(checkpoint, request)
        probes = loaded.probes
        default = next((p for p in probes if p.height < loaded.card.input_size), probes[0]) if probes else None
        heads = max((p.num_heads for p in probes), default=1)
        return {"card": an.card_summary(loaded.card),  # plain text in a read-only textbox: card text is never markup
                "layer": gr.update(choices=[(an.layer_label(p), p.name) for p in probes],
                                   value=default and default.name),
                "head": gr.update(maximum=heads - 1, value=0, visible=heads > 1)}

    @user_errors
    def on_first_render(self, checkpoint, image_file, fit, layer, row_px, col_px, num_neighbors, window_size,
                        num_candidates, seed, blend_alpha, head, request=None):
        """What a new model or image shows first: the explorer's table with the prediction, at the query of the
        boxes moved inside the model's input (a model of another input size still answers)."""
        size = self.model(checkpoint, request).card.input_size
        row_px, col_px = an.clamp_px(self.pixel(row_px, col_px), size, size)
        return self.table(checkpoint, image_file, fit, layer, row_px, col_px, num_neighbors, window_size,
                          num_candidates, seed, blend_alpha, head, request, keep_query=False)

    @user_errors
    def on_table(self, checkpoint, image_file, fit, layer, row_px, col_px, num_neighbors, window_size,
                 num_candidates, seed, blend_alpha, head, request=None):
        """A new table for a new layer or rule knob; the page keeps its query."""
        return self.table(checkpoint, image_file, fit, layer, row_px, col_px, num_neighbors, window_size,
                          num_candidates, seed, blend_alpha, head, request)

    @user_errors
    def on_table_row(self, checkpoint, image_file, fit, layer, num_neighbors, window_size, num_candidates, seed,
                     blend_alpha, head, evt: gr.SelectData, request=None):
        """A click's row when K is above the table's bound (the page asks for it, :data:`an.MAX_TABLE_NEIGHBORS`)."""
        row_px, col_px = self.clicked(evt)
        return self.table(checkpoint, image_file, fit, layer, row_px, col_px, num_neighbors, window_size,
                          num_candidates, seed, blend_alpha, head, request)

    @user_errors
    def on_sweep(self, checkpoint, image_file, fit, layer, row_px, col_px, num_neighbors, window_size,
                 num_candidates, seed, blend_alpha, head, request=None):
        """The α animation's frames for the table shown (the page asks once, when ▶ α is pressed)."""
        options = self.options(num_neighbors, window_size, num_candidates, seed, blend_alpha, head)
        sweep = an.blend_sweep(self.model(checkpoint, request), self.image(image_file, fit), layer, options)
        return an.page_sweep(sweep)

    @user_errors
    def on_checkpoint_upload(self, checkpoint_files, uploads, request=None):
        choice = an.store_upload(checkpoint_files or [], self.workspace, self.session(request), self.device)
        label = f"uploaded: {an.card_summary(self.model(choice, request).card).splitlines()[0]}"
        uploads = [*uploads, (label, choice)]
        return {"checkpoint": gr.update(choices=self.choices(uploads), value=choice), "uploads": uploads,
                "checkpoint_files": None,  # emptied, so that the next pair is an upload of two files again
                "compare_models": gr.update(choices=self.choices(uploads))}

    # -- links and lessons ------------------------------------------------------------------------------------------
    def example_name(self, image_file: str | None) -> str | None:
        """The example an image file holds (compared by content: an upload may share an example's file name), or
        None: an uploaded photo, which a link cannot carry."""
        if not image_file or not isinstance(image_file, str) or not Path(image_file).is_file():
            return None
        if Path(image_file).stat().st_size > 2**20:  # the examples are small PNGs
            return None
        return self.example_digests.get(hashlib.sha256(Path(image_file).read_bytes()).hexdigest())

    def view(self, params: dict, checkpoint: str | None, request=None) -> dict:
        """The page's updates for a link's fields (:func:`analysis.parse_link`), each checked as its control checks
        it (a shipped model, one of its layers, an example, numbers through :func:`checked_number` with the
        control's bounds, a pixel inside the model's input, a tab, compare mode's 2 to 4 shipped models); a model,
        image, tab or compare mode's models or depth the link leaves out stays as it is, a pixel or knob it leaves
        out takes its control's default (a lesson's step is the same view whatever came before), and every value
        refused is named in ``link_note`` (the page still opens)."""
        values, problems = an.parse_link(params)
        out = {name: gr.update() for name in VIEWS["link"][2]}
        shipped = self.shipped()
        if "model" in values:
            if values["model"] in shipped:
                checkpoint = out["checkpoint"] = values["model"]
            else:
                problems.append(f"the link's model {an.echo(values['model'])} is not one of the shipped models")
        out |= self.on_model(checkpoint, request)
        loaded = self.model(checkpoint, request)
        probes = {probe.name: probe for probe in loaded.probes}
        if "layer" in values:
            if values["layer"] in probes:
                out["layer"]["value"] = values["layer"]  # the model's update holds its layers
            else:
                problems.append(f"the link's layer {an.echo(values['layer'])} is not a layer of this model")
        if "image" in values:
            if values["image"] in self.example_paths:
                out["image_file"] = self.example_paths[values["image"]]
            else:
                problems.append(f"the link's image {an.echo(values['image'])} is not one of the examples")
        heads = out["head"]["maximum"] + 1  # the model's update set the head's range
        for key, control in LINK_CONTROLS.items():  # a link is the whole view: a knob it leaves out (or that is
            number = None                            # refused) takes its control's default
            if key in values:
                try:
                    number = checked_number(values[key], self.controls[control])
                except gr.Error as err:
                    problems.append(f"the link's {key}: {err.message}")
                bound = {"row": loaded.card.input_size, "col": loaded.card.input_size, "head": heads}.get(key)
                if number is not None and bound is not None and number >= bound:
                    problems.append(f"the link's {key} must be below {bound} for this model, got {number}")
                    number = None
            if key == "head":  # the model's update above set its range and the default head
                if number is not None:
                    out[control]["value"] = number
            else:
                out[control] = self.controls[control].value if number is None else number
        layer = out["layer"]["value"]
        if layer in probes:  # the knobs together, as the table will check them for this layer
            try:
                an.resolve_options(probes[layer], self.options(*(out[name] for name in KNOBS[:-1]),
                                                               out["head"]["value"]))
            except ValueError as err:
                problems.append(f"the link's knobs: {err}")
                out |= {name: self.controls[name].value for name in KNOBS[:-1]}
        if "compare" in values:  # compare mode's columns, as its model list allows them
            if any(name not in shipped for name in values["compare"]):
                problems.append("the link's compare must name shipped models only")
            else:
                try:
                    out["compare_models"] = self.compare_list(values["compare"])
                except ValueError as err:
                    problems.append(f"the link's compare: {err}")
        if "depth" in values:
            try:
                out["compare_depth"] = checked_number(values["depth"], self.controls["compare_depth"])
            except gr.Error as err:
                problems.append(f"the link's depth: {err.message}")
        if "tab" in values:
            if values["tab"] in TABS:
                out["tabs"], out["tab"] = gr.Tabs(selected=values["tab"]), values["tab"]
            else:
                problems.append(f"the link's tab {an.echo(values['tab'])} is not one of: {', '.join(TABS)}")
        # The rule shown large (web/explorer.js reads focus_rule once per new value): the link's, else what the
        # layer used, as on a fresh page; the link's text makes each step's value new.
        rules = an.page_rules()
        rule = values.get("rule", rules[-1])
        if rule not in rules:
            problems.append(f"the link's rule {an.echo(rule)} is not one of: {', '.join(rules)}")
            rule = rules[-1]
        out["focus_rule"] = f"{rule}@{an.link_query(values)}"
        # every problem (at most one per link field, each value echoed shortened), none ending the sentence early
        out["link_note"] = ("**This link could not set everything:** "
                            + "; ".join(problem.rstrip(".") for problem in problems) + ".") if problems else ""
        return out

    @user_errors
    def on_link(self, checkpoint, request=None):
        """The page as the address's query string says (a plain address: the model's default view)."""
        params = dict(request.query_params) if request is not None and request.query_params else {}
        out = self.view(params, checkpoint, request)
        if out["link_note"]:  # said where the page opens too: the note is far below the first screen; until
            #                    closed, as the page may take longer to open than a toast's 10 s (a loaded server)
            gr.Warning("This link could not set everything it names: the note under “Copy a link to this view” says "
                       "what. The rest of the view is open.", duration=None)
        return out

    def on_link_copy(self, checkpoint, image_file, layer, row_px, col_px, num_neighbors, window_size,
                     num_candidates, seed, blend_alpha, head, tab, compare_models=None, compare_depth=None,
                     request=None) -> dict:
        """The query string of the view shown (:func:`analysis.link_query`; knobs left at their defaults are left
        out; with compare mode open, its models and depth too) and a note naming what cannot travel in it: an
        uploaded model or photo (:data:`LINK_NOTE`)."""
        shipped = self.shipped()
        example = self.example_name(image_file)
        comparing = tab == "compare" and isinstance(compare_models, list)
        compared = comparing and all(name in shipped for name in compare_models)
        left = [what for what, missing in (("the uploaded model", checkpoint not in shipped),
                                           ("the uploaded photo", example is None),
                                           ("the uploaded models compared", comparing and not compared)) if missing]
        note = (f"**This link leaves out {' and '.join(left)}:** it stays on this server, so the link opens "
                "whatever model or image the opening page has." if left else "")
        fields = {"model": checkpoint if checkpoint in shipped else None, "image": example,
                  "layer": layer, "row": row_px, "col": col_px, "k": num_neighbors or None,
                  "window": window_size or None, "r": num_candidates or None, "seed": seed or None,
                  "alpha": None if blend_alpha == 0.5 else blend_alpha, "head": head or None,
                  "tab": tab if tab in TABS else None,
                  "compare": compare_models if compared else None, "depth": compare_depth if compared else None}
        return {"link": an.link_query(fields), "link_note": note}

    def lesson_step(self, lesson, step, checkpoint, request=None) -> dict:
        """Step ``step`` of the lesson titled ``lesson``: its link's view (:meth:`view`), its paragraph, and the
        step reached (clamped to the lesson's steps); without a lesson, only a note where its text goes."""
        found = next((item for item in self.lessons if item["title"] == lesson), None)
        if found is None:  # said where the lesson's text goes; the view stays as it is (no error on every box)
            return {name: gr.skip() for name in LINK_OUTPUTS} | {
                "lesson_text": "Pick a lesson first, in the list beside Back and Next.", "lesson_step": 0}
        steps = found["steps"]
        step = min(max(an.whole_number(step, "the lesson's step"), 0), len(steps) - 1)
        params = dict(parse_qsl(steps[step]["link"]))
        text = f"**Step {step + 1} of {len(steps)}.** {steps[step]['text']}"
        if step == len(steps) - 1:  # Next has nowhere to go: say so
            text += f"\n\n*{LESSON_END}*"
        return self.view(params, checkpoint, request) | {"lesson_text": text, "lesson_step": step}

    @user_errors
    def on_lesson_start(self, lesson, checkpoint, request=None):
        return self.lesson_step(lesson, 0, checkpoint, request)

    @user_errors
    def on_lesson_next(self, lesson, lesson_step, checkpoint, request=None):
        return self.lesson_step(lesson, (lesson_step or 0) + 1, checkpoint, request)

    @user_errors
    def on_lesson_back(self, lesson, lesson_step, checkpoint, request=None):
        return self.lesson_step(lesson, (lesson_step or 0) - 1, checkpoint, request)

    @user_errors
    def on_example(self, evt: gr.SelectData, request=None) -> str:
        return self.examples[an.whole_number(evt.index, "the example's index", 0, len(self.examples) - 1)]

    @user_errors
    def on_image_upload(self, image_upload: str | None, request=None) -> str:
        self.image(image_upload)  # refuse what cannot be read before it replaces the current image
        return image_upload

    # -- the tabs ----------------------------------------------------------------------------------------------------
    @user_errors
    def on_weights(self, checkpoint, layer, request=None):
        loaded = self.model(checkpoint, request)
        probe = loaded.probe(layer)
        if probe.dense:  # no chart, not two empty boxes
            return {"kernel_plot": gr.Plot(None, visible=False), "slot_plot": gr.Plot(None, visible=False),
                    "weights_note": f"{probe.name} is plain attention: no rank-slot kernel to show."}
        heat, bars = figures.kernel_figures(an.aggregation_kernel(loaded, layer))
        note = ("A conv-only layer: its taps are the window's rank slots (METHOD §4.1)." if probe.record_name is None
                else "Each neighbour's contribution to the clicked cell is in the explorer above.")
        return {"kernel_plot": gr.Plot(heat, visible=True), "slot_plot": gr.Plot(bars, visible=True),
                "weights_note": note}

    @user_errors
    def on_mix(self, checkpoint, image_file, fit, layer, request=None):
        loaded = self.model(checkpoint, request)
        probe = loaded.probe(layer)
        if not probe.is_hybrid:
            return {"mix_plot": None, "mix_note": f"{probe.name} is not a hybrid layer: the λ mix exists only in "
                                                  "hybrid ConvNN layers."}
        mix = an.branch_mix(loaded, self.image(image_file, fit), layer)
        return {"mix_plot": figures.mix_figure(mix, probe.name), "mix_note": an.mix_summary(mix)}

    @staticmethod
    def hop_fields(loaded: an.LoadedModel, image: an.InputImage, layer: str, query_px: tuple[int, int], hops,
                   head) -> dict:
        """The multi-hop view's value: the fields of every query where they fit one table
        (:func:`an.fits_field_table`), so that clicks are answered in the page; else of the query at ``query_px``."""
        probe = loaded.probe(layer)
        queries = None
        if not an.fits_field_table(probe):
            row, col = an.query_cell(probe, *query_px)
            queries = (row * probe.width + col,)
        fields = an.receptive_fields(loaded, image, layer, hops, head, queries)
        return an.page_hops(an.model_view(image, loaded.card.input_size), fields, probe)

    @user_errors
    def on_hops(self, checkpoint, image_file, fit, layer, row_px, col_px, hops, head, request=None):
        """:meth:`hop_fields` at the query of the boxes, moved inside the model's input as the explorer moves a
        query kept across a change of model."""
        loaded, image = self.model(checkpoint, request), self.image(image_file, fit)
        size = loaded.card.input_size
        return self.hop_fields(loaded, image, layer, an.clamp_px(self.pixel(row_px, col_px), size, size), hops, head)

    @user_errors
    def on_hops_row(self, checkpoint, image_file, fit, layer, hops, head, evt: gr.SelectData, request=None):
        """The field of a clicked query that the multi-hop view's table does not hold (the page asks for it); where
        the table holds every query, nothing is sent again."""
        loaded = self.model(checkpoint, request)
        if an.fits_field_table(loaded.probe(layer)):
            return gr.skip()
        return self.hop_fields(loaded, self.image(image_file, fit), layer, self.clicked(evt), hops, head)

    @user_errors
    def on_spectrum(self, checkpoint, image_file, fit, request=None):
        loaded, image = self.model(checkpoint, request), self.image(image_file, fit)
        return figures.spectrum_figure(an.selection_spectrum(loaded, image))

    @user_errors
    def on_spectrum_models(self, image_file, fit, request=None):
        """Every shipped model's layers on one axis for this image (loads each model once; seconds the first time)."""
        image = self.image(image_file, fit)
        spectra, refused = {}, []
        for _, path in an.list_checkpoints(self.checkpoint_dir).found:
            try:
                spectra[path.stem] = an.selection_spectrum(an.load_model(path, self.device), image)
            except CheckpointError:  # one broken card in a --checkpoints folder leaves out only itself
                refused.append(path.stem)
        if refused:
            gr.Warning(f"Left out, as they cannot be loaded: {', '.join(refused)} (pick one in the model list to "
                       "see why).")
        return figures.spectrum_models_figure(spectra)

    @user_errors
    def on_attribution(self, checkpoint, image_file, fit, method, target, request=None, progress=None):
        loaded, image = self.model(checkpoint, request), self.image(image_file, fit)
        if progress is not None:  # Gradio's tracker: follows Captum's progress bars (occlusion)
            progress(0, desc=f"{an.ATTRIBUTION_METHODS.get(method, 'attribution')}…")
        result = an.attribution_map(loaded, image, method, target or None)
        return {"attribution_plot": figures.attribution_figure(an.model_view(image, loaded.card.input_size), result),
                "attribution_note": result.note}

    @user_errors
    def on_equivalence(self, checkpoint, image_file, fit, layer, request=None):
        loaded, image = self.model(checkpoint, request), self.image(image_file, fit)
        return {"equivalence_text": an.equivalence_summary(loaded, image, layer),
                "equivalence_plot": figures.equivalence_figure(an.equivalences(loaded, image, layer))}

    @staticmethod
    def on_slow_reset(request=None):
        """A new model, image or layer: the slow views' last results no longer apply; they run when asked."""
        return {"attribution_plot": None, "attribution_note": ATTRIBUTION_PROMPT,
                "equivalence_text": EQUIVALENCE_PROMPT, "equivalence_plot": None, "spectrum_models_plot": None}

    @staticmethod
    def on_attribution_cancel(request=None):
        """Cancel pressed: the run is dropped (its computation ends in the background), and the page says so."""
        return {"attribution_plot": None, "attribution_note": ATTRIBUTION_CANCELLED}

    @user_errors
    def on_export(self, checkpoint, image_file, fit, layer, row_px, col_px, num_neighbors, window_size,
                  num_candidates, seed, blend_alpha, head, request=None):
        """Write the query's overlay (PNG) and neighbours (JSON) for download; only when asked, not on every click.
        Gradio serves them from its own cache (the work dir is never served)."""
        loaded, image = self.model(checkpoint, request), self.image(image_file, fit)
        options = self.options(num_neighbors, window_size, num_candidates, seed, blend_alpha, head)
        result = an.query_neighbors(loaded, image, layer, self.pixel(row_px, col_px), options)
        return {"exports": [str(path) for path in an.export_query(self.workspace, self.session(request), loaded,
                                                                  image, result)],
                "neighbors_data": an.page_json(an.query_record(loaded, image, result))}  # a seed shown exactly

    # -- the input-level view (the upload itself, at a few hundred pixels a side) ------------------------------------
    @user_errors
    def on_pixel_image(self, image_file, request=None):
        view = an.pixel_view(an.load_image(image_file))
        return an.display_image(view, an.display_factor(max(view.shape[:2]), 384))

    @user_errors
    def on_pixel_click(self, image_file, evt: gr.SelectData) -> tuple[int, int]:
        view = an.pixel_view(an.load_image(image_file))
        factor = an.display_factor(max(view.shape[:2]), 384)
        x_px, y_px = an.click_position(evt.index, view.shape[1] * factor, view.shape[0] * factor)
        return an.display_to_input_px(x_px, y_px, factor, *view.shape[:2])

    @user_errors
    def on_pixel_query(self, image_file, pixel_row, pixel_col, request=None) -> dict:
        """The input-level query moved inside the (new) image's view."""
        row, col = an.clamp_px(self.pixel(pixel_row, pixel_col), *an.pixel_view(an.load_image(image_file)).shape[:2])
        return {"pixel_row": row, "pixel_col": col}

    @user_errors
    def on_pixels(self, image_file, pixel_row, pixel_col, pixel_k, position_weight, request=None):
        image, query_px = an.load_image(image_file), self.pixel(pixel_row, pixel_col)
        result = an.pixel_neighbors(image, query_px, pixel_k, position_weight)
        return figures.pixel_figure(an.pixel_view(image), result, query_px)


SLOW_VIEWS = ("on_attribution", "on_equivalence", "on_spectrum_models")  # run only when asked (SlowRuns)
KNOBS = ["num_neighbors", "window_size", "num_candidates", "seed", "blend_alpha", "head"]  # what a selection reads
QUERY = ["checkpoint", "image_file", "fit", "layer", "row_px", "col_px", *KNOBS]  # all a table is made from
COMPARE_QUERY = ["compare_models", *COMPARE_LAYERS, "image_file", "fit", "row_px", "col_px"]  # compare mode's
# The views, by name: (handler, inputs, outputs), each a component's elem_id.
# What a link or a lesson's step sets (Explorer.view).
LINK_OUTPUTS = ["checkpoint", "card", "layer", "head", "image_file", "row_px", "col_px", *KNOBS[:-1], "tabs", "tab",
                "focus_rule", "compare_models", "compare_depth", "link_note"]
VIEWS = {
    "model": ("on_model", ["checkpoint"], ["card", "layer", "head"]),
    "link": ("on_link", ["checkpoint"], LINK_OUTPUTS),
    "lesson_start": ("on_lesson_start", ["lesson", "checkpoint"], [*LINK_OUTPUTS, "lesson_text", "lesson_step"]),
    "lesson_next": ("on_lesson_next", ["lesson", "lesson_step", "checkpoint"],
                    [*LINK_OUTPUTS, "lesson_text", "lesson_step"]),
    "lesson_back": ("on_lesson_back", ["lesson", "lesson_step", "checkpoint"],
                    [*LINK_OUTPUTS, "lesson_text", "lesson_step"]),
    "checkpoint_upload": ("on_checkpoint_upload", ["checkpoint_files", "uploads"],
                          ["checkpoint", "uploads", "checkpoint_files", "compare_models"]),
    "compare_pick": ("on_compare_pick", ["compare_models"], ["compare_models"]),
    "compare_layers": ("on_compare_layers", ["compare_models", "compare_depth"], COMPARE_LAYERS),
    "compare": ("on_compare", COMPARE_QUERY, ["compare"]),
    "compare_if_open": ("on_compare_if_open", [*COMPARE_QUERY, "tab"], ["compare"]),
    "compare_layers_if_open": ("on_compare_layers_if_open", ["compare_models", "compare_depth", "tab"],
                               COMPARE_LAYERS),
    "example": ("on_example", [], ["image_file"]),
    "image_upload": ("on_image_upload", ["image_upload"], ["image_file"]),
    "first_render": ("on_first_render", QUERY, ["explorer"]),
    "table": ("on_table", QUERY, ["explorer"]),
    "weights": ("on_weights", ["checkpoint", "layer"], ["kernel_plot", "slot_plot", "weights_note"]),
    "mix": ("on_mix", ["checkpoint", "image_file", "fit", "layer"], ["mix_plot", "mix_note"]),
    "hops": ("on_hops", ["checkpoint", "image_file", "fit", "layer", "row_px", "col_px", "hops", "head"],
             ["hop_view"]),
    "spectrum": ("on_spectrum", ["checkpoint", "image_file", "fit"], ["spectrum_plot"]),
    "slow_reset": ("on_slow_reset", [], ["attribution_plot", "attribution_note", "equivalence_text",
                                         "equivalence_plot", "spectrum_models_plot"]),
    "pixel_image": ("on_pixel_image", ["image_file"], ["pixel_image"]),
    "pixel_query": ("on_pixel_query", ["image_file", "pixel_row", "pixel_col"], ["pixel_row", "pixel_col"]),
    "pixels": ("on_pixels", ["image_file", "pixel_row", "pixel_col", "pixel_k", "position_weight"], ["pixel_plot"]),
}
# The refresh policy: what each change runs, in order. What the page shows first comes first (the prediction and
# the explorer's table); a click or a hover in the explorer runs nothing here (the page answers it from the table);
# the slow views (attribution, the equivalence demo) never run in a refresh, they are reset to their prompt and
# run when asked. Model, layer, head and the number knobs answer the user only (.input, .blur), and the image is set
# by the example, upload, link and lesson events, each of which runs its own chain: a link or a lesson's step sets
# model, layer, pixel and knobs at once, and a .change of one of them would run a view on a half-applied mix of old
# and new values (the model's .change reset its layer; a knob's asked for the old layer of the new model). A number
# box applies its value when the user leaves it (Enter leaves it, web/page.js), not at each key: a number being
# typed passes through values the other knobs refuse (r = 3 on the way to 32, below K = 9), and a refusal put the
# box back under the user's fingers. Each event runs its chain for the last of quick changes (always_last, set in
# build_demo): Gradio's default dropped a change made while the one before was answered (K typed "30", view K = 3).
MODEL_CHAIN = ["first_render", "weights", "mix", "spectrum", "hops", "slow_reset"]
IMAGE_CHAIN = ["first_render", "mix", "spectrum", "hops", "slow_reset", "pixel_image", "pixel_query", "pixels",
               "compare_if_open"]
VIEW_CHAIN = [*MODEL_CHAIN, "pixel_image", "pixel_query", "pixels",  # after a link or a lesson's step: anything
              "compare_layers_if_open", "compare_if_open"]
REFRESH = {
    ("demo", "load"): ["link", *VIEW_CHAIN],
    ("checkpoint", "input"): ["model", *MODEL_CHAIN],
    ("checkpoint_files", "upload"): ["checkpoint_upload", "model", *MODEL_CHAIN],
    ("examples", "select"): ["example", *IMAGE_CHAIN],
    ("image_upload", "upload"): ["image_upload", *IMAGE_CHAIN],
    ("lesson", "input"): ["lesson_start", *VIEW_CHAIN],
    ("lesson_next", "click"): ["lesson_next", *VIEW_CHAIN],
    ("lesson_back", "click"): ["lesson_back", *VIEW_CHAIN],
    ("fit", "change"): ["first_render", "mix", "spectrum", "hops", "slow_reset", "compare_if_open"],
    ("compare_tab", "select"): ["compare_layers", "compare"],
    ("compare_models", "input"): ["compare_pick", "compare_layers", "compare"],
    ("compare_depth", "release"): ["compare_layers", "compare"],
    **{(layer, "input"): ["compare"] for layer in COMPARE_LAYERS},
    ("layer", "input"): ["table", "weights", "mix", "hops", "slow_reset"],
    ("head", "blur"): ["table", "hops"],
    **{(knob, "blur"): ["table"] for knob in ("num_neighbors", "window_size", "num_candidates", "seed")},
    ("blend_alpha", "release"): ["table"],
    ("hops", "release"): ["hops"],
    ("pixel_k", "release"): ["pixels"],
    ("position_weight", "release"): ["pixels"],
    **{(box, "blur"): ["pixels"] for box in ("pixel_row", "pixel_col")},
}


# The knob values each drawn table was made from, kept in the page (the explorer's .change, run in the page); a
# refused knob value is put back to them, so that the next change of another knob is not refused for it again.
KEEP_KNOBS_JS = "(...values) => { window.convnnKnobs = values; }"
RESTORE_KNOBS_JS = "(...values) => window.convnnKnobs ?? values"
# The page's address with a view's query string, copied to the clipboard where the browser allows it.
COPY_LINK_JS = """(query) => {
  const rule = document.querySelector("#explorer .cx")?.dataset.rule;
  const url = `${location.origin}${location.pathname}?${query}${rule ? `&rule=${rule}` : ""}`;
  if (navigator.clipboard) navigator.clipboard.writeText(url).catch(() => {});
  return url;
}"""


def build_layout(ex: Explorer) -> dict[str, gr.components.Component]:
    """The page's components, laid out, by ``elem_id`` (no events: :func:`build_demo` wires them)."""
    ui: dict[str, gr.components.Component] = {}

    def add(component):
        ui[component.elem_id] = component
        return component

    upload_mb, left_out = ex.max_upload_mb, ex.left_out()
    ui["uploads"] = gr.State([])  # this session's uploaded checkpoints (a State has no elem_id)
    gr.Markdown(f"# ConvNN Explorer\nConvolution and attention as one k-nearest-neighbour operation · compute "
                f"path: **{an.compute_path(ex.device)}**", elem_id="title")
    with gr.Row(equal_height=False, elem_id="main_row"):
        with gr.Column(scale=2, min_width=300, elem_id="pick_column"):
            guide = [gr.Markdown(text, visible=False) for text in GUIDE[:2]]
            add(gr.Dropdown(ex.choices([]), value=ex.default_checkpoint(), label="Model", allow_custom_value=True,
                            elem_id="checkpoint"))
            add(gr.Textbox("\n".join(left_out), label="Left out of the model list: they cannot be opened",
                           lines=min(len(left_out), 4), max_lines=8, interactive=False, visible=bool(left_out),
                           elem_id="left_out"))  # plain text: a card's text is never markup
            add(gr.Gallery(ex.examples, columns=10, rows=2, height=80, allow_preview=False, label="Examples",
                           show_label=False, object_fit="cover", buttons=[],
                           elem_id="examples"))  # 32 px images: 2 rows, no icons over them
            add(gr.UploadButton(f"Upload a photo (≤ {upload_mb} MB)", file_types=["image"], size="md",
                                elem_id="image_upload"))
            add(gr.Radio(list(an.FITS), value="crop", label="A photo that is not square is…", elem_id="fit"))
            add(gr.Dropdown(label="Layer", allow_custom_value=True, elem_id="layer"))
            with gr.Row(elem_id="query_boxes"):  # the clicked pixel (a phone taps instead: hidden there)
                add(CheckedNumber(16, precision=0, minimum=0, label="query row (px)", elem_id="row_px", min_width=90))
                add(CheckedNumber(16, precision=0, minimum=0, label="query col (px)", elem_id="col_px", min_width=90))
            # The selection knobs beside the explorer they change (below it on a phone, after the layer).
            with gr.Group(elem_id="knobs"):
                with gr.Row():
                    add(CheckedNumber(0, precision=0, minimum=0, label="K (0 = layer's)", elem_id="num_neighbors",
                                      min_width=130))
                    add(CheckedNumber(0, precision=0, minimum=0, label="window R (0 = auto)", elem_id="window_size",
                                      min_width=130))
                with gr.Row():
                    add(CheckedNumber(0, precision=0, minimum=0, label="random r (0 = layer's / 32)",
                                      elem_id="num_candidates", min_width=130))
                    add(CheckedNumber(0, precision=0, minimum=0, label="seed (0 = the layer's)", elem_id="seed",
                                      min_width=130))
                add(CheckedNumber(0, precision=0, minimum=0, label="attention head", visible=False, elem_id="head",
                                  min_width=130))
                add(CheckedSlider(0, 1, value=0.5, step=0.05, label="blend α (0 = window, 1 = features)",
                                  elem_id="blend_alpha", min_width=200))
            add(gr.File(ex.examples[0] if ex.examples else None, file_types=["image"], elem_id="image_file",
                        label="Image", visible=False))  # the file every view reads (the explorer shows it)
            with gr.Row(elem_id="link_row"):
                add(gr.Button("Copy a link to this view", size="sm", elem_id="link_button", min_width=120))
                add(gr.Textbox(label="link", show_label=False, interactive=False, buttons=["copy"], elem_id="link",
                               placeholder=LINK_NOTE, min_width=160))
            add(gr.Markdown("", elem_id="link_note"))
            add(gr.Textbox("", visible="hidden", elem_id="focus_rule"))  # a link's rule, for the explorer
            guide += [gr.Markdown(text, visible=False) for text in GUIDE[2:4]]
        with gr.Column(scale=5, min_width=320, elem_id="explore_column"):
            # Right above the explorer: a step's text next to what it describes, on a desktop and on a phone.
            with gr.Accordion("Lessons: convolution, attention and what lies between", open=False, elem_id="lessons"):
                with gr.Row():
                    add(gr.Dropdown([lesson["title"] for lesson in ex.lessons], value=None, label="lesson",
                                    elem_id="lesson", scale=3))
                    add(gr.Button("◀ Back", elem_id="lesson_back", scale=1, min_width=80))
                    add(gr.Button("Next step ▶", variant="primary", elem_id="lesson_next", scale=1, min_width=80))
                add(gr.Markdown("Pick a lesson: each step sets the model, the image, the layer and the pixel, and says "
                                "in plain words what to look at.", elem_id="lesson_text"))
            add(gr.HTML(None, elem_id="explorer", html_template='<div class="cx"></div>',
                        css_template=_web("explorer.css"), js_on_load=_web("panel.js") + _web("explorer.js"),
                        padding=False))
            add(gr.HTML(None, elem_id="sweep", html_template="<div></div>", js_on_load=_web("sweep.js")))
    ui["lesson_step"] = gr.State(0)  # the step of the lesson shown
    ui["tab"] = gr.State(next(iter(TABS)))  # the tab open, for a link (Tabs send no value of their own)
    with gr.Accordion("Model card, or open your own checkpoint", open=False):
        add(gr.Textbox(label="Model card", lines=8, max_lines=12, interactive=False, show_label=False,
                       elem_id="card"))
        add(gr.File(file_count="multiple", file_types=[".safetensors", ".json"], elem_id="checkpoint_files",
                    label=f"Upload your checkpoint (.safetensors + .json, up to {upload_mb} MB)"))
    guided = add(gr.Checkbox(value=False, label="Guided mode (numbered steps)", elem_id="guided"))
    with gr.Accordion("Export (PNG overlay, JSON of indices)", open=False):
        add(gr.Button("Export this query", elem_id="export_button"))
        add(gr.File(file_count="multiple", label="Downloads", elem_id="exports"))
        add(gr.JSON(label="Neighbours (JSON)", elem_id="neighbors_data"))
    guide.append(gr.Markdown(GUIDE[4], visible=False))
    with add(gr.Tabs(elem_id="tabs", overflow_behavior="wrap")):  # every view's name in sight, on a phone too
        with gr.Tab(TABS["weights"], id="weights"):
            add(gr.Markdown(elem_id="weights_note"))
            with gr.Row():
                add(gr.Plot(label="kernel", elem_id="kernel_plot"))
                add(gr.Plot(label="per rank slot", elem_id="slot_plot"))
        with gr.Tab(TABS["mix"], id="mix"):
            add(gr.Markdown(elem_id="mix_note"))
            add(gr.Plot(label="ConvNN share", elem_id="mix_plot"))
        with gr.Tab(TABS["attribution"], id="attribution"):
            with gr.Row():
                add(gr.Dropdown([(label, method) for method, label in an.ATTRIBUTION_METHODS.items()],
                                value="saliency", label="method", elem_id="method"))
                add(gr.Textbox("", label="class (empty = predicted)", elem_id="target"))
                add(gr.Button("Compute attribution", variant="primary", elem_id="attribution_button"))
                add(gr.Button("Cancel", elem_id="attribution_cancel"))
            add(gr.Markdown(ATTRIBUTION_PROMPT, elem_id="attribution_note"))
            add(gr.Plot(label="attribution", elem_id="attribution_plot"))
        with gr.Tab(TABS["spectrum"], id="spectrum"):
            add(gr.Plot(label="spectrum", elem_id="spectrum_plot"))
            add(gr.Button("Place every shipped model on this image", elem_id="spectrum_models_button"))
            add(gr.Plot(label="every model", elem_id="spectrum_models_plot"))
        with add(gr.Tab(TABS["compare"], id="compare", elem_id="compare_tab")):
            with gr.Row():
                compare_choices = ex.choices([])
                add(gr.Dropdown(compare_choices, value=ex.compare_default(), multiselect=True,  # past the limit:
                                label=f"models, one column each (2–{an.MAX_COMPARED})",  # on_compare_pick
                                elem_id="compare_models", scale=3))
                add(CheckedSlider(0, 1, value=0.5, step=0.05, label="depth: how far through each model",
                                  elem_id="compare_depth", scale=2, min_width=200))
            with gr.Row():
                for index, name in enumerate(COMPARE_LAYERS):
                    add(gr.Dropdown(label=f"column {index + 1}: layer", allow_custom_value=True, elem_id=name,
                                    visible=index < 3, min_width=160))
            add(gr.HTML(None, elem_id="compare", html_template='<div class="cc"></div>',
                        css_template=_web("explorer.css"), js_on_load=_web("panel.js") + _web("compare.js"),
                        padding=False))
        with gr.Tab(TABS["equivalence"], id="equivalence"):
            add(gr.Button("Run on this layer's features", elem_id="equivalence_button"))
            add(gr.Markdown(EQUIVALENCE_PROMPT, elem_id="equivalence_text"))
            add(gr.Plot(label="ConvNN vs the operation it equals", elem_id="equivalence_plot"))
        with gr.Tab(TABS["hops"], id="hops"):
            gr.Markdown("Neighbours of neighbours, towards the input: the pixels the clicked query reaches through "
                        "consecutive layers' selections (follows the click above).")
            add(CheckedSlider(1, 4, value=2, step=1, label="hops (towards the input)", elem_id="hops"))
            add(gr.HTML(None, elem_id="hop_view", html_template='<div class="cx-hops"></div>',
                        css_template=_web("explorer.css"), js_on_load=_web("hops.js"), padding=False))
        with gr.Tab(TABS["pixels"], id="pixels"):
            gr.Markdown("No trained model: each pixel's colour (+ position) is its feature. Click a pixel.")
            with gr.Row():
                add(gr.Image(type="numpy", format="png", interactive=False, show_label=False, buttons=[],
                             elem_id="pixel_image"))
                with gr.Column():
                    add(CheckedSlider(1, 1024, value=64, step=1, label="K", elem_id="pixel_k"))
                    add(CheckedSlider(0, 4, value=0, step=0.1, label="position weight", elem_id="position_weight"))
                    add(CheckedNumber(0, precision=0, label="row", elem_id="pixel_row"))
                    add(CheckedNumber(0, precision=0, label="col", elem_id="pixel_col"))
            add(gr.Plot(label="like vs near", elem_id="pixel_plot"))
    guided.change(lambda on: [gr.update(visible=on)] * len(guide), guided, guide, api_visibility="private")
    return ui


@functools.cache
def _web(name: str) -> str:
    """A file of the page's own JavaScript or CSS, from the ``web/`` folder beside this file."""
    return (WEB_DIR / name).read_text(encoding="utf-8")


def wire(ex: Explorer, ui: dict, fn_name: str, inputs: list[str], outputs: list[str]):
    """The ``fn``, ``inputs`` and ``outputs`` keywords of a Gradio event: the Explorer method ``fn_name``, called
    with each input value as the keyword of its component's name in ``ui`` (its ``elem_id``), plus the request and,
    if it takes them, the event data (``evt``) and Gradio's progress tracker (``progress``). Gradio passes inputs
    given as a set as one ``{component: value}`` dict; a handler of several outputs returns ``{name: value}``."""
    fn = getattr(ex, fn_name)
    params = inspect.signature(fn).parameters
    extra = [p for p in ("evt", "progress") if p in params]

    names = {block._id: name for name, block in ui.items() if name in inputs}

    def handler(*args):
        values, request, *special = args if inputs else ({}, *args)
        kwargs = dict(zip(extra, special, strict=True))
        result = fn(**{names[block._id]: value for block, value in values.items()}, request=request, **kwargs)
        return {ui[name]: value for name, value in result.items()} if len(outputs) > 1 else result

    annotations = {"values": dict, "request": gr.Request, "evt": gr.SelectData, "progress": gr.Progress}
    order = (["values"] if inputs else []) + ["request", *extra]
    handler.__signature__ = inspect.Signature([
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotations[name],
                          default=gr.Progress(track_tqdm=True) if name == "progress" else inspect.Parameter.empty)
        for name in order])
    handler.__annotations__ = {name: annotations[name] for name in order}  # Gradio reads the special ones here
    handler.__name__ = fn_name
    return {"fn": handler, "inputs": {ui[name] for name in inputs} or None, "outputs": [ui[name] for name in outputs]}


def build_demo(explorer: Explorer | None = None) -> gr.Blocks:
    """The page (:func:`build_layout`) and its events: the refresh policy (:data:`REFRESH`), then the actions."""
    ex = explorer or Explorer()
    with gr.Blocks(title="ConvNN Explorer", delete_cache=(FILE_SWEEP_S, FILE_MAX_AGE_S)) as demo:
        ui = build_layout(ex)
        ui["demo"] = demo
        ex.controls = {name: ui[name] for name in [*LINK_CONTROLS.values(), "compare_depth"]}

        # The slow views run in their own concurrency group, one at a time over all sessions, so that clicks and
        # predictions never wait behind them; the page sends at most one of each (always_last), the server admits
        # one per session and a few in all (Admission). A change of what a slow view reads drops the session's run
        # of it on the server: a new model, image, fit or layer in the slow_reset step that ends its chain (no
        # request of its own), a new method or class beside it; so does Cancel. A dropped run's event ends with no
        # change to the page, and its computation still holds its place until it ends (SlowRuns).
        runs = SlowRuns(SLOW_CONCURRENCY, functools.partial(waiting_events, demo, SLOW_GROUP))

        def run(views: list[str], event):
            """``event.then`` each view in turn (private steps: the API is the ``gr.api`` endpoints below)."""
            for view in views:
                step = wire(ex, ui, *VIEWS[view])
                if view == "slow_reset":  # the slow views' results no longer apply: nor do their runs
                    step["fn"] = runs.dropping(SLOW_VIEWS, step["fn"])
                event = event.then(**step, api_visibility="private")

        knobs = [ui[name] for name in KNOBS]
        for (source, trigger), views in REFRESH.items():
            first, *rest = views
            event = getattr(ui[source], trigger)(**wire(ex, ui, *VIEWS[first]), trigger_mode="always_last",
                                                 api_visibility="private")
            run(rest, event)
            if source == "checkpoint_files":  # a refused pair is emptied too, so that the next one is two files
                event.failure(lambda: None, None, ui["checkpoint_files"], api_visibility="private")
            if source in KNOBS:  # a refused knob value goes back to the one the table shown was made from
                event.failure(None, knobs, knobs, js=RESTORE_KNOBS_JS, api_visibility="private")
                # kept also when the table did not change (R = 5 where auto gives 5), else a later refusal of
                # another knob put R back to 0
                event.success(None, knobs, None, js=KEEP_KNOBS_JS, api_visibility="private")
        ui["explorer"].change(None, knobs, None, js=KEEP_KNOBS_JS, api_visibility="private")

        # Actions: what the user asks for. A click in the explorer runs nothing on the server; for a K above the
        # table's bound the page asks for the clicked query's row (explorer.select), and ▶ α for the frames of the
        # α animation (explorer.click).
        ui["explorer"].select(**wire(ex, ui, "on_table_row", [*QUERY[:4], *KNOBS], ["explorer"]),
                              api_visibility="private")
        ui["explorer"].click(**wire(ex, ui, "on_sweep", QUERY, ["sweep"]), api_visibility="private")  # ▶ α
        ui["hop_view"].select(**wire(ex, ui, "on_hops_row", ["checkpoint", "image_file", "fit", "layer", "hops",
                                                             "head"], ["hop_view"]), api_visibility="private")
        for tab in ui["tabs"].children:  # the open tab, for a link
            tab.select(functools.partial(lambda key: key, tab.id), None, ui["tab"], api_visibility="private")
        link_copy = ui["link_button"].click(**wire(ex, ui, "on_link_copy", [*QUERY[:1], "image_file", *QUERY[3:],
                                                                            "tab", "compare_models",
                                                                            "compare_depth"], ["link", "link_note"]),
                                            api_visibility="private")
        link_copy.then(None, ui["link"], ui["link"], js=COPY_LINK_JS, api_visibility="private")
        ui["export_button"].click(**wire(ex, ui, "on_export", QUERY, ["exports", "neighbors_data"]),
                                  api_visibility="private")
        pixel_click = ui["pixel_image"].select(ex.on_pixel_click, ui["image_file"],
                                               [ui["pixel_row"], ui["pixel_col"]], api_visibility="private")
        run(["pixels"], pixel_click)

        slow = dict(concurrency_id=SLOW_GROUP, concurrency_limit=SLOW_CONCURRENCY, trigger_mode="always_last",
                    api_visibility="private")

        def slow_view(button: str, fn_name: str, inputs: list[str], outputs: list[str]) -> None:
            event = wire(ex, ui, fn_name, inputs, outputs)
            unchanged = {ui[name]: gr.skip() for name in outputs} if len(outputs) > 1 else gr.skip()
            ui[button].click(**{**event, "fn": runs.wrap(event["fn"], dropped=unchanged)}, **slow)

        slow_view("attribution_button", "on_attribution", ["checkpoint", "image_file", "fit", "method", "target"],
                  ["attribution_plot", "attribution_note"])
        slow_view("spectrum_models_button", "on_spectrum_models", ["image_file", "fit"], ["spectrum_models_plot"])
        slow_view("equivalence_button", "on_equivalence", ["checkpoint", "image_file", "fit", "layer"],
                  ["equivalence_text", "equivalence_plot"])
        gr.on([ui["method"].change, ui["target"].change], runs.dropping(("on_attribution",)), None,
              api_visibility="private")
        cancel = wire(ex, ui, "on_attribution_cancel", [], ["attribution_plot", "attribution_note"])
        ui["attribution_cancel"].click(**{**cancel, "fn": runs.dropping(("on_attribution",), cancel["fn"])},
                                       api_visibility="private")

        # The documented API: plain values in and out, for gradio_client and scripts.
        for fn, api_name in ((ex.api_layers, "layers"), (ex.api_predict, "predict"), (ex.api_neighbors, "neighbors"),
                             (ex.api_table, "table"), (ex.api_export, "export"), (ex.api_spectrum, "spectrum"),
                             (ex.api_multihop, "multihop"), (ex.api_weights, "weights"), (ex.api_mix, "mix"),
                             (ex.api_pixels, "pixels"), (ex.api_compare, "compare")):
            gr.api(fn, api_name=api_name)
        for fn, api_name in ((ex.api_attribution, "attribution"), (ex.api_equivalence, "equivalence")):
            gr.api(runs.wrap(fn), api_name=api_name, concurrency_id=SLOW_GROUP, concurrency_limit=SLOW_CONCURRENCY)
    demo.queue(max_size=MAX_QUEUED_EVENTS, default_concurrency_limit=FAST_CONCURRENCY)
    Admission(demo, SLOW_GROUP, MAX_SLOW_WAITING)
    return demo


def launch(demo: gr.Blocks, port: int, prevent_thread_lock: bool = False, workspace: an.Workspace | None = None,
           max_upload_mb: int = MAX_UPLOAD_MB, mcp_schema: dict[str, dict] | None = None):
    """Serve ``demo`` on 127.0.0.1:``port``: the examples folder is served, the work dir never (exports reach the
    page through Gradio's cache); files up to ``max_upload_mb``, request bodies up to that plus REQUEST_SLACK_MB,
    uploads within ``workspace``'s byte budget (default: the one on WORK_DIR), which is swept every FILE_SWEEP_S
    while the server runs. With ``mcp_schema`` (:meth:`Explorer.tool_schema`), Gradio's MCP server also offers the
    documented API (the ``gr.api`` endpoints) as MCP tools at ``/gradio_api/mcp/`` (:mod:`app_mcp`: images as data
    URIs, kept in the work dir; answers in JSON); their calls go through the same queue and admission."""
    workspace = workspace or default_workspace()
    size_limit = Middleware(RequestSizeLimit, max_bytes=(max_upload_mb + REQUEST_SLACK_MB) * 2**20,
                            workspace=workspace, upload_paths=[f"{API_PREFIX}/upload"])
    app_kwargs = {"middleware": [size_limit],
                  "lifespan": workspace.lifespan(FILE_SWEEP_S)}
    with app_mcp.serving(mcp_schema or {}):
        return demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=prevent_thread_lock,
                           allowed_paths=[str(EXAMPLES_DIR)], quiet=prevent_thread_lock, app_kwargs=app_kwargs,
                           max_file_size=f"{max_upload_mb}mb", state_session_capacity=MAX_SESSIONS,
                           max_threads=MAX_THREADS, css_paths=[WEB_DIR / "page.css"],
                           js=(WEB_DIR / "page.js").read_text(encoding="utf-8"), mcp_server=mcp_schema is not None)


def main() -> None:
    an.limit_malloc_arenas(MALLOC_ARENAS)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    env_port = os.environ.get("PORT") or os.environ.get("GRADIO_SERVER_PORT") or DEFAULT_PORT
    parser.add_argument("--port", type=int, default=int(env_port), help="port on 127.0.0.1 (default: $PORT or 7860)")
    parser.add_argument("--checkpoints", type=Path, default=CHECKPOINT_DIR,
                        help="folder of checkpoints to list (*.json cards + *.safetensors; default: checkpoints/)")
    env_cache = os.environ.get("CONVNN_CACHE_MB") or an.DEFAULT_CACHE_BYTES // 2**20
    parser.add_argument("--cache-mb", type=int, default=int(env_cache),
                        help="bytes all analysis caches may hold together, in MB (default: $CONVNN_CACHE_MB or 512)")
    parser.add_argument("--max-upload-mb", type=int, default=MAX_UPLOAD_MB,
                        help=f"largest uploaded file (checkpoint or image), MB (default: {MAX_UPLOAD_MB})")
    parser.add_argument("--mcp", action="store_true",
                        help="also serve the API as MCP tools at /gradio_api/mcp/ (Gradio's MCP server)")
    args = parser.parse_args()
    if args.max_upload_mb < 1:
        parser.error("--max-upload-mb must be at least 1")
    an.set_cache_budget(args.cache_mb * 2**20)
    explorer = Explorer(args.checkpoints, max_upload_mb=args.max_upload_mb)
    for line in explorer.left_out():  # the page says so too, under the model list
        logging.warning("left out of the model list: %s", line)
    launch(build_demo(explorer), args.port, workspace=explorer.workspace, max_upload_mb=args.max_upload_mb,
           mcp_schema=explorer.tool_schema() if args.mcp else None)


if __name__ == "__main__":
    main()
