"""ConvNN Explorer: pick a model and an image, click a pixel, and see which neighbours each selection rule picks.

    python app.py [--port 7860] [--checkpoints checkpoints/]

Binds 127.0.0.1; the port comes from ``--port``, else ``$PORT`` / ``$GRADIO_SERVER_PORT``, else 7860. Runs on CPU;
with a GPU the models run there and ConvNN layers use the fused Triton kernel. This file is wiring only: every
number and figure comes from :mod:`analysis`, and every user action has an ``api_name`` for ``gradio_client``.

What one visitor can cost is bounded before work starts: a queue of at most MAX_QUEUED_EVENTS waiting events, the
slow views (attribution, the equivalence demo) in a group of their own that runs SLOW_CONCURRENCY at a time and
admits one request per session and MAX_SLOW_WAITING waiting in all (:class:`Admission`), a
request body of at most MAX_REQUEST_MB, uploads and exports in a per-session work dir of at most MAX_WORK_DIR_MB
together with Gradio's own cache of uploads and downloads, which lives in it (all deleted FILE_MAX_AGE_S after their
last use), the analysis caches within ``--cache-mb`` (``$CONVNN_CACHE_MB``), Gradio's per-session state to
MAX_SESSIONS sessions.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from pathlib import Path
from unittest import mock

import gradio as gr
import torch
from gradio import component_meta
from gradio.route_utils import API_PREFIX
from gradio.utils import get_upload_folder
from starlette.middleware import Middleware

import analysis as an
from analysis.rendering import figures

REPO = Path(__file__).resolve().parent
CHECKPOINT_DIR = REPO / "checkpoints"
EXAMPLES_DIR = REPO / "examples"
WORK_DIR = Path(tempfile.gettempdir()) / "convnn-explorer"  # all the app stores: sessions/ (uploads and exports,
#                                                             one folder per session) and gradio/ (Gradio's cache)
DEFAULT_PORT = 7860
DEFAULT_CHECKPOINT = "cnn-l0.5"  # the paper's hybrid layer: the most to see on first load
MAX_UPLOAD_MB = 50  # larger uploaded files are refused by the server before they are stored
MAX_REQUEST_MB = 60  # one request's body: a checkpoint's weights (≤ MAX_UPLOAD_MB) and its card, with room to spare
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
    "**2 · Read the prediction.** The five most probable classes for the image the model sees (32×32).",
    "**3 · Click a pixel.** Each panel outlines the K cells one rule picks for that pixel, rank 0 darkest.",
    "**4 · Compare rules.** Window = convolution, all tokens = attention, random = r sampled candidates, blend = α.",
    "**5 · Open the tabs.** How neighbours are weighed, how the branches mix, and where the model looks.",
]


EQUIVALENCE_PROMPT = "Press the button to compare on the chosen layer's features of this model and image."


# Gradio's cache of uploads and downloads goes inside the work dir, in a folder of this app's own, so that one byte
# budget covers it (set GRADIO_TEMP_DIR before starting the app to put it elsewhere: it is counted wherever it is).
os.environ.setdefault("GRADIO_TEMP_DIR", str(WORK_DIR / "gradio"))


def default_workspace() -> an.Workspace:
    """The work dir's uploads and exports, in WORK_DIR/sessions: at most MAX_WORK_DIR_MB together with Gradio's cache
    (``GRADIO_TEMP_DIR``), each FILE_MAX_AGE_S after its last use."""
    return an.Workspace(WORK_DIR / "sessions", MAX_WORK_DIR_MB * 2**20, FILE_MAX_AGE_S, counted=[get_upload_folder()])


def user_errors(fn):
    """Show the errors a user can cause (:func:`analysis.user_error_message`) as a message in the page."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            if (message := an.user_error_message(err)) is None:
                raise
            raise gr.Error(message, print_exception=False) from err
    return wrapper


def checked_number(payload: object, component: gr.Number | gr.Slider) -> int | float | None:
    """A number box's or slider's value as sent, checked before Gradio's own preprocessing: a whole number for a
    ``precision=0`` box (refused, not rounded, if fractional), else a finite real number, within the component's
    bounds; a number box's None stays None (an empty box).

    Raises:
        gr.Error: anything else (``NaN``, ``inf``, ``2.5`` for a whole number, ``"abc"``, ``[1]``), with the
            component's label and the value (:func:`analysis.user_error_message`). Gradio's own check rounded
            ``2.5`` and failed on the others with an empty error.
    """
    if payload is None and isinstance(component, gr.Number):
        return None
    check = an.whole_number if component.precision == 0 else an.real_number
    try:
        return check(payload, component.label, component.minimum, component.maximum)
    except ValueError as err:
        raise gr.Error(an.user_error_message(err), print_exception=False) from err


