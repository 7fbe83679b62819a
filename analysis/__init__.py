"""Analysis behind ConvNN Explorer: pure functions of (model, image, query, options) → arrays, dataclasses, figures.

Three roles, one subpackage each, imported in this order (each only imports those before it):

* :mod:`analysis.session` — what a visit holds: the models (``models``) and images it opened (taken in within
  their limits by ``image_intake``, decoded by ``image_decode``, fitted to the model and shown by ``image_display``),
  one recorded forward pass per (model, image) (``traces``), every layer's selections under every rule
  (``selections``), the caches under one byte budget (``caching``), the files users bring and take away
  (``workspace``), the checks of what they type (``inputs``), the process's C heap (``memory``) and the old names
  kept for one release (``renamed``: a layer info was called a "probe");
* :mod:`analysis.views` — one module per view: ``neighbors``, ``weights`` (the aggregation kernel and the λ mix),
  ``spectrum`` (the conv ↔ attention spectrum and multi-hop), ``equivalence``, ``attribution``, ``pixels`` (the
  input-level view), ``draws`` (a random-candidate model's answer over its eval draws), none importing another,
  and ``table``, which gathers ``neighbors`` and ``weights`` for every query of a layer at once (what the page
  answers a click from);
* :mod:`analysis.rendering` — ``figures`` (Plotly) and ``export`` (JSON, Markdown, PNG), sharing one overlay
  drawer (``overlay``), and ``page`` (the neighbour table packed for the explorer page).

Imports ``convnn``, never ``kernels`` or ``gradio``.
"""

from convnn.introspect import compute_path

from .rendering.export import (
    blend_window_note,
    export_query,
    neighbor_notes,
    neighbors_summary,
    neighbors_to_dict,
    overlay_png,
    query_record,
)
from .rendering.page import page_hops, page_json, page_sweep, page_table
from .session.caching import DEFAULT_CACHE_BYTES, cache_budget, cache_usage, set_cache_budget
from .session.image_decode import InputImage
from .session.image_display import (
    FITS,
    LETTERBOX_RGB,
    clamp_px,
    display_factor,
    display_image,
    display_to_input_px,
    fit_image,
    model_input,
    model_view,
)
from .session.image_intake import image_from_array, load_image
from .session.inputs import (
    MAX_MESSAGE_CHARS,
    MAX_SEED,
    OUT_OF_MEMORY_MESSAGE,
    click_position,
    is_out_of_memory,
    real_number,
    user_error_message,
    whole_number,
)
from .session.links import (
    LESSON_END,
    LESSON_UNKNOWN,
    LINK_FIELDS,
    LINK_TOO_LONG,
    MAX_LINK_BYTES,
    LessonStep,
    OpenedLink,
    echo,
    fit_to_model,
    lesson_step,
    link_fields,
    link_query,
    open_link,
    parse_link,
    write_link,
)
from .session.memory import limit_malloc_arenas, trim_heap
from .session.models import (
    UPLOAD_PREFIX,
    CheckpointList,
    LoadedModel,
    card_summary,
    checkpoint_card,
    list_checkpoints,
    load_model,
    store_upload,
)
from .session.selections import (
    RuleOptions,
    Selection,
    jaccard,
    max_window_size,
    resolve_options,
    rule_selection,
    rule_title,
)
from .session.state import (
    MAX_COMPARED,
    MAX_DRAW,
    Query,
    Setting,
    ViewState,
    check_number,
    compare_list,
    field_values,
    knob_names,
    settings,
)
from .session.traces import LayerInfo, cell_rect_px, layer_label, query_cell, top_classes, trace_image
from .session.workspace import Workspace, claim_run_dir
from .views.attribution import (
    ATTRIBUTION_METHODS,
    GRADIENT_NOTE,
    Attribution,
    attribution_map,
    attribution_passes,
    reporting_passes,
)
from .views.compare import compare_neighbors, layer_at_depth, map_pixel
from .views.draws import SPREAD_DRAWS, DrawSpread, draw_spread
from .views.equivalence import (
    Equivalence,
    attention_equivalence,
    conv_equivalence,
    depthwise_equivalence,
    equivalence_summary,
    equivalences,
)
from .views.neighbors import NeighborSet, QueryNeighbors, RuleTable, query_neighbors
from .views.pixels import PixelNeighbors, pixel_neighbors, pixel_view
from .views.spectrum import (
    MAX_FIELD_TABLE,
    ReceptiveField,
    ReceptiveFields,
    SpectrumRow,
    fits_field_table,
    receptive_field,
    receptive_fields,
    selection_spectrum,
)
from .views.table import (
    MAX_TABLE_NEIGHBORS,
    SWEEP_STEPS,
    BlendSweep,
    NeighborTable,
    blend_sweep,
    neighbor_table,
    page_rules,
)
from .views.weights import (
    AggregationKernel,
    BranchMix,
    Contributions,
    aggregation_kernel,
    branch_mix,
    contribution_norms,
    mix_summary,
    neighbor_contributions,
)

