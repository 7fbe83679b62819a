"""ConvNN Explorer: pick a model and an image, click a pixel, and see which neighbours each selection rule picks.

    python app.py [--port 7860] [--checkpoints checkpoints/] [--host 0.0.0.0] [--trusted-proxy 10.0.0.5]

Binds 127.0.0.1 (``--host`` to serve a network); the port comes from ``--port``, else ``$PORT`` /
``$GRADIO_SERVER_PORT``, else 7860. Behind a reverse proxy, ``--trusted-proxy`` (or ``$CONVNN_TRUSTED_PROXIES``)
names it, so that visitors' addresses are read from its ``X-Forwarded-For``. Runs on CPU; with a GPU the models run
there and ConvNN layers use the fused Triton kernel. This file is wiring only: every
number and figure comes from :mod:`analysis`; the explorer's clicks are answered in the page by ``web/explorer.js``
from the neighbour table the server sends (:func:`analysis.page_table`); the layout is :func:`build_layout`, what
each change refreshes is :data:`REFRESH` (:func:`refresh_table`), and the documented API (``gr.api``, plain values)
is the ``api_*`` methods of :class:`app_api.ExplorerAPI`, each registered through :func:`app_api.endpoint`.

What one visitor can cost is bounded before work starts: the limits are :mod:`app_limits`, how they are applied at
launch :mod:`app_server`; the page's words are :mod:`app_texts`; the guards, the checked controls and the events'
wiring are :mod:`server`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import logging
import os
import secrets
import sys
from pathlib import Path

import app_limits as limits  # sets GRADIO_TEMP_DIR: before Gradio, whose MCP module reads it at import

# isort: split
import gradio as gr
import torch

import analysis as an
import app_texts as texts
import server
from analysis import ViewState, knob_names, settings
from analysis.rendering import figures
from app_api import CHECKPOINT_DIR, WEB_DIR, ExplorerAPI, endpoint
from app_compare import COMPARE_LAYERS, CompareMode
from app_components import CompareView, ExplorerView, HopsView
from app_server import default_workspace, launch, listen_problem
from convnn.candidates import draws_candidates
from server import (
    Admission,
    CheckedNumber,
    CheckedSlider,
    SlowRuns,
    control,
    queued_events,
    trusted_networks,
    user_errors,
    wire,
)

MODEL_KNOBS = ("head", "draw")  # the knobs whose control the model shapes (Explorer.on_model: range, shown or not)
DRAW_STEPS = ("draw_back", "draw_next")  # the buttons stepping the eval draw, beside its box


class Explorer(CompareMode, ExplorerAPI):
    """The page's handlers: thin adapters from the page's values to :mod:`analysis`.

    Handlers take the page's values by name, the ``elem_id`` of the component each comes from
    (:func:`server.wire` passes them; what the explorer shows comes as one :class:`analysis.Query`, ``query``, or
    the whole :class:`analysis.ViewState`, ``state``, of the class :attr:`state_type`), and the event's
    ``gr.Request``, whose session owns the uploads and exports it makes (a direct call without one is the one local
    session).

    Args:
        checkpoint_dir (Path): folder of shipped checkpoints (``*.json`` + ``*.safetensors``).
        device (str): where models run. Default: CUDA if available, else CPU
        workspace (an.Workspace): where uploads and exports are kept. Default: :func:`default_workspace`
        max_upload_mb (int): the largest file an upload may be, MB. Default: MAX_UPLOAD_MB
    """

    def __init__(self, checkpoint_dir: Path = CHECKPOINT_DIR, device: str | None = None,
                 workspace: an.Workspace | None = None, max_upload_mb: int = limits.MAX_UPLOAD_MB) -> None:
        super().__init__(checkpoint_dir, device, workspace or default_workspace())
        self.lessons = json.loads((WEB_DIR / "lessons.json").read_text(encoding="utf-8"))
        self.max_upload_mb = max_upload_mb

    # -- model, image, prediction ------------------------------------------------------------------------------------
    @user_errors
    def on_model(self, checkpoint, layer=None, request=None):
        """A model picked (or the list closed on the same one): its card, layers (the shown one kept if the model
        has it, else its first), heads and draws."""
        loaded = self.model(checkpoint, request)
        first, heads, draws = loaded.first_layer_info, loaded.max_heads, draws_candidates(loaded.model)
        names = [layer_info.name for layer_info in loaded.layer_infos]
        return {"opened_model": checkpoint,  # what every other step reads (READ_OPENED)
                "card": an.card_summary(loaded.card),  # plain text in a read-only textbox: card text is never markup
                "layer": gr.update(choices=[(an.layer_label(layer_info), layer_info.name)
                                            for layer_info in loaded.layer_infos],
                                   value=layer if layer in names else first and first.name),
                "head": gr.update(maximum=heads - 1, value=0, visible=heads > 1),
                "draw": gr.update(value=0, visible=draws),  # a model without random candidates has one answer
                **{button: gr.update(visible=draws) for button in DRAW_STEPS}}

    @user_errors
    def has_layer(self, checkpoint, layer, request=None) -> bool:
        """Whether ``layer`` is one of the layers the explorer opens of the model ``checkpoint``."""
        return layer in {layer_info.name for layer_info in self.model(checkpoint, request).layer_infos}

    @user_errors
    def on_draw_back(self, draw, request=None):
        """The eval draw before the one shown (none before draw 0)."""
        return max(an.whole_number(draw, an.KNOB_NAMES["draw"], 0, an.MAX_DRAW) - 1, 0)

    @user_errors
    def on_draw_next(self, draw, request=None):
        """The eval draw after the one shown (none after :data:`analysis.MAX_DRAW`)."""
        return min(an.whole_number(draw, an.KNOB_NAMES["draw"], 0, an.MAX_DRAW) + 1, an.MAX_DRAW)

    @user_errors
    def on_first_render(self, query, focus_rule="", request=None):
        """What a new model, image, link or lesson step shows first: the explorer's table with the prediction, at the
        query's pixel moved inside the model's input (a model of another input size still answers), and the rule
        the last link or step named (``focus_rule``: :meth:`view`), which the page shows large when it is new."""
        size = self.model(query.checkpoint, request).card.input_size
        return self.table(query.at(query.pixel, size), request, keep_query=False) | {"focus_rule": focus_rule}

    @user_errors
    def on_table(self, query, request=None):
        """A new table for a new layer or rule knob; the page keeps its query."""
        return self.table(query, request)

    @user_errors
    def on_table_row(self, query, evt: gr.EventData, request=None):
        """A click's row when K is above the table's bound (the explorer's ``row`` event, ``evt.index`` the pixel;
        :data:`an.MAX_TABLE_NEIGHBORS`)."""
        return self.table(query.at(self.clicked(evt)), request)

    @user_errors
    def on_sweep(self, query, request=None):
        """The α animation's frames for the table shown (the explorer's ``sweep`` event, once per table, when ▶ α is
        pressed)."""
        loaded, image = self.loaded(query, request)
        sweep = an.blend_sweep(loaded, image, query.layer, query.options(), draw=query.draw)
        return an.page_sweep(sweep, loaded.card, image, self.shown_draw(loaded, query))

    @user_errors
    def on_checkpoint_upload(self, checkpoint_files, uploads, request=None):
        choice = an.store_upload(checkpoint_files or [], self.workspace, self.session(request), self.device,
                                 self.visitor(request), self.address(request))
        label = f"uploaded: {an.card_summary(self.model(choice, request).card).splitlines()[0]}"
        uploads = [*uploads, (label, choice)]
        return {"checkpoint": gr.update(choices=self.choices(uploads), value=choice), "uploads": uploads,
                "checkpoint_files": None,  # emptied, so that the next pair is an upload of two files again
                "compare_models": gr.update(choices=self.choices(uploads))}

    # -- links and lessons ------------------------------------------------------------------------------------------
    def view(self, params: dict, state: an.ViewState, request=None) -> dict:
        """The page's updates for a link's fields, opened from the view ``state`` shown (:func:`analysis.open_link`:
        each checked as its control checks it and against the model; a model, image, tab or compare mode's models
        or depth the link leaves out stays as it is, but for the depth of compare mode opened by the link, which
        opens at the depth it opens at by hand (:meth:`opening_depth`); every value refused is named in
        ``link_note``)."""
        opened = an.open_link(params, state, self.shipped(), self.example_paths,
                              lambda name: self.model(name, request), list(texts.TABS), an.page_rules())
        query, named = opened.state.query, opened.named
        out = {name: gr.update() for name in link_outputs(type(state))} | self.on_model(query.checkpoint, request)
        out["layer"]["value"] = query.layer  # the model's update holds the layers, the heads' range, the draw's box
        out |= {name: out[name] | {"value": getattr(query, name)} for name in MODEL_KNOBS}
        out |= {name: getattr(query, name) for name in ("row_px", "col_px", *knob_names(query))
                if name not in MODEL_KNOBS}
        out |= {name: getattr(query, name) for name in named & {"checkpoint", "image_file"}}
        if "image_file" in named:  # its thumbnail highlighted, or none for another image
            shown = query.image_file in self.examples
            out["examples"] = gr.Gallery(selected_index=self.examples.index(query.image_file) if shown else None)
        if "compare_models" in named:
            out["compare_models"] = list(opened.state.compare_models)
        if "compare_depth" in named:
            out["compare_depth"] = opened.state.compare_depth
        elif "tab" in named and opened.state.tab == "compare":
            out["compare_depth"] = self.opening_depth(query.checkpoint, query.layer, request)
        if "tab" in named:
            out["tabs"], out["tab"] = gr.Tabs(selected=opened.state.tab), opened.state.tab
        # the rule shown large, new at each opening (a step opened again over the view it opens, moved on in the
        # page, is shown again: its table alone was the same as the one shown)
        return out | {"focus_rule": f"{opened.focus_rule}@{secrets.token_hex(4)}", "link_note": opened.note}

    @user_errors
    def on_link(self, state, request=None):
        """The page as the address's query string says (a plain address: the model's default view)."""
        params = dict(request.query_params) if request is not None and request.query_params else {}
        out = self.view(params, state, request)
        if out["link_note"]:  # said where the page opens too: the note is far below the first screen; until
            #                    closed, as the page may take longer to open than a toast's 10 s (a loaded server)
            gr.Warning(texts.LINK_WARNING, duration=None)
        return out

    @user_errors
    def on_link_copy(self, state, request=None) -> dict:
        """The link to the view shown and a note on what cannot travel in it (:meth:`ExplorerAPI.link`)."""
        return self.link(state, list(texts.TABS), request)

    def lesson_step(self, lesson, step, state, request=None) -> dict:
        """Step ``step`` of the lesson titled ``lesson`` (:func:`analysis.lesson_step`): its link's view
        (:meth:`view`), its paragraph, and the step reached; without a lesson, or over models it was not written for
        (:meth:`weights`), only a note where its text goes; past either end (Next on the last step, Back on the
        first), the step's text, the view as the user left it."""
        found = an.lesson_step(self.lessons, lesson, step, self.weights())
        if found is None or found.unknown or found.step != step:  # said where the lesson's text goes; the view stays
            #  as it is (no error on every box, no narration of models this server does not have, and past the end
            #  no step applied again over what the user did since)
            return {name: gr.skip() for name in link_outputs(type(state))} | {
                "lesson_text": found.text if found else texts.LESSON_MISSING, "lesson_step": found.step if found else 0}
        return self.view(found.params, state, request) | {"lesson_text": found.text, "lesson_step": found.step}

    @user_errors
    def on_lesson_start(self, lesson, state, request=None):
        """The lesson titled ``lesson`` from its first step; None (the list left without a pick,
        texts.LESSON_PICKED_JS): nothing changes."""
        if lesson is None:
            return {name: gr.skip() for name in [*link_outputs(type(state)), "lesson_text", "lesson_step"]}
        return self.lesson_step(lesson, 0, state, request)

    @user_errors
    def on_lesson_next(self, lesson, lesson_step, state, request=None):
        return self.lesson_step(lesson, (lesson_step or 0) + 1, state, request)

    @user_errors
    def on_lesson_back(self, lesson, lesson_step, state, request=None):
        return self.lesson_step(lesson, (lesson_step or 0) - 1, state, request)

    @staticmethod
    def own_pick(what: str, lesson, lesson_step):
        """An image or a model (``what``) picked by hand while a lesson is open: the step's text no longer describes
        the screen, so it says so; no change without a lesson."""
        return texts.LESSON_ASIDE.format(step=(lesson_step or 0) + 1, what=what) if lesson else gr.skip()

    def on_own_image(self, lesson, lesson_step, request=None):
        return self.own_pick("image", lesson, lesson_step)

    def on_own_model(self, lesson, lesson_step, request=None):
        return self.own_pick("model", lesson, lesson_step)

    @user_errors
    def on_example(self, evt: gr.EventData, request=None) -> str:
        return self.examples[an.whole_number(evt.index, "the example's index", 0, len(self.examples) - 1)]

    @user_errors
    def on_image_upload(self, image_upload: str | None, request=None) -> dict:
        """An uploaded photo: the image every view reads (refused before it replaces the current one if it cannot
        be read), and no example thumbnail left highlighted as if it were the image shown."""
        self.image(image_upload)
        return {"image_file": image_upload, "examples": gr.Gallery(selected_index=None)}

    # -- the tabs ----------------------------------------------------------------------------------------------------
    @user_errors
    def on_weights(self, query, request=None):
        loaded = self.model(query.checkpoint, request)
        layer_info = loaded.layer_info(query.layer)
        if layer_info.dense:  # no chart, not two empty boxes
            return {"kernel_plot": gr.Plot(None, visible=False), "slot_plot": gr.Plot(None, visible=False),
                    "weights_note": f"{layer_info.name} is plain attention: no rank-slot kernel to show."}
        heat, bars = figures.kernel_figures(an.aggregation_kernel(loaded, query.layer))
        note = ("A conv-only layer: its taps are the window's rank slots (METHOD §4.1)."
                if layer_info.record_name is None
                else "Each neighbour's contribution to the clicked cell is in the explorer above.")
        return {"kernel_plot": gr.Plot(heat, visible=True), "slot_plot": gr.Plot(bars, visible=True),
                "weights_note": note}

    @user_errors
    def on_mix(self, query, request=None):
        loaded = self.model(query.checkpoint, request)
        layer_info = loaded.layer_info(query.layer)
        if not layer_info.is_hybrid:
            return {"mix_plot": None, "mix_note": f"{layer_info.name} is not a hybrid layer: the λ mix exists only in "
                                                  "hybrid ConvNN layers."}
        mix = an.branch_mix(loaded, self.image(query.image_file, query.fit), query.layer, query.draw)
        return {"mix_plot": figures.mix_figure(mix, layer_info.name), "mix_note": an.mix_summary(mix)}

    @user_errors
    def on_hops(self, query, hops, request=None):
        """:meth:`hop_fields` at the query's pixel, moved inside the model's input as the explorer moves a query
        kept across a change of model."""
        loaded, image = self.loaded(query, request)
        return self.hop_fields(loaded, image, query.at(query.pixel, loaded.card.input_size), hops)

    @user_errors
    def on_hops_row(self, query, hops, evt: gr.EventData, request=None):
        """The field of a clicked query that the multi-hop view's table does not hold (its ``field`` event,
        ``evt.index`` the pixel); where the table holds every query, nothing is sent again."""
        loaded = self.model(query.checkpoint, request)
        if an.fits_field_table(loaded.layer_info(query.layer)):
            return gr.skip()
        return self.hop_fields(loaded, self.image(query.image_file, query.fit), query.at(self.clicked(evt)), hops)

    @user_errors
    def on_spectrum(self, query, request=None):
        return figures.spectrum_figure(an.selection_spectrum(*self.loaded(query, request), draw=query.draw))

    @user_errors
    def on_spectrum_models(self, query, request=None):
        """Every shipped model's layers on one axis for this image (loads each model once; seconds the first time)."""
        spectra, refused = self.spectra(self.image(query.image_file, query.fit))
        if refused:
            gr.Warning(f"Left out, as they cannot be loaded: {', '.join(refused)} (pick one in the model list to "
                       "see why).")
        return figures.spectrum_models_figure(spectra)

    @user_errors
    def on_attribution(self, query, method, target, request=None, progress=None):
        loaded, image = self.loaded(query, request)
        desc = f"{an.ATTRIBUTION_METHODS.get(method, 'attribution')}…"

        def passes(done: int, total: int) -> None:  # after each batch: stop here if dropped; else the progress bar
            server.check_dropped()
            if progress is not None:
                progress((done, total), desc=desc, unit="passes")

        passes(0, an.attribution_passes(method))
        with an.reporting_passes(passes):
            result = an.attribution_map(loaded, image, method, target or None, query.draw)
        return {"attribution_plot": figures.attribution_figure(an.model_view(image, loaded.card.input_size), result),
                "attribution_note": " ".join(filter(None, [result.note, self.draw_shown(loaded, query)]))}

    @user_errors
    def on_equivalence(self, query, request=None):
        loaded, image = self.loaded(query, request)
        results = an.equivalences(loaded, image, query.layer, query.draw, between=server.check_dropped)
        summary = an.equivalence_summary(loaded, image, query.layer, query.draw, results=results)
        # no demo fits an attention layer past the attention demo's memory bound: the text says why, no picture
        return {"equivalence_text": "\n\n".join(filter(None, [summary, self.draw_shown(loaded, query)])),
                "equivalence_plot": figures.equivalence_figure(results) if results else None}

    @staticmethod
    def draw_shown(loaded: an.LoadedModel, query: an.Query) -> str:
        """The sentence naming the eval draw a view of a random-candidate model shows ("" for any other model)."""
        return texts.DRAW_SHOWN.format(draw=query.draw) if draws_candidates(loaded.model) else ""

    @staticmethod
    def on_slow_reset(request=None):
        """A new model, image or layer: the slow views' last results no longer apply; they run when asked."""
        return {"attribution_plot": None, "attribution_note": texts.ATTRIBUTION_PROMPT,
                "equivalence_text": texts.EQUIVALENCE_PROMPT, "equivalence_plot": None, "spectrum_models_plot": None}

    @staticmethod
    def on_attribution_cancel(request=None):
        """Cancel pressed: the run is dropped (its computation ends in the background), and the page says so."""
        return {"attribution_plot": None, "attribution_note": texts.ATTRIBUTION_CANCELLED}

    @user_errors
    def on_export(self, query, request=None):
        """Write the query's overlay (PNG) and neighbours (JSON) for download; only when asked, not on every click.
        Gradio serves them from its own cache (the work dir is never served)."""
        return self.export(query, request)

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
        pixel = an.Query(row_px=pixel_row, col_px=pixel_col).pixel
        row, col = an.clamp_px(pixel, *an.pixel_view(an.load_image(image_file)).shape[:2])
        return {"pixel_row": row, "pixel_col": col}

    @user_errors
    def on_pixels(self, image_file, pixel_row, pixel_col, pixel_k, position_weight, request=None):
        image, query_px = an.load_image(image_file), an.Query(row_px=pixel_row, col_px=pixel_col).pixel
        result = an.pixel_neighbors(image, query_px, pixel_k, position_weight)
        return figures.pixel_figure(an.pixel_view(image), result, query_px)