# Gradio writes a .pyi stub of every component class next to its source file (event signatures, for authors of
# custom components): for these two, which add no event, it would write a copy of this file into the repository.
with mock.patch.object(component_meta, "create_or_modify_pyi", lambda *args: None):
    class CheckedNumber(gr.Number):
        """A ``gr.Number`` that takes only the numbers :func:`checked_number` accepts (with ``precision=0``: whole
        ones, not rounded); the page shows it as the Gradio number box it is built from (a template: same arguments,
        and a session's copy made by an update is one too)."""

        is_template = True

        def preprocess(self, payload: object) -> int | float | None:
            return checked_number(payload, self)

    class CheckedSlider(gr.Slider):
        """A ``gr.Slider`` that takes only finite numbers in its range (:func:`checked_number`); the page shows it as
        the Gradio slider it is built from (a template: same arguments)."""

        is_template = True

        def preprocess(self, payload: object) -> float:
            return super().preprocess(checked_number(payload, self))


def names_a_web_address(data) -> bool:
    """Whether an event's input values hold a file given by a web address (a ``"path"`` that is an http(s) URL),
    which Gradio would fetch, unbounded, before the handler runs; uploaded files have server paths. Walks nested
    lists and dicts without recursion (any depth the request size allows)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            path = item.get("path")
            if isinstance(path, str) and path.strip().lower().startswith(("http://", "https://")):
                return True
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


class Admission:
    """What the server admits to its queue, whatever the client: no file given by a web address (Gradio would
    download it with no size limit, past the work dir's byte budget); and for the slow group, one slow run waiting
    or running per session (over all slow views) and at most MAX_SLOW_WAITING slow runs waiting over all sessions.
    A request past any of these is refused before it enters the queue, with a message (the page shows it), so slow
    runs can neither pile up for one session nor fill the queue that clicks and predictions need.

    Gradio has no admission hook per concurrency group (a validator runs after the queue's own size check and marks
    inputs invalid), so this wraps the queue's ``push``, the one step every ``/queue/join`` and ``/call`` passes
    before its event is queued, and reads the queue's waiting and running events.

    Args:
        demo (gr.Blocks): the app, after ``demo.queue()``.
    """

    def __init__(self, demo: gr.Blocks) -> None:
        self.queue = demo._queue
        self.slow_fns = {fn._id for fn in demo.fns.values() if fn.concurrency_id == SLOW_GROUP}
        self.joining: list[str | None] = []  # sessions of admitted slow requests not queued yet
        self._push = self.queue.push
        self.queue.push = self.push

    def refusal(self, session: str | None) -> str | None:
        """Why a slow request of ``session`` (None: a call without one) is refused now, or None to admit it."""
        group = self.queue.event_queue_per_concurrency_id.get(SLOW_GROUP)
        waiting = [event.session_hash for event in group.queue] if group else []
        running = [event.session_hash for job in self.queue.active_jobs if job for event in job
                   if event.concurrency_id == SLOW_GROUP]
        if session is not None and session in (*waiting, *running, *self.joining):
            return ("This session already has an attribution or equivalence demo waiting or running: its result "
                    "comes first. Ask again once it is shown.")
        if len(waiting) + len(self.joining) >= MAX_SLOW_WAITING:
            return (f"The slow views (attribution, equivalence demo) are busy: {MAX_SLOW_WAITING} requests are "
                    "waiting for them. Try again in a minute; everything else still answers.")
        return None

    async def push(self, body, request, username):
        """Gradio's ``Queue.push`` for a request that is admitted; else ``(False, message, "error")``, which
        ``/queue/join`` answers 400 with the message."""
        if names_a_web_address(body.data):
            return False, ("Files must be uploaded from your device: a file given as a web address (http:// or "
                           "https://) is not fetched by the server."), "error"
        if body.fn_index not in self.slow_fns:
            return await self._push(body=body, request=request, username=username)
        session = body.session_hash  # push gives a request without one (a /call) its event's id
        if (message := self.refusal(session)) is not None:
            return False, message, "error"
        self.joining.append(session)
        try:
            return await self._push(body=body, request=request, username=username)
        finally:
            self.joining.remove(session)


class Explorer:
    """The app's handlers: thin adapters from UI values (paths, numbers, ``gr.SelectData``) to :mod:`analysis`.

    Handlers that read files take the event's ``gr.Request``: its session owns the uploads and exports it makes
    (a direct call without one is the one local session).

    Args:
        checkpoint_dir (Path): folder of shipped checkpoints (``*.json`` + ``*.safetensors``).
        device (str): where models run. Default: CUDA if available, else CPU
        workspace (an.Workspace): where uploads and exports are kept. Default: :func:`default_workspace`
    """

    def __init__(self, checkpoint_dir: Path = CHECKPOINT_DIR, device: str | None = None,
                 workspace: an.Workspace | None = None) -> None:
        self.checkpoint_dir = Path(checkpoint_dir).resolve()
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.examples = sorted(str(p) for p in EXAMPLES_DIR.glob("*.png"))
        self.workspace = workspace or default_workspace()

    # -- resolving UI values ---------------------------------------------------------------------------------------
    @staticmethod
    def session(request: gr.Request | None) -> str | None:
        return getattr(request, "session_hash", None)

    def model(self, checkpoint: str | None, request: gr.Request | None = None) -> an.LoadedModel:
        card = an.checkpoint_card(checkpoint, self.checkpoint_dir, self.workspace, self.session(request))
        return an.load_model(card, self.device)

    @staticmethod
    def image(image_path: str | None) -> an.InputImage:
        if not image_path:
            raise ValueError("Pick an example or upload an image first.")
        return an.load_image(image_path)

    def choices(self, uploads: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The model list: ``(label, choice)``, shipped checkpoints by stem, then this session's uploads."""
        shipped = [(label, path.stem) for label, path in an.list_checkpoints(self.checkpoint_dir)]
        return shipped + [tuple(upload) for upload in uploads]

    # -- model, image, prediction ------------------------------------------------------------------------------------
    @user_errors
    def on_model(self, checkpoint: str | None, request: gr.Request | None = None):
        loaded = self.model(checkpoint, request)
        probes = loaded.probes
        default = next((p for p in probes if p.height < loaded.card.input_size), probes[0]) if probes else None
        heads = max((p.num_heads for p in probes), default=1)
        return (an.card_summary(loaded.card),  # plain text in a read-only textbox: card text is never markup
                gr.update(choices=[(an.layer_label(p), p.name) for p in probes], value=default and default.name),
                gr.update(maximum=heads - 1, value=0, visible=heads > 1))

    @user_errors
    def on_query_px(self, checkpoint: str | None, row_px: float, col_px: float,
                    request: gr.Request | None = None) -> tuple[int, int]:
        """The query pixel moved inside the (new) model's input, so a model of another input size still answers."""
        size = self.model(checkpoint, request).card.input_size
        return an.clamp_px(self.pixel(row_px, col_px), size, size)

    @user_errors
    def on_checkpoint_upload(self, files: list[str] | None, uploads: list[tuple[str, str]],
                             request: gr.Request | None = None):
        choice = an.store_upload(files or [], self.workspace, self.session(request), self.device)
        label = f"uploaded: {an.card_summary(self.model(choice, request).card).splitlines()[0]}"
        uploads = [*uploads, (label, choice)]
        return gr.update(choices=self.choices(uploads), value=choice), uploads

    @user_errors
    def on_example(self, evt: gr.SelectData) -> str:
        return self.examples[an.whole_number(evt.index, "the example's index", 0, len(self.examples) - 1)]

    @user_errors
    def on_image_upload(self, path: str | None) -> str:
        self.image(path)  # refuse what cannot be read before it replaces the current image
        return path

    @user_errors
    def on_image(self, checkpoint: str | None, image_path: str | None, request: gr.Request | None = None):
        loaded, image = self.model(checkpoint, request), self.image(image_path)
        if image.note:
            gr.Warning(image.note)
        view = an.model_view(image, loaded.card.input_size)
        return an.display_image(view, an.display_factor(view.shape[0])), an.top_classes(loaded, image)

    # -- the query ---------------------------------------------------------------------------------------------------
    @user_errors
    def on_click(self, checkpoint: str | None, evt: gr.SelectData, request: gr.Request | None = None
                 ) -> tuple[int, int]:
        size = self.model(checkpoint, request).card.input_size
        factor = an.display_factor(size)
        x_px, y_px = an.click_position(evt.index, size * factor, size * factor)  # Gradio gives (x, y)
        return an.display_to_input_px(x_px, y_px, factor, size, size)

    @staticmethod
    def pixel(row_px: float, col_px: float) -> tuple[int, int]:
        return an.whole_number(row_px, "query row"), an.whole_number(col_px, "query col")

    def query(self, checkpoint, image_path, layer, row_px, col_px, k, window, candidates, seed, alpha, head, request):
        """The model, image and :func:`analysis.query_neighbors` result for the UI's values."""
        loaded, image = self.model(checkpoint, request), self.image(image_path)
        options = an.RuleOptions.from_ui(k, window, candidates, seed, alpha, head)
        return loaded, image, an.query_neighbors(loaded, image, layer, self.pixel(row_px, col_px), options)

    @user_errors
    def on_neighbors(self, checkpoint, image_path, layer, row_px, col_px, k, window, candidates, seed, alpha, head,
                     request: gr.Request | None = None):
        loaded, image, result = self.query(checkpoint, image_path, layer, row_px, col_px, k, window, candidates,
                                           seed, alpha, head, request)
        view = an.model_view(image, loaded.card.input_size)
        return (an.display_image(view, an.display_factor(view.shape[0]), result.query_px),
                figures.neighbor_panel(view, result), an.neighbors_summary(result),
                an.query_record(loaded, image, result))

    @user_errors
    def on_export(self, checkpoint, image_path, layer, row_px, col_px, k, window, candidates, seed, alpha, head,
                  request: gr.Request | None = None):
        """Write the query's overlay (PNG) and neighbours (JSON) for download; only when asked, not on every click.
        Gradio serves them from its own cache (the work dir is never served)."""
        loaded, image, result = self.query(checkpoint, image_path, layer, row_px, col_px, k, window, candidates,
                                           seed, alpha, head, request)
        return [str(path) for path in an.export_query(self.workspace, self.session(request), loaded, image, result)]

    # -- the tabs ----------------------------------------------------------------------------------------------------
    @user_errors
    def on_weights(self, checkpoint, image_path, layer, row_px, col_px, head, request: gr.Request | None = None):
        loaded = self.model(checkpoint, request)
        probe = loaded.probe(layer)
        if probe.dense:
            return None, None, None, f"{probe.name} is plain attention: no rank-slot kernel to show."
        heat, bars = figures.kernel_figures(an.aggregation_kernel(loaded, layer))
        if probe.record_name is None:
            return heat, bars, None, "A conv-only layer: its taps are the window's rank slots (METHOD §4.1)."
        contrib = an.neighbor_contributions(loaded, self.image(image_path), layer, self.pixel(row_px, col_px), head)
        return (heat, bars, figures.contribution_figure(contrib),
                f"Σ contributions + bias vs the layer's own output: max |diff| = {contrib.max_abs_residual:.2e}")

    @user_errors
    def on_mix(self, checkpoint, image_path, layer, row_px, col_px, request: gr.Request | None = None):
        loaded = self.model(checkpoint, request)
        probe = loaded.probe(layer)
        if not probe.is_hybrid:
            return None, f"{probe.name} is not a hybrid layer: the λ mix exists only in hybrid ConvNN layers."
        mix = an.branch_mix(loaded, self.image(image_path), layer)
        cell = an.query_cell(probe, *self.pixel(row_px, col_px))
        return figures.mix_figure(mix, probe.name, cell), an.mix_summary(mix, cell)

    @user_errors
    def on_multihop(self, checkpoint, image_path, layer, row_px, col_px, hops, head, request: gr.Request | None = None):
        loaded, image = self.model(checkpoint, request), self.image(image_path)
        query_px = self.pixel(row_px, col_px)
        field = an.receptive_field(loaded, image, layer, query_px, hops, head)
        counts = ", ".join(f"hop {h}: {n} px" for h, n in enumerate(field.pixel_counts))
        return figures.hop_figure(an.model_view(image, loaded.card.input_size), field, query_px), counts

    @user_errors
    def on_spectrum(self, checkpoint, image_path, request: gr.Request | None = None):
        return figures.spectrum_figure(an.selection_spectrum(self.model(checkpoint, request), self.image(image_path)))

    @user_errors
    def on_attribution(self, checkpoint, image_path, method, target, request: gr.Request | None = None):
        loaded, image = self.model(checkpoint, request), self.image(image_path)
        result = an.attribution_map(loaded, image, method, target or None)
        return figures.attribution_figure(an.model_view(image, loaded.card.input_size), result), result.note

    @user_errors
    def on_equivalence(self, checkpoint, image_path, layer, request: gr.Request | None = None):
        return an.equivalence_summary(self.model(checkpoint, request), self.image(image_path), layer)

    @staticmethod
    def on_equivalence_reset(*_) -> str:  # a new model, image or layer: the demo's last result no longer applies
        return EQUIVALENCE_PROMPT

    @user_errors
    def on_pixel_image(self, image_path):
        view = an.pixel_view(self.image(image_path))
        return an.display_image(view, an.display_factor(max(view.shape[:2]), 384))

    @user_errors
    def on_pixel_click(self, image_path, evt: gr.SelectData) -> tuple[int, int]:
        view = an.pixel_view(self.image(image_path))
        factor = an.display_factor(max(view.shape[:2]), 384)
        x_px, y_px = an.click_position(evt.index, view.shape[1] * factor, view.shape[0] * factor)
        return an.display_to_input_px(x_px, y_px, factor, *view.shape[:2])

    @user_errors
    def on_pixel_query(self, image_path, row_px, col_px) -> tuple[int, int]:
        """The input-level query moved inside the (new) image's view."""
        return an.clamp_px(self.pixel(row_px, col_px), *an.pixel_view(self.image(image_path)).shape[:2])

    @user_errors
    def on_pixels(self, image_path, row_px, col_px, k, position_weight):
        image, query_px = self.image(image_path), self.pixel(row_px, col_px)
        result = an.pixel_neighbors(image, query_px, k, float(position_weight))
        return figures.pixel_figure(an.pixel_view(image), result, query_px)


def build_demo(explorer: Explorer | None = None) -> gr.Blocks:
    """The page: model and image pickers, prediction, the click-to-query panel and the analysis tabs."""
    ex = explorer or Explorer()
    choices = ex.choices([])
    default = next((choice for _, choice in choices if choice == DEFAULT_CHECKPOINT),
                   choices[0][1] if choices else None)
    with gr.Blocks(title="ConvNN Explorer", delete_cache=(FILE_SWEEP_S, FILE_MAX_AGE_S)) as demo:
        uploads = gr.State([])
        gr.Markdown(f"# ConvNN Explorer\nConvolution and attention as one k-nearest-neighbour operation. "
                    f"Compute path: **{an.compute_path(ex.device)}**.")
        guided = gr.Checkbox(value=True, label="Guided mode (numbered steps)")
        guide = [gr.Markdown(text) for text in GUIDE[:1]]
        with gr.Row():
            with gr.Column(scale=1):
                checkpoint = gr.Dropdown(choices, value=default, label="Model",
                                         allow_custom_value=True, elem_id="checkpoint")
                card = gr.Textbox(label="Model card", lines=8, max_lines=12, interactive=False, show_label=False,
                                  elem_id="card")
                checkpoint_files = gr.File(file_count="multiple", file_types=[".safetensors", ".json"],
                                           label="…or upload your checkpoint (.safetensors + .json, "
                                                 f"up to {MAX_UPLOAD_MB} MB)")
            with gr.Column(scale=1):
                examples = gr.Gallery(ex.examples, columns=5, height=150, allow_preview=False, label="Examples",
                                      elem_id="examples")
                with gr.Row():
                    image_file = gr.File(ex.examples[0] if ex.examples else None, file_types=["image"],
                                         label=f"Image (pick an example or upload, up to {MAX_UPLOAD_MB} MB)",
                                         elem_id="image_file", scale=3)
                    image_upload = gr.UploadButton(f"Upload an image (≤ {MAX_UPLOAD_MB} MB)", file_types=["image"],
                                                   elem_id="image_upload", scale=1)
                guide.append(gr.Markdown(GUIDE[1]))
                prediction = gr.Label(num_top_classes=5, label="Top-5 prediction", elem_id="prediction")
        guide += [gr.Markdown(GUIDE[2]), gr.Markdown(GUIDE[3])]
        with gr.Row():
            with gr.Column(scale=1, min_width=280):
                query_image = gr.Image(type="numpy", format="png", interactive=False, show_label=False, buttons=[],
                                       elem_id="query_image")
                with gr.Row():
                    row_px = CheckedNumber(16, precision=0, minimum=0, label="query row (px)", elem_id="row_px")
                    col_px = CheckedNumber(16, precision=0, minimum=0, label="query col (px)", elem_id="col_px")
                neighbors_button = gr.Button("Show neighbours", elem_id="neighbors_button")
            with gr.Column(scale=3):
                layer = gr.Dropdown(label="Layer", allow_custom_value=True, elem_id="layer")
                with gr.Row():
                    num_neighbors = CheckedNumber(0, precision=0, minimum=0, label="K (0 = layer's)")
                    window_size = CheckedNumber(0, precision=0, minimum=0, label="window R (0 = auto)")
                    num_candidates = CheckedNumber(0, precision=0, minimum=0,
                                                   label="random r ≥ K (0 = layer's / 32; ≥ N = all)")
                    seed = CheckedNumber(0, precision=0, minimum=0, label="seed (0 = the layer's)")
                    head = CheckedNumber(0, precision=0, minimum=0, label="attention head", visible=False)
                blend_alpha = CheckedSlider(0, 1, value=0.5, step=0.05, label="blend α (0 = window, 1 = features)",
                                        elem_id="blend_alpha")
        neighbor_plot = gr.Plot(elem_id="neighbor_plot", label="Neighbours by rule")
        stats = gr.Markdown(elem_id="stats")
        with gr.Accordion("Export (PNG overlay, JSON of indices)", open=False):
            export_button = gr.Button("Export this query", elem_id="export_button")
            exports = gr.File(file_count="multiple", label="Downloads", elem_id="exports")
            neighbors_data = gr.JSON(label="Neighbours (JSON)", elem_id="neighbors_data")
        guide.append(gr.Markdown(GUIDE[4]))
        with gr.Tabs():
            with gr.Tab("Aggregation weights"):
                weights_note = gr.Markdown()
                with gr.Row():
                    kernel_plot, slot_plot = gr.Plot(label="kernel"), gr.Plot(label="per rank slot")
                contribution_plot = gr.Plot(label="contributions")
            with gr.Tab("λ mix"):
                mix_note, mix_plot = gr.Markdown(), gr.Plot(label="ConvNN share")
            with gr.Tab("Attribution"):
                with gr.Row():
                    method = gr.Dropdown(list(an.ATTRIBUTION_METHODS), value="saliency", label="method")
                    target = gr.Textbox("", label="class (empty = predicted)")
                    attribution_button = gr.Button("Compute attribution")
                attribution_note = gr.Markdown(an.GRADIENT_NOTE)
                attribution_plot = gr.Plot(label="attribution", elem_id="attribution_plot")
            with gr.Tab("Spectrum"):
                spectrum_plot = gr.Plot(label="spectrum", elem_id="spectrum_plot")
            with gr.Tab("Equivalence demo"):
                equivalence_button = gr.Button("Run on this layer's features")
                equivalence_text = gr.Markdown(EQUIVALENCE_PROMPT, elem_id="equivalence_text")
            with gr.Tab("Multi-hop"):
                hops = CheckedSlider(1, 4, value=2, step=1, label="hops (towards the input)")
                hop_note, hop_plot = gr.Markdown(), gr.Plot(label="receptive field")
            with gr.Tab("Input-level view"):
                gr.Markdown("No trained model: each pixel's colour (+ position) is its feature. Click a pixel.")
                with gr.Row():
                    pixel_image = gr.Image(type="numpy", format="png", interactive=False, show_label=False,
                                           buttons=[], elem_id="pixel_image")
                    with gr.Column():
                        pixel_k = CheckedSlider(1, 1024, value=64, step=1, label="K")
                        position_weight = CheckedSlider(0, 4, value=0, step=0.1, label="position weight")
                        pixel_row = CheckedNumber(0, precision=0, label="row")
                        pixel_col = CheckedNumber(0, precision=0, label="col")
                pixel_plot = gr.Plot(label="like vs near", elem_id="pixel_plot")

        query = [checkpoint, image_file, layer, row_px, col_px]
        rule_inputs = [*query, num_neighbors, window_size, num_candidates, seed, blend_alpha, head]
        neighbors = (ex.on_neighbors, rule_inputs, [query_image, neighbor_plot, stats, neighbors_data])
        predict = (ex.on_image, [checkpoint, image_file], [query_image, prediction])
        spectrum = (ex.on_spectrum, [checkpoint, image_file], spectrum_plot)
        multihop = (ex.on_multihop, [*query, hops, head], [hop_plot, hop_note])
        attribution = (ex.on_attribution, [checkpoint, image_file, method, target],
                       [attribution_plot, attribution_note])
        equivalence = (ex.on_equivalence, [checkpoint, image_file, layer], equivalence_text)
        pixel_query = (ex.on_pixel_query, [image_file, pixel_row, pixel_col], [pixel_row, pixel_col])
        pixels = (ex.on_pixels, [image_file, pixel_row, pixel_col, pixel_k, position_weight], pixel_plot)
        # The views that follow a neighbours update, with what they read. The equivalence demo (seconds and ~1 GB on
        # a 32×32 layer) is only reset to its prompt, and runs when asked.
        weights = (ex.on_weights, [*query, head], [kernel_plot, slot_plot, contribution_plot, weights_note])
        tab_updates = [("weights", *weights), ("mix", ex.on_mix, query, [mix_plot, mix_note]), (None, *multihop),
                       (None, ex.on_equivalence_reset, [checkpoint, image_file, layer], equivalence_text),
                       (None, *attribution)]

        # The slow views run in their own concurrency group, one at a time over all sessions, so that clicks and
        # predictions never wait behind them; the page sends at most one of each (always_last), the server admits
        # one per session and a few in all (Admission), and a change of what a slow view reads cancels its
        # pending run (the frontend asks the queue to drop it).
        slow_views = {attribution[0]: [], equivalence[0]: []}  # fn → its events

        def listen(fn, on, *args, **kwargs):
            """``on(fn, *args, **kwargs)``, in the slow group if ``fn`` is a slow view."""
            if fn not in slow_views:
                return on(fn, *args, **kwargs)
            event = on(fn, *args, **kwargs, concurrency_id=SLOW_GROUP, concurrency_limit=SLOW_CONCURRENCY,
                       trigger_mode="always_last")
            slow_views[fn].append(event)
            return event

        def chain(event, *steps):
            """``event.then`` each ``(fn, inputs, outputs[, api_name])`` in turn; unnamed steps stay private."""
            for fn, inputs, outputs, *api_name in steps:
                event = listen(fn, event.then, inputs, outputs, api_name=api_name[0] if api_name else None,
                               api_visibility="public" if api_name else "private")
            return event

        def after_query(event, changed=None, public: bool = False):
            """Chain the ``tab_updates`` that read a control in ``changed`` (None: all); named in the API if public."""
            for api_name, fn, inputs, outputs in tab_updates:
                if changed is None or set(changed) & set(inputs):
                    event = chain(event, (fn, inputs, outputs, *([api_name] if public and api_name else [])))
            return event

        guided.change(lambda on: [gr.update(visible=on)] * len(guide), guided, guide, api_visibility="private")
        # A new model or image refreshes every view, whatever the layer's value: the layer and head controls answer
        # only the user (.input), not a new model whose default layer has the old one's name (no .change then).
        after_query(chain(checkpoint.change(ex.on_model, checkpoint, [card, layer, head], api_name="load_model"),
                          (ex.on_query_px, [checkpoint, row_px, col_px], [row_px, col_px]), predict, spectrum,
                          neighbors))
        checkpoint_files.upload(ex.on_checkpoint_upload, [checkpoint_files, uploads], [checkpoint, uploads],
                                api_name="upload_checkpoint")
        examples.select(ex.on_example, None, image_file, api_visibility="private")
        image_upload.upload(ex.on_image_upload, image_upload, image_file, api_visibility="private")
        after_query(chain(image_file.change(*predict, api_name="predict"), (*spectrum, "spectrum"),
                          (ex.on_pixel_image, image_file, pixel_image, "pixel_image"), pixel_query, pixels, neighbors))
        after_query(chain(query_image.select(ex.on_click, checkpoint, [row_px, col_px], api_visibility="private"),
                          neighbors), [row_px, col_px])
        after_query(neighbors_button.click(*neighbors, api_name="neighbors"), [layer, row_px, col_px, head],
                    public=True)
        export_button.click(ex.on_export, rule_inputs, exports, api_name="export")
        for control in (layer, head):
            after_query(control.input(*neighbors, api_visibility="private"), [control])
        # A typed row or col counts once it is entered (Enter or leaving the box), like a click: the panel and the
        # tabs that read the query cell follow it together. The rule knobs redraw the panel, which reads the typed
        # cell, so those tabs follow them too (none of them is slow).
        typed = [trigger for box in (row_px, col_px) for trigger in (box.submit, box.blur)]
        after_query(gr.on(typed, *neighbors, api_visibility="private"), [row_px, col_px])
        for control in (num_neighbors, window_size, num_candidates, seed):
            after_query(control.change(*neighbors, api_visibility="private"), [row_px, col_px])
        after_query(blend_alpha.release(*neighbors, api_visibility="private"), [row_px, col_px])
        hops.release(*multihop, api_name="multihop")
        listen(attribution[0], attribution_button.click, *attribution[1:], api_name="attribution")
        listen(equivalence[0], equivalence_button.click, *equivalence[1:], api_name="equivalence")
        chain(pixel_image.select(ex.on_pixel_click, image_file, [pixel_row, pixel_col], api_visibility="private"),
              (*pixels, "pixel_neighbors"))
        for control in (pixel_k, position_weight):
            control.release(*pixels, api_visibility="private")
        gr.on([trigger for box in (pixel_row, pixel_col) for trigger in (box.submit, box.blur)], *pixels,
              api_visibility="private")  # the input-level view's typed cell, like a click on its image
        after_query(chain(demo.load(ex.on_model, checkpoint, [card, layer, head], api_visibility="private"), predict,
                          (ex.on_pixel_image, image_file, pixel_image), pixel_query, pixels, spectrum, neighbors))
        for fn, inputs, _ in (attribution, equivalence):
            gr.on([control.change for control in inputs], None, cancels=slow_views[fn])
    demo.queue(max_size=MAX_QUEUED_EVENTS, default_concurrency_limit=FAST_CONCURRENCY)
    Admission(demo)
    return demo


def launch(demo: gr.Blocks, port: int, prevent_thread_lock: bool = False, workspace: an.Workspace | None = None):
    """Serve ``demo`` on 127.0.0.1:``port``: the examples folder is served, the work dir never (exports reach the
    page through Gradio's cache); files up to MAX_UPLOAD_MB, request bodies up to MAX_REQUEST_MB, uploads within
    ``workspace``'s byte budget (default: the one on WORK_DIR), which is swept every FILE_SWEEP_S while the server
    runs."""
    workspace = workspace or default_workspace()
    size_limit = Middleware(an.RequestSizeLimit, max_bytes=MAX_REQUEST_MB * 2**20, workspace=workspace,
                            upload_paths=[f"{API_PREFIX}/upload"])
    app_kwargs = {"middleware": [size_limit],
                  "lifespan": workspace.lifespan(FILE_SWEEP_S)}
    return demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=prevent_thread_lock,
                       allowed_paths=[str(EXAMPLES_DIR)], quiet=prevent_thread_lock, app_kwargs=app_kwargs,
                       max_file_size=f"{MAX_UPLOAD_MB}mb", state_session_capacity=MAX_SESSIONS,
                       max_threads=MAX_THREADS)


def main() -> None:
    an.limit_malloc_arenas(MALLOC_ARENAS)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    env_port = os.environ.get("PORT") or os.environ.get("GRADIO_SERVER_PORT") or DEFAULT_PORT
    parser.add_argument("--port", type=int, default=int(env_port), help="port on 127.0.0.1 (default: $PORT or 7860)")
    parser.add_argument("--checkpoints", type=Path, default=CHECKPOINT_DIR, help="folder of shipped checkpoints")
    env_cache = os.environ.get("CONVNN_CACHE_MB") or an.DEFAULT_CACHE_BYTES // 2**20
    parser.add_argument("--cache-mb", type=int, default=int(env_cache),
                        help="bytes all analysis caches may hold together, in MB (default: $CONVNN_CACHE_MB or 512)")
    args = parser.parse_args()
    an.set_cache_budget(args.cache_mb * 2**20)
    explorer = Explorer(args.checkpoints)
    launch(build_demo(explorer), args.port, workspace=explorer.workspace)


if __name__ == "__main__":
    main()