__all__ = [
    "ATTRIBUTION_METHODS",
    "DEFAULT_CACHE_BYTES",
    "FITS",
    "GRADIENT_NOTE",
    "LESSON_END",
    "LESSON_UNKNOWN",
    "LETTERBOX_RGB",
    "LINK_FIELDS",
    "LINK_TOO_LONG",
    "MAX_COMPARED",
    "MAX_DRAW",
    "MAX_FIELD_TABLE",
    "MAX_LINK_BYTES",
    "MAX_MESSAGE_CHARS",
    "MAX_SEED",
    "MAX_TABLE_NEIGHBORS",
    "OUT_OF_MEMORY_MESSAGE",
    "SPREAD_DRAWS",
    "SWEEP_STEPS",
    "UPLOAD_PREFIX",
    "AggregationKernel",
    "Attribution",
    "BlendSweep",
    "BranchMix",
    "CheckpointList",
    "Contributions",
    "DrawSpread",
    "Equivalence",
    "InputImage",
    "LayerInfo",
    "LessonStep",
    "LoadedModel",
    "NeighborSet",
    "NeighborTable",
    "OpenedLink",
    "PixelNeighbors",
    "Query",
    "QueryNeighbors",
    "ReceptiveField",
    "ReceptiveFields",
    "RuleOptions",
    "RuleTable",
    "Selection",
    "Setting",
    "SpectrumRow",
    "ViewState",
    "Workspace",
    "aggregation_kernel",
    "attention_equivalence",
    "attribution_map",
    "attribution_passes",
    "blend_sweep",
    "blend_window_note",
    "branch_mix",
    "cache_budget",
    "cache_usage",
    "card_summary",
    "cell_rect_px",
    "check_number",
    "checkpoint_card",
    "claim_run_dir",
    "clamp_px",
    "click_position",
    "compare_list",
    "compare_neighbors",
    "compute_path",
    "contribution_norms",
    "conv_equivalence",
    "depthwise_equivalence",
    "display_factor",
    "display_image",
    "display_to_input_px",
    "draw_spread",
    "echo",
    "equivalence_summary",
    "equivalences",
    "export_query",
    "field_values",
    "fit_image",
    "fit_to_model",
    "fits_field_table",
    "image_from_array",
    "is_out_of_memory",
    "jaccard",
    "knob_names",
    "layer_at_depth",
    "layer_label",
    "lesson_step",
    "limit_malloc_arenas",
    "link_fields",
    "link_query",
    "list_checkpoints",
    "load_image",
    "load_model",
    "map_pixel",
    "max_window_size",
    "mix_summary",
    "model_input",
    "model_view",
    "neighbor_contributions",
    "neighbor_notes",
    "neighbor_table",
    "neighbors_summary",
    "neighbors_to_dict",
    "open_link",
    "overlay_png",
    "page_hops",
    "page_json",
    "page_rules",
    "page_sweep",
    "page_table",
    "parse_link",
    "pixel_neighbors",
    "pixel_view",
    "query_cell",
    "query_neighbors",
    "query_record",
    "real_number",
    "receptive_field",
    "receptive_fields",
    "reporting_passes",
    "resolve_options",
    "rule_selection",
    "rule_title",
    "selection_spectrum",
    "set_cache_budget",
    "settings",
    "store_upload",
    "top_classes",
    "trace_image",
    "trim_heap",
    "user_error_message",
    "whole_number",
    "write_link",
]