SLOW_VIEWS = ("on_attribution", "on_equivalence", "on_spectrum_models")  # run only when asked (SlowRuns)
API = ["layers", "predict", "neighbors", "table", "export", "spectrum", "multihop", "weights", "mix", "pixels",
       "compare"]  # the documented API: ExplorerAPI.api_<name> as /<name>, plain values in and out
SLOW_API = ["attribution", "equivalence"]  # the same, in the slow views' group
KEPT = ["checkpoint", "image_file", "tab", "compare_models", "compare_depth"]  # what a link it leaves out keeps
COMPARE_QUERY = ["compare_models", *COMPARE_LAYERS, "checkpoint", "image_file", "fit", "row_px", "col_px",
                 "draw"]  # compare mode's: its models, layers, the image, the explorer's query and draw


def query_fields(state_type: type = ViewState) -> list[str]:
    """All a table is made from: the fields of ``state_type``'s query, each its control's ``elem_id``."""
    return [item.name for item, _ in settings(state_type().query)]


def link_outputs(state_type: type = ViewState) -> list[str]:
    """What a link or a lesson's step sets (:meth:`Explorer.view`)."""
    return ["checkpoint", "opened_model", "card", "layer", *MODEL_KNOBS, *DRAW_STEPS, "image_file", "row_px", "col_px",
            *[name for name in knob_names(state_type().query) if name not in MODEL_KNOBS], "tabs", "tab",
            "focus_rule", "compare_models", "compare_depth", "link_note", "examples"]


