"""ConvNN Explorer: pick a model and an image, click a pixel, and see which neighbours each selection rule picks.

    python app.py [--port 7860] [--checkpoints checkpoints/]

Binds 127.0.0.1; the port comes from ``--port``, else ``$PORT`` / ``$GRADIO_SERVER_PORT``, else 7860. Runs on CPU;
with a GPU the models run there and ConvNN layers use the fused Triton kernel. This file is wiring only: every
number and figure comes from :mod:`analysis`, and every user action has an ``api_name`` for ``gradio_client``.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from pathlib import Path

import gradio as gr
import torch

import analysis as an
from analysis import figures

REPO = Path(__file__).resolve().parent
CHECKPOINT_DIR = REPO / "checkpoints"
EXAMPLES_DIR = REPO / "examples"
WORK_DIR = Path(tempfile.gettempdir()) / "convnn-explorer"  # uploaded checkpoints and exports
DEFAULT_PORT = 7860
DEFAULT_CHECKPOINT = "cnn-l0.5"  # the paper's hybrid layer: the most to see on first load
MAX_UPLOAD_MB = 50  # larger uploads are refused by the server before they are stored
GUIDE = [
    "**1 · Pick a model and an image.** Each card says how much of the network is ConvNN (λ) and how it selects.",
    "**2 · Read the prediction.** The five most probable classes for the image the model sees (32×32).",
    "**3 · Click a pixel.** Each panel outlines the K cells one rule picks for that pixel, rank 0 darkest.",
    "**4 · Compare rules.** Window = convolution, all tokens = attention, random = r sampled candidates, blend = α.",
    "**5 · Open the tabs.** How neighbours are weighed, how the branches mix, and where the model looks.",
]


EQUIVALENCE_PROMPT = "Press the button to compare on the chosen layer's features of this model and image."


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


class Explorer:
    """The app's handlers: thin adapters from UI values (paths, numbers, ``gr.SelectData``) to :mod:`analysis`.

    Args:
        checkpoint_dir (Path): folder of shipped checkpoints (``*.json`` + ``*.safetensors``).
        device (str): where models run. Default: CUDA if available, else CPU
    """

    def __init__(self, checkpoint_dir: Path = CHECKPOINT_DIR, device: str | None = None) -> None:
        self.checkpoint_dir = Path(checkpoint_dir).resolve()
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.examples = sorted(str(p) for p in EXAMPLES_DIR.glob("*.png"))

    # -- resolving UI values ---------------------------------------------------------------------------------------
    def model(self, checkpoint: str | None) -> an.LoadedModel:
        if not checkpoint:
            raise ValueError("Choose a model first (or upload a .safetensors + .json checkpoint).")
        path = Path(checkpoint)
        if path.suffix != ".json":
            path = self.checkpoint_dir / f"{path.name}.json"
        path = path.resolve()
        if not any(path.is_relative_to(root) for root in (self.checkpoint_dir, WORK_DIR.resolve())):
            raise ValueError(f"unknown checkpoint {checkpoint!r}: choose one from the list or upload one")
        return an.load_model(path, self.device)

    @staticmethod
    def image(image_path: str | None) -> an.InputImage:
        if not image_path:
            raise ValueError("Pick an example or upload an image first.")
        return an.load_image(image_path)

    def choices(self, uploads: list[str]) -> list[tuple[str, str]]:
        shipped = [(label, str(path)) for label, path in an.list_checkpoints(self.checkpoint_dir)]
        return shipped + [(f"uploaded: {Path(p).stem}", p) for p in uploads]

    # -- model, image, prediction ------------------------------------------------------------------------------------
    @user_errors
    def on_model(self, checkpoint: str | None):
        loaded = self.model(checkpoint)
        probes = loaded.probes
        default = next((p for p in probes if p.height < loaded.card.input_size), probes[0]) if probes else None
        card = "```\n" + an.card_summary(loaded.card) + "\n```"
        heads = max((p.num_heads for p in probes), default=1)
        return (card, gr.update(choices=[(p.label, p.name) for p in probes], value=default and default.name),
                gr.update(maximum=heads - 1, value=0, visible=heads > 1))

    @user_errors
    def on_query_px(self, checkpoint: str | None, row_px: float, col_px: float) -> tuple[int, int]:
        """The query pixel moved inside the (new) model's input, so a model of another input size still answers."""
        size = self.model(checkpoint).card.input_size
        return an.clamp_px(self.pixel(row_px, col_px), size, size)

    @user_errors
    def on_checkpoint_upload(self, files: list[str] | None, uploads: list[str]):
        card_path = str(an.store_upload(files or [], WORK_DIR / "checkpoints", self.device))
        uploads = [*uploads, card_path]
        return gr.update(choices=self.choices(uploads), value=card_path), uploads

    def on_example(self, evt: gr.SelectData) -> str:
        return self.examples[evt.index]

    @user_errors
    def on_image_upload(self, path: str | None) -> str:
        self.image(path)  # refuse what cannot be read before it replaces the current image
        return path

    @user_errors
    def on_image(self, checkpoint: str | None, image_path: str | None):
        loaded, image = self.model(checkpoint), self.image(image_path)
        if image.note:
            gr.Warning(image.note)
        view = an.model_view(image, loaded.card.input_size)
        return an.display_image(view, an.display_factor(view.shape[0])), an.top_classes(loaded, image)

    # -- the query ---------------------------------------------------------------------------------------------------
    @user_errors
    def on_click(self, checkpoint: str | None, evt: gr.SelectData) -> tuple[int, int]:
        size = self.model(checkpoint).card.input_size
        return an.display_to_input_px(evt.index[0], evt.index[1], an.display_factor(size), size, size)

    @staticmethod
    def pixel(row_px: float, col_px: float) -> tuple[int, int]:
        return an.whole_number(row_px, "query row"), an.whole_number(col_px, "query col")

    def query(self, checkpoint, image_path, layer, row_px, col_px, k, window, candidates, seed, alpha, head):
        """The model, image and :func:`analysis.query_neighbors` result for the UI's values."""
        loaded, image = self.model(checkpoint), self.image(image_path)
        options = an.RuleOptions.from_ui(k, window, candidates, seed, alpha, head)
        return loaded, image, an.query_neighbors(loaded, image, layer, self.pixel(row_px, col_px), options)

    @user_errors
    def on_neighbors(self, checkpoint, image_path, layer, row_px, col_px, k, window, candidates, seed, alpha, head):
        loaded, image, result = self.query(checkpoint, image_path, layer, row_px, col_px, k, window, candidates,
                                           seed, alpha, head)
        view = an.model_view(image, loaded.card.input_size)
        return (an.display_image(view, an.display_factor(view.shape[0]), result.query_px),
                figures.neighbor_panel(view, result), an.neighbors_summary(result),
                an.query_record(loaded, image, result))

    @user_errors
    def on_export(self, checkpoint, image_path, layer, row_px, col_px, k, window, candidates, seed, alpha, head):
        """Write the query's overlay (PNG) and neighbours (JSON) for download; only when asked, not on every click."""
        loaded, image, result = self.query(checkpoint, image_path, layer, row_px, col_px, k, window, candidates,
                                           seed, alpha, head)
        return [str(path) for path in an.export_query(WORK_DIR / "exports", loaded, image, result)]

    # -- the tabs ----------------------------------------------------------------------------------------------------
    @user_errors
    def on_weights(self, checkpoint, image_path, layer, row_px, col_px, head):
        loaded = self.model(checkpoint)
        probe = loaded.probe(layer)
        if probe.mixer == "mhsa":
            return None, None, None, f"{probe.name} is plain attention: no rank-slot kernel to show."
        heat, bars = figures.kernel_figures(an.aggregation_kernel(loaded, layer))
        if probe.record_name is None:
            return heat, bars, None, "A conv-only layer: its taps are the window's rank slots (METHOD §4.1)."
        contrib = an.neighbor_contributions(loaded, self.image(image_path), layer, self.pixel(row_px, col_px), head)
        return (heat, bars, figures.contribution_figure(contrib),
                f"Σ contributions + bias vs the layer's own output: max |diff| = {contrib.max_abs_residual:.2e}")

    @user_errors
    def on_mix(self, checkpoint, image_path, layer, row_px, col_px):
        loaded = self.model(checkpoint)
        probe = loaded.probe(layer)
        if probe.kind != "hybrid":
            return None, f"{probe.name} is not a hybrid layer: the λ mix exists only in hybrid ConvNN layers."
        mix = an.branch_mix(loaded, self.image(image_path), layer)
        cell = an.query_cell(probe, *self.pixel(row_px, col_px))
        return figures.mix_figure(mix, probe.name, cell), an.mix_summary(mix, cell)

    @user_errors
    def on_multihop(self, checkpoint, image_path, layer, row_px, col_px, hops, head):
        loaded, image = self.model(checkpoint), self.image(image_path)
        query_px = self.pixel(row_px, col_px)
        field = an.receptive_field(loaded, image, layer, query_px, hops, head)
        counts = ", ".join(f"hop {h}: {n} px" for h, n in enumerate(field.pixel_counts))
        return figures.hop_figure(an.model_view(image, loaded.card.input_size), field, query_px), counts

    @user_errors
    def on_spectrum(self, checkpoint, image_path):
        return figures.spectrum_figure(an.selection_spectrum(self.model(checkpoint), self.image(image_path)))

    @user_errors
    def on_attribution(self, checkpoint, image_path, method, target):
        loaded, image = self.model(checkpoint), self.image(image_path)
        result = an.attribution_map(loaded, image, method, target or None)
        return figures.attribution_figure(an.model_view(image, loaded.card.input_size), result), result.note

    @user_errors
    def on_equivalence(self, checkpoint, image_path, layer):
        return an.equivalence_summary(self.model(checkpoint), self.image(image_path), layer)

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
        return an.display_to_input_px(evt.index[0], evt.index[1], factor, *view.shape[:2])

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
    default = next((path for _, path in choices if Path(path).stem == DEFAULT_CHECKPOINT),
                   choices[0][1] if choices else None)
    with gr.Blocks(title="ConvNN Explorer") as demo:
        uploads = gr.State([])
        gr.Markdown(f"# ConvNN Explorer\nConvolution and attention as one k-nearest-neighbour operation. "
                    f"Compute path: **{an.compute_path(ex.device)}**.")
        guided = gr.Checkbox(value=True, label="Guided mode (numbered steps)")
        guide = [gr.Markdown(text) for text in GUIDE[:1]]
        with gr.Row():
            with gr.Column(scale=1):
                checkpoint = gr.Dropdown(choices, value=default, label="Model",
                                         allow_custom_value=True, elem_id="checkpoint")
                card = gr.Markdown(elem_id="card")
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
                    row_px = gr.Number(16, precision=0, minimum=0, label="query row (px)", elem_id="row_px")
                    col_px = gr.Number(16, precision=0, minimum=0, label="query col (px)", elem_id="col_px")
                neighbors_button = gr.Button("Show neighbours", elem_id="neighbors_button")
            with gr.Column(scale=3):
                layer = gr.Dropdown(label="Layer", allow_custom_value=True, elem_id="layer")
                with gr.Row():
                    num_neighbors = gr.Number(0, precision=0, minimum=0, label="K (0 = layer's)")
                    window_size = gr.Number(0, precision=0, minimum=0, label="window R (0 = auto)")
                    num_candidates = gr.Number(0, precision=0, minimum=0,
                                               label="random r ≥ K (0 = layer's / 32; ≥ N = all)")
                    seed = gr.Number(0, precision=0, minimum=0, label="seed")
                    head = gr.Number(0, precision=0, minimum=0, label="attention head", visible=False)
                blend_alpha = gr.Slider(0, 1, value=0.5, step=0.05, label="blend α (0 = window, 1 = features)",
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
                hops = gr.Slider(1, 4, value=2, step=1, label="hops (towards the input)")
                hop_note, hop_plot = gr.Markdown(), gr.Plot(label="receptive field")
            with gr.Tab("Input-level view"):
                gr.Markdown("No trained model: each pixel's colour (+ position) is its feature. Click a pixel.")
                with gr.Row():
                    pixel_image = gr.Image(type="numpy", format="png", interactive=False, show_label=False,
                                           buttons=[], elem_id="pixel_image")
                    with gr.Column():
                        pixel_k = gr.Slider(1, 1024, value=64, step=1, label="K")
                        position_weight = gr.Slider(0, 4, value=0, step=0.1, label="position weight")
                        pixel_row, pixel_col = gr.Number(0, precision=0, label="row"), gr.Number(0, precision=0,
                                                                                                 label="col")
                pixel_plot = gr.Plot(label="like vs near", elem_id="pixel_plot")

        query = [checkpoint, image_file, layer, row_px, col_px]
        rule_inputs = [*query, num_neighbors, window_size, num_candidates, seed, blend_alpha, head]
        neighbors = (ex.on_neighbors, rule_inputs, [query_image, neighbor_plot, stats, neighbors_data])
        predict = (ex.on_image, [checkpoint, image_file], [query_image, prediction])
        spectrum = (ex.on_spectrum, [checkpoint, image_file], spectrum_plot)
        multihop = (ex.on_multihop, [*query, hops, head], [hop_plot, hop_note])
        attribution = (ex.on_attribution, [checkpoint, image_file, method, target],
                       [attribution_plot, attribution_note])
        pixel_query = (ex.on_pixel_query, [image_file, pixel_row, pixel_col], [pixel_row, pixel_col])
        pixels = (ex.on_pixels, [image_file, pixel_row, pixel_col, pixel_k, position_weight], pixel_plot)
        # The views that follow a neighbours update, with what they read. The equivalence demo (seconds and ~1 GB on
        # a 32×32 layer) is only reset to its prompt, and runs when asked.
        weights = (ex.on_weights, [*query, head], [kernel_plot, slot_plot, contribution_plot, weights_note])
        tab_updates = [("weights", *weights), ("mix", ex.on_mix, query, [mix_plot, mix_note]), (None, *multihop),
                       (None, ex.on_equivalence_reset, [checkpoint, image_file, layer], equivalence_text),
                       (None, *attribution)]

        def chain(event, *steps):
            """``event.then`` each ``(fn, inputs, outputs[, api_name])`` in turn; unnamed steps stay private."""
            for fn, inputs, outputs, *api_name in steps:
                event = event.then(fn, inputs, outputs, api_name=api_name[0] if api_name else None,
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
        for control in (num_neighbors, window_size, num_candidates, seed):  # rule knobs: no view but the panel
            control.change(*neighbors, api_visibility="private")
        blend_alpha.release(*neighbors, api_visibility="private")
        hops.release(*multihop, api_name="multihop")
        attribution_button.click(*attribution, api_name="attribution")
        equivalence_button.click(ex.on_equivalence, [checkpoint, image_file, layer], equivalence_text,
                                 api_name="equivalence")
        chain(pixel_image.select(ex.on_pixel_click, image_file, [pixel_row, pixel_col], api_visibility="private"),
              (*pixels, "pixel_neighbors"))
        for control in (pixel_k, position_weight):
            control.release(*pixels, api_visibility="private")
        after_query(chain(demo.load(ex.on_model, checkpoint, [card, layer, head], api_visibility="private"), predict,
                          (ex.on_pixel_image, image_file, pixel_image), pixel_query, pixels, spectrum, neighbors))
    return demo


def launch(demo: gr.Blocks, port: int, prevent_thread_lock: bool = False):
    """Serve ``demo`` on 127.0.0.1:``port`` (the examples folder is served too; uploads up to MAX_UPLOAD_MB)."""
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    return demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=prevent_thread_lock,
                       allowed_paths=[str(EXAMPLES_DIR), str(WORK_DIR)], quiet=prevent_thread_lock,
                       max_file_size=f"{MAX_UPLOAD_MB}mb")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    env_port = os.environ.get("PORT") or os.environ.get("GRADIO_SERVER_PORT") or DEFAULT_PORT
    parser.add_argument("--port", type=int, default=int(env_port), help="port on 127.0.0.1 (default: $PORT or 7860)")
    parser.add_argument("--checkpoints", type=Path, default=CHECKPOINT_DIR, help="folder of shipped checkpoints")
    args = parser.parse_args()
    launch(build_demo(Explorer(args.checkpoints)), args.port)


if __name__ == "__main__":
    main()
