"""The explorer's documented API (``gr.api``: plain values in and out, for ``gradio_client``, scripts and the MCP
tools of :mod:`app_mcp`) and what the page's handlers share with it: resolving a model, an image and a
:class:`analysis.Query` into :mod:`analysis` calls. ``app.py`` builds the page on it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import reprlib
import typing
from collections.abc import Callable, Iterable
from pathlib import Path

import gradio as gr
import numpy as np
import torch
from gradio import processing_utils
from gradio.data_classes import FileData
from gradio.utils import get_upload_folder

import analysis as an
from convnn import CheckpointError, ModelCard
from convnn.candidates import draws_candidates
from server import address, check_dropped, user_errors, visitor

REPO = Path(__file__).resolve().parent
CHECKPOINT_DIR = REPO / "checkpoints"
EXAMPLES_DIR = REPO / "examples"
WEB_DIR = REPO / "web"  # the page's own JavaScript and CSS (the explorer and the multi-hop view)
DEFAULT_CHECKPOINT = "cnn-l0.5"  # the paper's hybrid layer: the most to see on first load
COMPARE_DEFAULT = ("cnn-l0", "cnn-l0.5", "cnn-l1")  # compare mode's first columns: convolution, hybrid, pure ConvNN
API_TYPES = {"text": str, "names": list[str], "whole": int, "real": float}  # a setting's kind → its API type

# Gradio's private parts this file touches (tests/server/test_gradio_private.py checks each on the installed Gradio;
# requirements.txt pins Gradio to the minor versions it passed on).
GRADIO_PRIVATE = {
    "processing_utils.save_file_to_cache": "copies a file into Gradio's cache, which serves it (api_export)",
    "utils.get_upload_folder": "the folder of Gradio's cache of uploads and downloads (GRADIO_TEMP_DIR)",
}


EVERY_FIELD = "*"  # in an api_* method's parameters (:func:`takes`): every field of the query, in order
WIRE_NAMES = {"image_file": "image", "compare_models": "checkpoints", "compare_depth": "depth"}  # field → API name


def takes(*names: str, required: Iterable[str] = ()) -> Callable:
    """Declares the parameters an ``api_*`` method has in the API (:func:`endpoint`), in order: fields of the view
    (:class:`analysis.ViewState`, its query's included; :data:`EVERY_FIELD`: every field of the query, those in
    ``required`` first), or the method's own keyword parameters. ``required``: the names without a default (the
    others take the field's default, or the method's own)."""
    def declare(method: Callable) -> Callable:
        method.api_parameters = names, frozenset(required)
        return method
    return declare


def endpoint(method: Callable, state_type: type = an.ViewState) -> Callable:
    """``method`` (an ``api_*`` method taking ``query`` (an :class:`analysis.Query`) or ``state`` (an
    :class:`analysis.ViewState`), its own keyword parameters and ``request``) as a ``gr.api`` function of plain
    values: one parameter per name :func:`takes` declared, a field's type from its kind (:func:`analysis.settings`),
    a field named in the API by :data:`WIRE_NAMES` (the image: a file uploaded with the request,
    :meth:`ExplorerAPI.uploaded`), then ``request``; the fields ``state_type`` declares (a new knob included, under
    :data:`EVERY_FIELD`). Its docstring and its return annotation are ``method``'s, as Gradio reads them from the
    method itself: a ``tuple[…]`` annotation, once evaluated, would make /export two outputs (two MCP answers, not
    one list of two files). Errors a user can cause are messages (:func:`server.user_errors`). A method without
    :func:`takes` is returned as it is."""
    if not hasattr(method, "api_parameters"):
        return method
    names, required = method.api_parameters
    query_type = next(item.default_factory for item in dataclasses.fields(state_type) if item.name == "query")
    fields = {item.name: (item, how) for item, how in an.settings(state_type)}
    in_query = [item.name for item, _ in an.settings(query_type)]
    if EVERY_FIELD in names:
        names = sorted(in_query, key=lambda name: name not in required)
    own, hints = inspect.signature(method).parameters, typing.get_type_hints(method)
    parameters = []
    for name in names:
        if name in fields:
            item, how = fields[name]
            annotation = FileData if name == "image_file" else API_TYPES[how.kind]
            default = inspect.Parameter.empty if name in required else item.default
        else:
            annotation, default = hints[name], own[name].default
        parameters.append(inspect.Parameter(WIRE_NAMES.get(name, name), inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            annotation=annotation, default=default))
    parameters.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        annotation=gr.Request | None, default=None))
    signature = inspect.Signature(parameters, return_annotation=inspect.signature(method).return_annotation)
    view = [name for name in names if name in fields and name not in in_query]

    def call(*args, **kwargs):
        values = signature.bind(*args, **kwargs)
        values.apply_defaults()
        named = {name: values.arguments[WIRE_NAMES.get(name, name)] for name in names}
        if "image_file" in named:
            named["image_file"] = method.__self__.uploaded(named["image_file"])
        query = query_type(**{name: named.pop(name) for name in in_query if name in named})
        state = {name: named.pop(name) for name in view}
        taken = {"state": state_type(query=query, **state)} if "state" in own else {"query": query}
        return method(**taken, **named, request=values.arguments["request"])

    call.__name__, call.__doc__, call.__signature__ = method.__name__, method.__doc__, signature
    call.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return user_errors(call)


class ExplorerAPI:
    """What the handlers share, and the documented API: the ``api_*`` methods, plain values in and out (each
    registered by :func:`app.build_demo` with ``gr.api``; those that read the explorer's view take a
    :class:`analysis.Query`, and :func:`endpoint` gives them its fields as plain parameters).

    Args:
        checkpoint_dir (Path): folder of shipped checkpoints (``*.json`` + ``*.safetensors``).
        device (str, optional): where models run; None: CUDA if available, else CPU.
        workspace (an.Workspace): where uploads and exports are kept.

    Attributes:
        state_type (type): the class of the view the page shows and the API reads (:class:`analysis.ViewState`, or a
            subclass with more fields: its query's fields become controls, link keys and API parameters).
    """

    state_type: type = an.ViewState

    def __init__(self, checkpoint_dir: Path, device: str | None, workspace: an.Workspace) -> None:
        self.checkpoint_dir = Path(checkpoint_dir).resolve()
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.examples = sorted(str(p) for p in EXAMPLES_DIR.glob("*.png"))
        self.example_paths = {Path(path).stem: path for path in self.examples}  # a link's image → its file
        self.example_digests = {hashlib.sha256(Path(path).read_bytes()).hexdigest(): stem
                                for stem, path in self.example_paths.items()}
        self.workspace = workspace

    # -- resolving the page's values -----------------------------------------------------------------------------
    @staticmethod
    def session(request: gr.Request | None) -> str | None:
        return getattr(request, "session_hash", None)

    @staticmethod
    def visitor(request: gr.Request | None) -> str:
        """Whose storage share a request's files count against (:func:`server.visitor`)."""
        return visitor(request)

    @staticmethod
    def address(request: gr.Request | None) -> str:
        """Whose ceiling a request's files count against too: its network address (:func:`server.address`)."""
        return address(request)

    def model(self, checkpoint: str | None, request: gr.Request | None = None) -> an.LoadedModel:
        card = an.checkpoint_card(checkpoint, self.checkpoint_dir, self.workspace, self.session(request))
        return an.load_model(card, self.device)

    @staticmethod
    def image(image_file: str | None, fit: str = "crop") -> an.InputImage:
        """The image at a file component's path (Gradio checked it: an upload or an example), fitted to a square."""
        if not image_file or not isinstance(image_file, str):
            raise ValueError("Pick an example or upload an image first.")
        return an.fit_image(an.load_image(image_file), ExplorerAPI.text(fit, "the fit"))  # a cache key: hashable

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
    def clicked(evt: gr.EventData) -> tuple[int, int]:
        """The pixel ``[row_px, col_px]`` a view's event names as its ``index`` (a click the page asks the server
        about: app_components).

        Raises:
            ValueError: not a pair of whole numbers; the message quotes what was sent.
        """
        index = getattr(evt, "index", None)
        if not (isinstance(index, list | tuple) and len(index) == 2):
            raise ValueError(f"a clicked pixel is [row, col], got {reprlib.repr(index)}")
        return an.Query(row_px=index[0], col_px=index[1]).pixel

    def shipped(self) -> list[str]:
        """The shipped checkpoints' names (stems), as the model list offers them."""
        return [path.stem for _, path in an.list_checkpoints(self.checkpoint_dir).found]

    def weights(self) -> dict[str, str]:
        """The shipped checkpoints' weights, by name: the sha256 each card records (``""`` where it records none)."""
        return {path.stem: ModelCard.read(path).weights_sha256
                for _, path in an.list_checkpoints(self.checkpoint_dir).found}

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
        layers = [layer_info.name for layer_info in self.model(default).layer_infos] if default else []
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

    def loaded(self, query: an.Query, request: gr.Request | None = None) -> tuple[an.LoadedModel, an.InputImage]:
        """The model and the fitted image ``query`` names."""
        return self.model(query.checkpoint, request), self.image(query.image_file, query.fit)

    def table(self, query: an.Query, request=None, keep_query: bool = True) -> dict:
        """The explorer page's value (:func:`analysis.page_table`: the table, the prediction and the image's note)
        for ``query``, in its eval draw; for a model with random candidates, with the draw and the model's answer
        over :data:`analysis.SPREAD_DRAWS` draws (:func:`analysis.draw_spread`)."""
        loaded, image = self.loaded(query, request)
        an.query_cell(loaded.layer_info(query.layer), *query.pixel)  # a pixel outside the model input is a message
        table = an.neighbor_table(loaded, image, query.layer, query.options(), query.pixel, query.draw)
        draw = self.shown_draw(loaded, query)
        return an.page_table(an.model_view(image, loaded.card.input_size), table, query.pixel, loaded.card,
                             an.top_classes(loaded, image, draw=query.draw), image, keep_query, draw,
                             None if draw is None else an.draw_spread(loaded, image))

    @staticmethod
    def shown_draw(loaded: an.LoadedModel, query: an.Query) -> int | None:
        """The eval draw the page names for ``query``'s views: its draw for a model with random candidates, None for
        any other (every draw is the same)."""
        return query.draw if draws_candidates(loaded.model) else None

    def neighbors(self, query: an.Query, request=None) -> tuple[an.LoadedModel, an.InputImage, an.QueryNeighbors]:
        """The model, the image and the query's neighbours under every rule (:func:`analysis.query_neighbors`)."""
        loaded, image = self.loaded(query, request)
        return loaded, image, an.query_neighbors(loaded, image, query.layer, query.pixel, query.options(),
                                                 draw=query.draw)

    def export(self, query: an.Query, request=None) -> dict:
        """The query's overlay (PNG) and neighbours (JSON) written for download (``exports``: their paths), and the
        JSON as the page shows it (``neighbors_data``)."""
        loaded, image, result = self.neighbors(query, request)
        return {"exports": [str(path) for path in an.export_query(self.workspace, self.session(request), loaded,
                                                                  image, result, self.visitor(request),
                                                                  self.address(request))],
                "neighbors_data": an.page_json(an.query_record(loaded, image, result))}  # a seed shown exactly

    def example_name(self, image_file: str | None) -> str | None:
        """The example an image file holds (compared by content: an upload may share an example's file name), or
        None: an uploaded photo, which a link cannot carry."""
        if not image_file or not isinstance(image_file, str) or not Path(image_file).is_file():
            return None
        if Path(image_file).stat().st_size > 2**20:  # the examples are small PNGs
            return None
        return self.example_digests.get(hashlib.sha256(Path(image_file).read_bytes()).hexdigest())

    def link(self, state: an.ViewState, tabs: list[str], request=None) -> dict[str, str]:
        """The query string of ``state`` (:func:`analysis.write_link`: knobs left at their defaults are left out; with
        compare mode open (``tabs``: the tabs a link may name), its models and depth too) as ``link``, and as
        ``link_note`` page markup naming what cannot travel in it: an uploaded model or photo, uploaded models
        compared ("" when everything travels).

        Raises:
            ValueError: the query's pixel is not one of its model's input (a row past it, an empty box) or its layer
                not one of the model's: a link to it would not open the view shown.
        """
        shipped, query, models = self.shipped(), state.query, state.compare_models
        an.query_cell(self.model(query.checkpoint, request).layer_info(query.layer), *query.pixel)
        example = self.example_name(query.image_file)
        comparing = state.tab == "compare" and isinstance(models, list)
        compared = comparing and all(name in shipped for name in models)
        left = [what for what, missing in (("the uploaded model", query.checkpoint not in shipped),
                                           ("the uploaded photo", example is None),
                                           ("the uploaded models compared", comparing and not compared)) if missing]
        note = (f"**This link leaves out {' and '.join(left)}:** it stays on this server, so the link opens "
                "whatever model or image the opening page has." if left else "")
        travels = {"model": query.checkpoint if query.checkpoint in shipped else None, "image": example,
                   "tab": state.tab if state.tab in tabs else None, "compare": models if compared else None,
                   "depth": state.compare_depth if compared else None}
        return {"link": an.write_link(state, travels), "link_note": note}

    @staticmethod
    def hop_fields(loaded: an.LoadedModel, image: an.InputImage, query: an.Query, hops) -> dict:
        """The multi-hop view's value: the fields of every query where they fit one table
        (:func:`an.fits_field_table`), so that clicks are answered in the page; else of the query's pixel."""
        layer_info = loaded.layer_info(query.layer)
        queries = None
        if not an.fits_field_table(layer_info):
            row, col = an.query_cell(layer_info, *query.pixel)
            queries = (row * layer_info.width + col,)
        fields = an.receptive_fields(loaded, image, query.layer, hops, query.head, queries, query.draw)
        return an.page_hops(an.model_view(image, loaded.card.input_size), fields, layer_info)

    def spectra(self, image: an.InputImage) -> tuple[dict[str, list], list[str]]:
        """Every shipped model's spectrum on ``image`` (:func:`analysis.selection_spectrum`; loads each model once),
        by name, and the names of those that cannot be loaded: one broken card in a ``--checkpoints`` folder leaves
        out only itself."""
        spectra, refused = {}, []
        for _, path in an.list_checkpoints(self.checkpoint_dir).found:
            check_dropped()  # a dropped run of the slow view stops between models
            try:
                spectra[path.stem] = an.selection_spectrum(an.load_model(path, self.device), image)
            except CheckpointError:
                refused.append(path.stem)
        return spectra, refused

    # -- the API: plain values (app.build_demo registers each through endpoint(): its parameters are what takes()
    # -- declares, the method gets them as one query, or view state) --------------------------------------------------
    @takes("checkpoint", required=["checkpoint"])
    def api_layers(self, query: an.Query, request: gr.Request | None = None) -> list[dict]:
        """The layers a model's views open, in forward order: ``name``, ``label``, grid ``height``/``width``, K, R,
        r, heads, λ, selection rule… (:class:`analysis.LayerInfo`)."""
        return [dataclasses.asdict(p) | {"label": an.layer_label(p)}
                for p in self.model(query.checkpoint, request).layer_infos]

    @takes("checkpoint", "image_file", "fit", "draw", required=["checkpoint", "image_file"])
    def api_predict(self, query: an.Query, request: gr.Request | None = None) -> dict[str, float]:
        """The five most probable classes of the image (``fit``: crop, letterbox or stretch) → probability, in eval
        draw ``draw`` of a model with random candidates (/table's ``spread``: its answer over 16 draws)."""
        return an.top_classes(*self.loaded(query, request), draw=query.draw)

    @takes(EVERY_FIELD, required=["checkpoint", "image_file", "layer", "row_px", "col_px"])
    def api_neighbors(self, query: an.Query, request: gr.Request | None = None) -> dict:
        """One query's neighbours under every rule (:func:`analysis.query_record`: cells, ranks, similarities,
        distances, Jaccard overlaps); 0 for K, R, r or the seed means the layer's own."""
        loaded, image, result = self.neighbors(query, request)
        return an.query_record(loaded, image, result)

    @takes(EVERY_FIELD, required=["checkpoint", "image_file", "layer", "row_px", "col_px"])
    def api_export(self, query: an.Query, request: gr.Request | None = None) -> tuple[FileData, FileData]:
        """One query's overlay (PNG, every rule side by side) and neighbours (JSON), as files to download."""
        files = self.export(query, request)["exports"]
        cached = [processing_utils.save_file_to_cache(path, get_upload_folder()) for path in files]  # served from
        return FileData(path=cached[0]), FileData(path=cached[1])  # Gradio's cache: the work dir is never served

    @takes(EVERY_FIELD, required=["checkpoint", "image_file", "layer"])
    def api_table(self, query: an.Query, request: gr.Request | None = None) -> dict:
        """What the page receives for a layer: every query's neighbours, statistics and contributions
        (:func:`analysis.page_table`; arrays base64-packed, little-endian)."""
        return self.table(query, request)

    @takes("checkpoint", "image_file", "fit", "draw", required=["checkpoint", "image_file"])
    def api_spectrum(self, query: an.Query, request: gr.Request | None = None) -> list[dict]:
        """Every layer's place on the convolution ↔ attention spectrum on this image: ``layer``,
        ``mean_distance`` (cells), ``window_share`` (in [0, 1]) and ``window_size`` R."""
        return [dataclasses.asdict(row) for row in an.selection_spectrum(*self.loaded(query, request),
                                                                         draw=query.draw)]

    @takes("checkpoint", "image_file", "layer", "row_px", "col_px", "num_hops", "head", "fit", "draw",
           required=["checkpoint", "image_file", "layer", "row_px", "col_px"])
    def api_multihop(self, query: an.Query, num_hops: int = 2, request: gr.Request | None = None) -> dict:
        """The query's receptive field through ``num_hops`` layers: ``hops`` (S × S, the first hop reaching each
        model-input pixel, −1 for none), ``layers`` (the layer of each hop ≥ 1) and ``pixel_counts``."""
        field = an.receptive_field(*self.loaded(query, request), query.layer, query.pixel, num_hops, query.head,
                                   query.draw)
        return {"hops": field.hops.tolist(), "layers": field.layers, "pixel_counts": field.pixel_counts}

    @takes("checkpoint", "image_file", "method", "target", "fit", "draw", required=["checkpoint", "image_file"])
    def api_attribution(self, query: an.Query, method: str = "saliency", target: str = "",
                        request: gr.Request | None = None) -> dict:
        """A Captum attribution map of one class (``target``; empty: the predicted one): ``values`` (S × S,
        |attribution| summed over colours, arbitrary units), ``target``, ``method`` and ``note``."""
        method, target = self.text(method, "method"), self.text(target, "class")
        with an.reporting_passes(lambda done, total: check_dropped()):  # a dropped run stops after its batch
            result = an.attribution_map(*self.loaded(query, request), method, target or None, query.draw)
        return {"values": result.values.tolist(), "target": result.target, "method": result.method,
                "note": result.note}

    @takes("checkpoint", "image_file", "layer", "fit", "draw", required=["checkpoint", "image_file", "layer"])
    def api_equivalence(self, query: an.Query, request: gr.Request | None = None) -> list[dict]:
        """The equivalence demos of the layer (window ConvNN, standard and depthwise, as select → gather → Conv1D vs
        ``conv2d``; ConvNN-attention with K = N vs SDPA): ``description``, ``max_abs_diff``, ``max_abs_output``,
        ``convnn_path`` and ``reference_path`` (what each side ran), and the pictures over the layer's grid:
        ``channel``, ``convnn`` and ``reference`` (that channel's H × W outputs), ``difference``
        (H × W, max |difference| over channels)."""
        results = an.equivalences(*self.loaded(query, request), query.layer, query.draw, between=check_dropped)
        return [{name: value.tolist() if isinstance(value, np.ndarray) else value
                 for name, value in dataclasses.asdict(result).items()} for result in results]

    @takes("checkpoint", "layer", required=["checkpoint", "layer"])
    def api_weights(self, query: an.Query, request: gr.Request | None = None) -> dict:
        """The layer's learned aggregation kernel over rank slots: ``kernel`` (C_out × K: the L2 norm over input
        channels, or the signed tap of a depthwise kernel, ``signed``), ``slot_norms`` (K: how much the t-th
        neighbour matters) and ``description``."""
        kernel = an.aggregation_kernel(self.model(query.checkpoint, request), query.layer)
        return {"kernel": kernel.kernel.tolist(), "slot_norms": kernel.slot_norms.tolist(), "signed": kernel.signed,
                "description": kernel.description}

    @takes("checkpoint", "image_file", "layer", "fit", "draw", required=["checkpoint", "image_file", "layer"])
    def api_mix(self, query: an.Query, request: gr.Request | None = None) -> dict:
        """A hybrid layer's λ mix on this image: ``branch_ratio`` λ, the channel split, and per cell (H × W) the
        ConvNN ``share`` of the 1×1 mix output and the two branches' norms."""
        mix = an.branch_mix(*self.loaded(query, request), query.layer, query.draw)
        return {"branch_ratio": mix.branch_ratio, "knn_channels": mix.knn_channels,
                "conv_channels": mix.conv_channels, "share": mix.share.tolist(), "knn_norm": mix.knn_norm.tolist(),
                "conv_norm": mix.conv_norm.tolist()}

    @user_errors
    def api_pixels(self, image: FileData, row_px: int, col_px: int, num_neighbors: int = 64,
                   position_weight: float = 0.0, request: gr.Request | None = None) -> dict:
        """The input-level view (no model): the pixel's K most similar pixels by colour (+ position) and the K of
        its window, as boolean masks over the view (``like``, ``near``), their mean distances (pixels) and
        overlap."""
        # Not the explorer's view: no model, a pixel of the photo itself and a K of its own (the page's pixel_row,
        # pixel_col and pixel_k), so it takes no Query: its parameters are written out.
        image = an.load_image(self.uploaded(image))
        result = an.pixel_neighbors(image, an.Query(row_px=row_px, col_px=col_px).pixel, num_neighbors, position_weight)
        return {"like": result.like.tolist(), "near": result.near.tolist(), "like_distance": result.like_distance,
                "near_distance": result.near_distance, "overlap": result.overlap, "window_size": result.window_size}

    @takes("compare_models", "image_file", "row_px", "col_px", "compare_depth", "layers", "fit",
           required=["compare_models", "image_file", "row_px", "col_px"])
    def api_compare(self, state: an.ViewState, layers: list[str] | None = None,
                    request: gr.Request | None = None) -> list[dict]:
        """Compare mode: 2–4 models' neighbours of one query, the pixel given in the first model's input and mapped
        onto each (:func:`analysis.compare_neighbors`); each column's layer from ``layers``, else the layer ``depth``
        of the way through the model. One :func:`analysis.query_record` per column."""
        query = state.query
        image = self.image(query.image_file, query.fit)
        models = self.compared(state.compare_models, request)
        names = layers or [an.layer_at_depth(loaded, state.compare_depth).name for loaded in models]
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise ValueError("layers must be a list of layer names, one per model")
        results = an.compare_neighbors(models, image, names, query.pixel)
        return [an.query_record(loaded, image, result) for loaded, result in zip(models, results, strict=True)]

    # -- compare mode -------------------------------------------------------------------------------------------------
    def compare_default(self) -> list[str]:
        """The models compare mode opens with: :data:`COMPARE_DEFAULT` where shipped, else the first three."""
        shipped = self.shipped()
        wanted = [name for name in COMPARE_DEFAULT if name in shipped]
        return wanted if len(wanted) >= 2 else shipped[:3]

    def compared(self, checkpoints: object, request=None) -> list[an.LoadedModel]:
        """The models of compare mode's list (:func:`analysis.compare_list`), each checked as the model list checks it.

        Raises:
            ValueError: not a list of 2 to :data:`analysis.MAX_COMPARED` different model names.
        """
        return [self.model(self.text(checkpoint, "a model"), request) for checkpoint in an.compare_list(checkpoints)]

    @staticmethod
    def too_few(compare_models) -> bool:
        """Fewer than 2 models left in compare mode's list (the user removing them): no columns, no error."""
        return isinstance(compare_models, list) and len(compare_models) < 2