def views(state_type: type = ViewState) -> dict[str, tuple[str, list[str], list[str]]]:
    """The views, by name: (handler, inputs, outputs), each a component's elem_id (``state_type``: the view's class,
    whose query's fields a table is made from)."""
    query, links = query_fields(state_type), link_outputs(state_type)
    return {
        "model": ("on_model", ["checkpoint", "layer"], ["opened_model", "card", "layer", *MODEL_KNOBS, *DRAW_STEPS]),
        **{step: (f"on_{step}", ["draw"], ["draw"]) for step in DRAW_STEPS},
        "link": ("on_link", KEPT, links),
        "lesson_start": ("on_lesson_start", ["lesson", *KEPT], [*links, "lesson_text", "lesson_step"]),
        "lesson_next": ("on_lesson_next", ["lesson", "lesson_step", *KEPT], [*links, "lesson_text", "lesson_step"]),
        "lesson_back": ("on_lesson_back", ["lesson", "lesson_step", *KEPT], [*links, "lesson_text", "lesson_step"]),
        "checkpoint_upload": ("on_checkpoint_upload", ["checkpoint_files", "uploads"],
                              ["checkpoint", "uploads", "checkpoint_files", "compare_models"]),
        "compare_pick": ("on_compare_pick", ["compare_models"], ["compare_models"]),
        "compare_open": ("on_compare_open", ["checkpoint", "layer", "tab"], ["compare_depth", "tab"]),
        "compare_layers": ("on_compare_layers", ["compare_models", "compare_depth"], COMPARE_LAYERS),
        "compare": ("on_compare", COMPARE_QUERY, ["compare"]),
        "compare_if_open": ("on_compare_if_open", [*COMPARE_QUERY, "tab"], ["compare"]),
        "compare_layers_if_open": ("on_compare_layers_if_open", ["compare_models", "compare_depth", "tab"],
                                   COMPARE_LAYERS),
        "own_image": ("on_own_image", ["lesson", "lesson_step"], ["lesson_text"]),
        "own_model": ("on_own_model", ["lesson", "lesson_step"], ["lesson_text"]),
        "example": ("on_example", [], ["image_file"]),
        "image_upload": ("on_image_upload", ["image_upload"], ["image_file", "examples"]),
        "first_render": ("on_first_render", [*query, "focus_rule"], ["explorer"]),
        "table": ("on_table", query, ["explorer"]),
        "weights": ("on_weights", ["checkpoint", "layer"], ["kernel_plot", "slot_plot", "weights_note"]),
        "mix": ("on_mix", ["checkpoint", "image_file", "fit", "layer", "draw"], ["mix_plot", "mix_note"]),
        "hops": ("on_hops", ["checkpoint", "image_file", "fit", "layer", "row_px", "col_px", "hops", "head", "draw"],
                 ["hop_view"]),
        "spectrum": ("on_spectrum", ["checkpoint", "image_file", "fit", "draw"], ["spectrum_plot"]),
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
# So does each later step of a chain: a step reached while the same step of a chain before it is still answered
# waits for that answer and then runs; Gradio's default for a .then ("once") dropped it, and with it the rest of its
# chain (two models picked quickly: the explorer stayed on the model before the two).
# Compare mode maps the query from the explorer's model's input: a new model redraws it where it is open.
MODEL_CHAIN = ["first_render", "weights", "mix", "spectrum", "hops", "slow_reset"]
IMAGE_CHAIN = ["first_render", "mix", "spectrum", "hops", "slow_reset", "pixel_image", "pixel_query", "pixels",
               "compare_if_open"]
DRAW_CHAIN = ["table", "mix", "spectrum", "hops", "slow_reset", "compare_if_open"]  # every view: one eval draw
VIEW_CHAIN = [*MODEL_CHAIN, "pixel_image", "pixel_query", "pixels",  # after a link or a lesson's step: anything
              "compare_layers_if_open", "compare_if_open"]


def refresh_table(state_type: type = ViewState) -> dict[tuple[str, str], list[str]]:
    """The refresh policy (above): (component, event) → the views it runs (:func:`views`), in order; each rule knob
    of ``state_type``'s query (its control's event: a slider's release, a number box's blur) redraws the table."""
    return {
        ("demo", "load"): ["link", *VIEW_CHAIN],
        ("checkpoint", "input"): ["model", *MODEL_CHAIN, "compare_if_open"],
        ("checkpoint_files", "upload"): ["checkpoint_upload", "model", *MODEL_CHAIN, "compare_if_open"],
        ("examples", "select"): ["example", *IMAGE_CHAIN],
        ("image_upload", "upload"): ["image_upload", *IMAGE_CHAIN],
        ("lesson", "input"): ["lesson_start", *VIEW_CHAIN],
        ("lesson_next", "click"): ["lesson_next", *VIEW_CHAIN],
        ("lesson_back", "click"): ["lesson_back", *VIEW_CHAIN],
        ("fit", "change"): ["first_render", "mix", "spectrum", "hops", "slow_reset", "compare_if_open"],
        ("compare_tab", "select"): ["compare_open", "compare_layers", "compare"],
        ("compare_models", "input"): ["compare_pick", "compare_layers", "compare"],
        ("compare_depth", "release"): ["compare_layers", "compare"],
        **{(layer, "input"): ["compare"] for layer in COMPARE_LAYERS},
        ("layer", "input"): ["table", "weights", "mix", "hops", "slow_reset"],
        **{(item.name, "release" if how.step else "blur"): ["table", *(["hops"] if item.name == "head" else [])]
           for item, how in settings(state_type().query) if how.is_knob and item.name != "draw"},
        ("draw", "blur"): DRAW_CHAIN,
        **{(step, "click"): [step, *DRAW_CHAIN] for step in DRAW_STEPS},
        ("hops", "release"): ["hops"],
        ("pixel_k", "release"): ["pixels"],
        ("position_weight", "release"): ["pixels"],
        **{(box, "blur"): ["pixels"] for box in ("pixel_row", "pixel_col")},
    }


# Views in a step of their own in a chain (the others share steps: server.step_groups): the explorer's first
# render, which the page shows first, and the slow views' reset (a coroutine, on the server's event loop).
ALONE = frozenset({"first_render", "slow_reset"})
VIEWS, REFRESH = views(), refresh_table()  # the explorer's (analysis.ViewState)
# The model list names a model to open, and only the step that opens it reads it (on_model, which says whether it
# opens); every other step reads the model opened, whose card and layers the page shows (opened_model, which on_model
# sets). A name typed in the list and not opened yet is not one: a model picked, then an unknown name typed and Enter
# before the pick was answered, and the pick's next steps read the unknown name and changed nothing (the explorer
# stayed on the model before, under the pick's card and layers).
READ_OPENED, READS_THE_LIST = {"checkpoint": "opened_model"}, {"model"}
# The controls a refused value of which goes back to the value shown: the model list to the model opened; compare
# mode's depth to the one its columns show, kept in the page (app_texts.KEEP_JS) (the knobs have theirs: build_demo).
# Each: the control → (the component read, the page's function giving the value back).
RESTORED = {"checkpoint": ("opened_model", texts.RESTORE_MODEL_JS),
            "compare_depth": ("compare_depth", texts.RESTORE_DEPTH_JS)}
# The chains that open a view a link names, by their source: each shows the tab it opens once its views are drawn.
SHOWS_TAB = {"demo": texts.SHOW_TAB_JS, **dict.fromkeys(("lesson", "lesson_next", "lesson_back"),
                                                        texts.SHOW_STEP_TAB_JS)}
# What each view opens (the view the page shows next), and the openings after which a step's answer is stale
# (server.Openings): a link or a lesson's step answered late changes nothing once a later one has been answered
# (a lesson picked, its model loaded cold, and Next pressed meanwhile: the lesson's first step came last and put the
# page back on it), nor does an explorer's table once any later opening has been (Next, then Back before Next's
# table came: the explorer stayed on Next's model under Back's step); each opening's chain draws its own.
OPENS = {"link": "view", "lesson_start": "view", "lesson_next": "view", "lesson_back": "view", "model": "model",
         "example": "image", "image_upload": "image"}
STALE_AFTER = {**{view: ("view",) for view, opens in OPENS.items() if opens == "view"},
               "first_render": ("view", "model", "image")}
# The page's function a chain's first step runs before it is sent (its inputs in, its inputs out), given where the
# event's own component is among them where it reads that (``{at}``).
CHAIN_JS = {("lesson", "input"): texts.LESSON_PICKED_JS, ("lesson_next", "click"): texts.STEP_ASKED_JS,
            ("lesson_back", "click"): texts.STEP_ASKED_JS}
# An image or a model the user picks while a lesson is open: once its chain's first step has taken it (not when it
# was refused), the lesson's text says its step is about the lesson's own.
OWN_PICKS = {("examples", "select"): "own_image", ("image_upload", "upload"): "own_image",
             ("checkpoint", "input"): "own_model", ("checkpoint_files", "upload"): "own_model"}


def build_layout(ex: Explorer) -> dict[str, gr.components.Component]:
    """The page's components, laid out, by ``elem_id`` (no events: :func:`build_demo` wires them)."""
    ui: dict[str, gr.components.Component] = {}

    def add(component):
        ui[component.elem_id] = component
        return component

    upload_mb, left_out, query_type = ex.max_upload_mb, ex.left_out(), type(ex.state_type().query)
    ui["uploads"] = gr.State([])  # this session's uploaded checkpoints (a State has no elem_id)
    gr.Markdown(f"# ConvNN Explorer\nConvolution and attention as one k-nearest-neighbour operation · compute "
                f"path: **{an.compute_path(ex.device)}**", elem_id="title")
    with gr.Row(equal_height=False, elem_id="main_row"):
        with gr.Column(scale=2, min_width=300, elem_id="pick_column"):
            guide = [gr.Markdown(text, visible=False) for text in texts.GUIDE[:2]]
            add(gr.Dropdown(ex.choices([]), value=ex.default_checkpoint(), label="Model", allow_custom_value=True,
                            elem_id="checkpoint"))
            add(gr.Textbox("\n".join(left_out), label="Left out of the model list: they cannot be opened",
                           lines=min(len(left_out), 4), max_lines=8, interactive=False, visible=bool(left_out),
                           elem_id="left_out"))  # plain text: a card's text is never markup
            add(gr.Markdown(texts.NO_MODEL, visible=ex.default_checkpoint() is None, elem_id="no_model"))
            # 32 px images: 2 rows, no icons over them; each captioned with its name (as a link names it), which
            # Gradio gives the thumbnail as its alt text (web/page.css hides the caption drawn over it)
            add(gr.Gallery([(path, stem) for stem, path in ex.example_paths.items()], columns=10, rows=2, height=80,
                           allow_preview=False, label="Examples", show_label=False, object_fit="cover", buttons=[],
                           elem_id="examples"))
            add(gr.UploadButton(f"Upload a photo (≤ {upload_mb} MB)", file_types=["image"], size="md",
                                elem_id="image_upload"))
            add(gr.Radio(list(an.FITS), value="crop", label="A photo that is not square is…", elem_id="fit"))
            add(gr.Dropdown(label="Layer", allow_custom_value=True, elem_id="layer"))
            with gr.Row(elem_id="query_boxes"):  # the clicked pixel (a phone taps instead: hidden there)
                add(control(query_type, "row_px", min_width=90))
                add(control(query_type, "col_px", min_width=90))
            # The selection knobs beside the explorer they change (below it on a phone, after the layer): number
            # boxes two to a row, then the sliders. The id is a column's: Gradio 6.31's gr.Group writes its elem_id on
            # two nested elements (#knobs matched both).
            with gr.Column(elem_id="knobs", min_width=0), gr.Group():
                knobs = [(item.name, how) for item, how in settings(query_type) if how.is_knob]
                boxes = [name for name, how in knobs if not how.step and name != "draw"]
                for index in range(0, len(boxes), 2):
                    with gr.Row() if len(boxes[index:index + 2]) == 2 else contextlib.nullcontext():
                        for name in boxes[index:index + 2]:
                            add(control(query_type, name, min_width=130))
                for name in (name for name, how in knobs if how.step):
                    add(control(query_type, name, min_width=200))
                with gr.Row(elem_id="draw_row"):  # a random-candidate model's eval draw, stepped (on_model shows it)
                    add(gr.Button("◀", size="sm", visible=False, elem_id="draw_back", scale=0, min_width=40))
                    add(control(query_type, "draw", min_width=130))
                    add(gr.Button("▶", size="sm", visible=False, elem_id="draw_next", scale=0, min_width=40))
            add(gr.File(ex.examples[0] if ex.examples else None, file_types=["image"], elem_id="image_file",
                        label="Image", visible=False))  # the file every view reads (the explorer shows it)
            with gr.Row(elem_id="link_row"):
                add(gr.Button("Copy a link to this view", size="sm", elem_id="link_button", min_width=120))
                add(gr.Textbox(label="link", show_label=False, interactive=False, buttons=["copy"], elem_id="link",
                               placeholder=texts.LINK_NOTE, min_width=160))
            add(gr.Markdown("", elem_id="link_note"))
            add(gr.Textbox("", visible="hidden", elem_id="focus_rule"))  # a link's rule, for the explorer's table
            add(gr.Textbox(ex.default_checkpoint(), visible="hidden", elem_id="opened_model"))  # READ_OPENED
            guide += [gr.Markdown(text, visible=False) for text in texts.GUIDE[2:4]]
        with gr.Column(scale=5, min_width=320, elem_id="explore_column"):
            # Right above the explorer: a step's text next to what it describes (on a phone right below its
            # image and prediction, which stay on the first screen: web/page.css).
            with gr.Accordion("Lessons: convolution, attention and what lies between", open=False, elem_id="lessons"):
                with gr.Row():
                    add(gr.Dropdown([lesson["title"] for lesson in ex.lessons], value=None, label="lesson",
                                    elem_id="lesson", scale=3, min_width=260))  # a title whole (a row on a phone)
                    add(gr.Button("◀ Back", elem_id="lesson_back", scale=1, min_width=80))
                    add(gr.Button("Next step ▶", variant="primary", elem_id="lesson_next", scale=1, min_width=80))
                add(gr.Markdown(texts.LESSON_PROMPT, elem_id="lesson_text"))
            add(ExplorerView(elem_id="explorer"))
    ui["lesson_step"] = gr.State(0)  # the step of the lesson shown
    ui["tab"] = gr.State(next(iter(texts.TABS)))  # the tab open, for a link (Tabs send no value of their own)
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
    guide.append(gr.Markdown(texts.GUIDE[4], visible=False))
    with add(gr.Tabs(elem_id="tabs", overflow_behavior="wrap")):  # every view's name in sight, on a phone too
        with gr.Tab(texts.TABS["weights"], id="weights"):
            add(gr.Markdown(elem_id="weights_note"))
            with gr.Row():  # side by side where both fit whole (not on a phone)
                add(gr.Plot(label="kernel", elem_id="kernel_plot", min_width=300))
                add(gr.Plot(label="per rank slot", elem_id="slot_plot", min_width=300))
        with gr.Tab(texts.TABS["mix"], id="mix"):
            add(gr.Markdown(elem_id="mix_note"))
            add(gr.Plot(label="ConvNN share", elem_id="mix_plot"))
        with gr.Tab(texts.TABS["attribution"], id="attribution"):
            with gr.Row():
                add(gr.Dropdown([(label, method) for method, label in an.ATTRIBUTION_METHODS.items()],
                                value="saliency", label="method", elem_id="method"))
                add(gr.Textbox("", label="class (empty = predicted)", elem_id="target"))
                add(gr.Button("Compute attribution", variant="primary", elem_id="attribution_button"))
                add(gr.Button("Cancel", elem_id="attribution_cancel"))
            add(gr.Markdown(texts.ATTRIBUTION_PROMPT, elem_id="attribution_note"))
            add(gr.Plot(label="attribution", elem_id="attribution_plot"))
        with gr.Tab(texts.TABS["spectrum"], id="spectrum"):
            add(gr.Plot(label="spectrum", elem_id="spectrum_plot"))
            add(gr.Button("Place every shipped model on this image", elem_id="spectrum_models_button"))
            add(gr.Plot(label="every model", elem_id="spectrum_models_plot"))
        with add(gr.Tab(texts.TABS["compare"], id="compare", elem_id="compare_tab")):
            with gr.Row():
                compare_choices = ex.choices([])
                add(gr.Dropdown(compare_choices, value=ex.compare_default(), multiselect=True,  # past the limit:
                                label=f"models, one column each (2–{an.MAX_COMPARED})",  # on_compare_pick
                                elem_id="compare_models", scale=3, min_width=300))  # on a phone, the picker
                add(control(ex.state_type, "compare_depth", scale=2, min_width=260))  # and depth a row each
            with gr.Row():
                for index, name in enumerate(COMPARE_LAYERS):
                    add(gr.Dropdown(label=f"column {index + 1}: layer", allow_custom_value=True, elem_id=name,
                                    visible=index < 3, min_width=260))  # a layer's name whole (a row on a phone)
            add(CompareView(elem_id="compare"))
        with gr.Tab(texts.TABS["equivalence"], id="equivalence"):
            add(gr.Button("Run on this layer's features", elem_id="equivalence_button"))
            add(gr.Markdown(texts.EQUIVALENCE_PROMPT, elem_id="equivalence_text"))
            add(gr.Plot(label="ConvNN vs the operation it equals", elem_id="equivalence_plot"))
        with gr.Tab(texts.TABS["hops"], id="hops"):
            gr.Markdown(texts.HOPS_INTRO)
            add(CheckedSlider(1, 4, value=2, step=1, label="hops (towards the input)", elem_id="hops"))
            add(HopsView(elem_id="hop_view"))
        with gr.Tab(texts.TABS["pixels"], id="pixels"):
            gr.Markdown(texts.PIXELS_INTRO)
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


def build_demo(explorer: Explorer | None = None) -> gr.Blocks:
    """The page (:func:`build_layout`) and its events: the refresh policy (:data:`REFRESH`), then the actions."""
    ex = explorer or Explorer()
    query, table_views = query_fields(ex.state_type), views(ex.state_type)  # the explorer's view, as ex shows it
    knob_fields = knob_names(ex.state_type().query)
    with gr.Blocks(title="ConvNN Explorer", delete_cache=(limits.FILE_SWEEP_S, limits.FILE_MAX_AGE_S)) as demo:
        ui = build_layout(ex)
        ui["demo"] = demo
        wired = functools.partial(wire, ex, ui, state_type=ex.state_type, read=READ_OPENED)

        # The slow views run in their own concurrency group, one at a time over all sessions, so that clicks and
        # predictions never wait behind them; the page sends at most one of each (always_last), the server admits
        # one per session and a few in all (Admission). A change of what a slow view reads drops the session's run
        # of it on the server: a new model, image, fit or layer in the slow_reset step that ends its chain (no
        # request of its own), a new method or class beside it; so does Cancel. A dropped run's event ends with no
        # change to the page, and its computation still holds its place until it ends (SlowRuns).
        runs = SlowRuns(limits.SLOW_CONCURRENCY, functools.partial(queued_events, demo, limits.SLOW_GROUP))

        openings = server.Openings()

        def view_step(view: str) -> dict:
            """The event keywords of the view named ``view`` (:func:`views`): the model read as READ_OPENED says, an
            opening's answer recorded and a stale one dropped as OPENS and STALE_AFTER say."""
            step = wire(ex, ui, *table_views[view], state_type=ex.state_type,
                        read=None if view in READS_THE_LIST else READ_OPENED)
            if view in OPENS or view in STALE_AFTER:
                step["fn"] = openings.wrap(step["fn"], OPENS.get(view), STALE_AFTER.get(view, ()))
            return step

        def of_the_model(fn):
            """A later step ``fn`` of a chain, reading the model and its layer as the page holds them when the step
            is sent: a model opened meanwhile (its own chain on its way) comes with the layer of the model before,
            and the step then changes nothing, with no message (a layer the user got wrong is said by the chain's
            first step)."""
            @functools.wraps(fn)
            def step(values, request, *rest):
                try:
                    mine = ex.has_layer(values[ui[READ_OPENED["checkpoint"]]], values[ui["layer"]], request)
                except gr.Error:  # a model that cannot be opened (an upload's, gone): said once, where it was opened
                    mine = False
                return fn(values, request, *rest) if mine else gr.skip()
            return step

        def later_step(view: str) -> dict:
            """:func:`view_step`, for a later step of a chain."""
            step = view_step(view)
            if view == "slow_reset":  # the slow views' results no longer apply: nor do their runs
                step["fn"] = runs.dropping(SLOW_VIEWS, step["fn"])
            elif {"checkpoint", "layer"} <= set(table_views[view][1]) and "layer" not in table_views[view][2]:
                step["fn"] = of_the_model(step["fn"])  # (a step that picks the layer reads it as a hint)
            return step

        def run(views: list[str], event):
            """``event.then`` the views in turn, consecutive ones in one step where none reads what another writes
            (``server.step_groups``; those of :data:`ALONE` in steps of their own): private steps (the API is the
            ``gr.api`` endpoints below), each the last of quick changes (always_last, as the chain's first step);
            the last step's event."""
            read = {view: (fn, [name if view in READS_THE_LIST else READ_OPENED.get(name, name) for name in inputs],
                           outputs) for view, (fn, inputs, outputs) in table_views.items()}  # as view_step reads
            for group in server.step_groups(views, read, alone=ALONE):
                step = later_step(group[0]) if len(group) == 1 else server.merge([later_step(v) for v in group])
                event = event.then(**step, trigger_mode="always_last", api_visibility="private")
            return event

        knobs = [ui[name] for name in knob_fields]
        opens = ui["checkpoint"].value is not None  # else the page's load has no model to show (texts.NO_MODEL)
        for (source, trigger), chain in refresh_table(ex.state_type).items():
            if source == "demo" and not opens:
                continue
            first, *rest = chain
            step = view_step(first)
            js = CHAIN_JS.get((source, trigger))
            if js and "{at}" in js:  # a step's inputs are a set, sent in the order of their components' ids
                js = js.format(at=sorted(block._id for block in step["inputs"]).index(ui[source]._id))
            event = getattr(ui[source], trigger)(**step, trigger_mode="always_last", api_visibility="private", js=js)
            drawn = run(rest, event)
            if source in SHOWS_TAB:  # a link or a lesson's step that opens a tab shows it, once its views are drawn
                drawn.success(None, ui["focus_rule"], None, js=SHOWS_TAB[source], api_visibility="private")
            if (source, trigger) in OWN_PICKS:
                event.success(**wired(*table_views[OWN_PICKS[source, trigger]]), api_visibility="private")
            if source == "layer":  # a refused layer (a name typed in part) goes back to the one the explorer shows
                event.failure(None, None, ui["layer"], js=texts.RESTORE_LAYER_JS, api_visibility="private")
            if source == "checkpoint_files":  # a refused pair is emptied too, so that the next one is two files
                event.failure(lambda: None, None, ui["checkpoint_files"], api_visibility="private")
            if source == "image_upload":  # a refused photo: the examples stay usable, without an "Error" mark over
                #                           them (its toast says why)
                event.failure(lambda: (gr.skip(), gr.skip()), None, [ui["image_file"], ui["examples"]],
                              api_visibility="private")
            if source in RESTORED:  # a refused model (a name typed in the list) or compare mode's depth goes back
                #                     to the one shown, and what the first step sets (the model's card, layers,
                #                     head and draw; the columns' layers) stays as it was, without an "Error" mark
                #                     (its toast says why)
                shown, restore = RESTORED[source]
                event.failure(None, ui[shown], ui[source], js=restore, api_visibility="private")
                kept = [ui[name] for name in table_views[first][2]]
                skips = (gr.skip(),) * len(kept)
                event.failure(lambda skips=skips: skips, None, kept, api_visibility="private")
            if source in knob_fields:  # a refused knob value goes back to the one the table shown was made from
                event.failure(None, knobs, knobs, js=texts.RESTORE_KNOBS_JS, api_visibility="private")
            if source == "layer" or source in knob_fields:  # and the table shown, still valid, loses the "Error"
                #                                                mark of the refusal (its toast says why)
                event.failure(lambda: gr.skip(), None, ui["explorer"], api_visibility="private")
                # kept also when the table did not change (R = 5 where auto gives 5), else a later refusal of
                # another knob put R back to 0
                event.success(None, knobs, None, js=texts.KEEP_KNOBS_JS, api_visibility="private")
        ui["explorer"].change(None, knobs, None, js=texts.KEEP_KNOBS_JS, api_visibility="private")
        ui["compare"].change(None, ui["compare_depth"], None, js=texts.KEEP_DEPTH_JS, api_visibility="private")

        # Actions: what the user asks for. A click in the explorer runs nothing on the server; the page's views ask
        # by their named events (app_components): for a K above the table's bound the explorer asks for the clicked
        # query's row (explorer.row), ▶ α for the frames of the α animation (explorer.sweep), and the multi-hop view
        # for a query's field its table does not hold (hop_view.field).
        ui["explorer"].row(**wired("on_table_row", [n for n in query if n not in ("row_px", "col_px")],
                                   ["explorer"]), api_visibility="private")
        ui["explorer"].sweep(**wired("on_sweep", query, ["explorer"]), api_visibility="private")
        ui["hop_view"].field(**wired("on_hops_row", ["checkpoint", "image_file", "fit", "layer", "hops", "head",
                                                     "draw"], ["hop_view"]), api_visibility="private")
        for tab in ui["tabs"].children:  # the open tab, for a link (compare mode's keeps it in on_compare_open)
            if tab is not ui["compare_tab"]:
                tab.select(functools.partial(lambda key: key, tab.id), None, ui["tab"], api_visibility="private")
        link_shown = [ui["link"], ui["link_note"]]  # cleared once the view moves on, in the page (a click stays
        #                                             answered with no request), and an answer come since dropped
        link_copy = ui["link_button"].click(**wired("on_link_copy", [*query, "tab", "compare_models", "compare_depth"],
                                                         ["link", "link_note"]),
                                            js=texts.ASK_LINK_JS, api_visibility="private")
        link_copy.success(None, link_shown, link_shown, js=texts.COPY_LINK_JS, api_visibility="private")
        ui["explorer"].view(None, link_shown, link_shown, js=texts.CLEAR_LINK_JS, api_visibility="private")
        # The visitor's own moves only: a link that opens a tab or compare mode sets them too, in the same update as
        # its note, which a change event would read before it lands and write back empty
        # (a depth typed or dragged is an input; its release, on Enter or a blur, is none: clicking "Copy a link" right
        # after typing one released it while the link was asked for, and the answer was dropped as a move's)
        gr.on([ui["tabs"].select, ui["compare_models"].input, ui["compare_depth"].input], None, link_shown, link_shown,
              js=texts.CLEAR_LINK_JS, api_visibility="private")
        ui["export_button"].click(**wired("on_export", query, ["exports", "neighbors_data"]),
                                  api_visibility="private")
        pixel_click = ui["pixel_image"].select(ex.on_pixel_click, ui["image_file"],
                                               [ui["pixel_row"], ui["pixel_col"]], api_visibility="private")
        run(["pixels"], pixel_click)

        slow = dict(concurrency_id=limits.SLOW_GROUP, concurrency_limit=limits.SLOW_CONCURRENCY,
                    trigger_mode="always_last", api_visibility="private")

        def slow_view(button: str, fn_name: str, inputs: list[str], outputs: list[str]) -> None:
            """``button`` runs the slow view, its progress shown on its chart only (on its note too, Gradio's
            progress text covered the note's words)."""
            event = wired(fn_name, inputs, outputs)
            unchanged = {ui[name]: gr.skip() for name in outputs} if len(outputs) > 1 else gr.skip()
            chart = [ui[name] for name in outputs if isinstance(ui[name], gr.Plot)]
            clicked = ui[button].click(**{**event, "fn": runs.wrap(event["fn"], dropped=unchanged)},
                                       show_progress_on=chart, **slow)
            # a refusal (a class the model does not have) leaves the last result shown, without an "Error" mark
            clicked.failure(lambda: unchanged, None, [ui[name] for name in outputs], api_visibility="private")

        slow_view("attribution_button", "on_attribution", ["checkpoint", "image_file", "fit", "method", "target",
                                                           "draw"],
                  ["attribution_plot", "attribution_note"])
        slow_view("spectrum_models_button", "on_spectrum_models", ["image_file", "fit"], ["spectrum_models_plot"])
        slow_view("equivalence_button", "on_equivalence", ["checkpoint", "image_file", "fit", "layer", "draw"],
                  ["equivalence_text", "equivalence_plot"])
        drops = [gr.on([ui["method"].change, ui["target"].change], runs.dropping(("on_attribution",)), None,
                       api_visibility="private")]
        cancel = wired("on_attribution_cancel", [], ["attribution_plot", "attribution_note"])
        drops.append(ui["attribution_cancel"].click(
            **{**cancel, "fn": runs.dropping(("on_attribution",), cancel["fn"], True)}, api_visibility="private"))

        # The documented API: plain values in and out, for gradio_client and scripts.
        for name in API:
            gr.api(endpoint(getattr(ex, f"api_{name}"), ex.state_type), api_name=name)
        for name in SLOW_API:
            gr.api(runs.wrap(endpoint(getattr(ex, f"api_{name}"), ex.state_type)), api_name=name,
                   concurrency_id=limits.SLOW_GROUP, concurrency_limit=limits.SLOW_CONCURRENCY)
    demo.queue(max_size=limits.MAX_QUEUED_EVENTS, default_concurrency_limit=limits.FAST_CONCURRENCY)
    Admission(demo, limits.SLOW_GROUP, limits.MAX_SLOW_WAITING, dropped=runs.was_dropped,
              max_waiting_at_address=limits.MAX_SLOW_WAITING_PER_ADDRESS)
    server.FairTurns(demo, limits.MAX_WAITING_PER_VISITOR, limits.MAX_WAITING_PER_ADDRESS,
                     always=drops)  # a Cancel gets in whatever its visitor has waiting
    server.ComputeShares(max(1, (os.cpu_count() or 1) // torch.get_num_threads())).attach(demo)
    return demo


def import_plugins(modules: list[str]) -> None:
    """Import each of ``modules`` (dotted names, found from the current folder too) before the explorer is built, so
    that the models and selection rules they register (``convnn.models.registry.register_model``,
    ``convnn.selection.register_rule``) open in it: ``python app.py --import mymodels --checkpoints runs/``. Only the
    server's operator names them, on the command line; nothing a visitor sends is imported.

    Raises:
        ImportError: a module that cannot be imported (its own error, chained).
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        importlib.import_module(module)


def main() -> None:
    an.limit_malloc_arenas(limits.MALLOC_ARENAS)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    env_port = os.environ.get("PORT") or os.environ.get("GRADIO_SERVER_PORT") or limits.DEFAULT_PORT
    parser.add_argument("--port", type=int, default=int(env_port), help="port to listen on (default: $PORT or 7860)")
    parser.add_argument("--host", default=limits.DEFAULT_HOST,
                        help=f"address to listen on: 0.0.0.0 serves every network of this machine, e.g. a classroom's "
                             f"(default: {limits.DEFAULT_HOST}, this machine only)")
    env_proxies = [proxy for proxy in os.environ.get("CONVNN_TRUSTED_PROXIES", "").split(",") if proxy.strip()]
    parser.add_argument("--trusted-proxy", action="append", metavar="ADDRESS",
                        help="a reverse proxy (address or network, e.g. 10.0.0.5 or 10.0.0.0/24) whose "
                             "X-Forwarded-For names the visitor's address; repeat for several (default: "
                             "$CONVNN_TRUSTED_PROXIES, comma-separated, else none)")
    parser.add_argument("--checkpoints", type=Path, default=CHECKPOINT_DIR,
                        help="folder of checkpoints to list (*.json cards + *.safetensors; default: checkpoints/)")
    env_cache = os.environ.get("CONVNN_CACHE_MB") or an.DEFAULT_CACHE_BYTES // 2**20
    parser.add_argument("--cache-mb", type=int, default=int(env_cache),
                        help="bytes all analysis caches may hold together, in MB (default: $CONVNN_CACHE_MB or 512)")
    parser.add_argument("--max-upload-mb", type=int, default=limits.MAX_UPLOAD_MB,
                        help=f"largest uploaded file (checkpoint or image), MB (default: {limits.MAX_UPLOAD_MB})")
    parser.add_argument("--threads", type=int, default=limits.VIEW_THREADS,
                        help=f"torch threads per computation: 1 lets the cores serve several visitors at once, "
                             f"more make one user's views faster on many cores (default: {limits.VIEW_THREADS})")
    parser.add_argument("--import", dest="plugins", action="append", default=[], metavar="MODULE",
                        help="a Python module to import first, which registers your models or selection rules (found "
                             "from this folder too); repeat for several")
    parser.add_argument("--mcp", action="store_true",
                        help="also serve the API as MCP tools at /gradio_api/mcp/ (Gradio's MCP server)")
    args = parser.parse_args()
    if args.max_upload_mb < 1:
        parser.error("--max-upload-mb must be at least 1")
    if not 1 <= args.threads <= (os.cpu_count() or 1):
        parser.error(f"--threads must be between 1 and this machine's {os.cpu_count() or 1} cores")
    try:
        proxies = trusted_networks(env_proxies if args.trusted_proxy is None else args.trusted_proxy)
    except ValueError as err:
        parser.error(str(err))
    problem = listen_problem(args.host, args.port)  # one line, not Gradio's traceback naming its own option
    if problem is not None:
        sys.exit(problem)
    an.set_cache_budget(args.cache_mb * 2**20)
    torch.set_num_threads(args.threads)
    try:
        import_plugins(args.plugins)
    except ImportError as err:
        parser.error(f"--import: {err}")
    explorer = Explorer(args.checkpoints, max_upload_mb=args.max_upload_mb)
    for line in explorer.left_out():  # the page says so too, under the model list
        logging.warning("left out of the model list: %s", line)
    launch(build_demo(explorer), args.port, workspace=explorer.workspace, max_upload_mb=args.max_upload_mb,
           mcp_schema=explorer.tool_schema() if args.mcp else None, host=args.host, trusted_proxies=proxies)


if __name__ == "__main__":
    main()
