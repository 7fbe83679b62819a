"""Analysis behind ConvNN Explorer: pure functions of (model, image, query, options) → arrays, dataclasses, figures.

Imports ``convnn`` and ``kernels``, never ``gradio``; only :mod:`analysis.figures` makes Plotly figures. Results
are cached per (model, image) in one store under one byte budget (:mod:`analysis.caching`), so repeated clicks are
lookups; the files users bring and take away live in a bounded :class:`Workspace` (:mod:`analysis.workspace`).
"""

from .attribution import ATTRIBUTION_METHODS, GRADIENT_NOTE, Attribution, attribution_map
from .caching import DEFAULT_CACHE_BYTES, cache_budget, cache_usage, set_cache_budget
from .checkpoints import (
    UPLOAD_PREFIX,
    LoadedModel,
    card_summary,
    checkpoint_card,
    compute_path,
    list_checkpoints,
    load_model,
    store_upload,
)
from .equivalence import Equivalence, attention_equivalence, conv_equivalence, equivalence_summary
from .export import export_query, neighbors_summary, neighbors_to_dict, overlay_png, query_record
from .images import (
    InputImage,
    clamp_px,
    display_factor,
    display_image,
    display_to_input_px,
    image_from_array,
    load_image,
    model_input,
    model_view,
)
from .mixing import BranchMix, branch_mix, mix_summary
from .multihop import ReceptiveField, receptive_field
from .neighbors import (
    RULES,
    NeighborSet,
    QueryNeighbors,
    RuleOptions,
    Selection,
    jaccard,
    max_window_size,
    query_neighbors,
    resolve_options,
    rule_selection,
)
from .pixels import PixelNeighbors, pixel_neighbors, pixel_view
from .probes import ProbeLayer, cell_rect_px, find_probe_layers, query_cell
from .spectrum import SpectrumRow, selection_spectrum
from .tracing import top_classes, trace_image
from .values import (
    MAX_MESSAGE_CHARS,
    MAX_SEED,
    OUT_OF_MEMORY_MESSAGE,
    click_position,
    is_out_of_memory,
    user_error_message,
    whole_number,
)
from .weights import AggregationKernel, Contributions, aggregation_kernel, neighbor_contributions
from .workspace import RequestSizeLimit, Workspace

__all__ = [
    "ATTRIBUTION_METHODS",
    "DEFAULT_CACHE_BYTES",
    "GRADIENT_NOTE",
    "MAX_MESSAGE_CHARS",
    "MAX_SEED",
    "OUT_OF_MEMORY_MESSAGE",
    "RULES",
    "UPLOAD_PREFIX",
    "AggregationKernel",
    "Attribution",
    "BranchMix",
    "Contributions",
    "Equivalence",
    "InputImage",
    "LoadedModel",
    "NeighborSet",
    "PixelNeighbors",
    "ProbeLayer",
    "QueryNeighbors",
    "ReceptiveField",
    "RequestSizeLimit",
    "RuleOptions",
    "Selection",
    "SpectrumRow",
    "Workspace",
    "aggregation_kernel",
    "attention_equivalence",
    "attribution_map",
    "branch_mix",
    "cache_budget",
    "cache_usage",
    "card_summary",
    "cell_rect_px",
    "checkpoint_card",
    "clamp_px",
    "click_position",
    "compute_path",
    "conv_equivalence",
    "display_factor",
    "display_image",
    "display_to_input_px",
    "equivalence_summary",
    "export_query",
    "find_probe_layers",
    "image_from_array",
    "is_out_of_memory",
    "jaccard",
    "list_checkpoints",
    "load_image",
    "load_model",
    "max_window_size",
    "mix_summary",
    "model_input",
    "model_view",
    "neighbor_contributions",
    "neighbors_summary",
    "neighbors_to_dict",
    "overlay_png",
    "pixel_neighbors",
    "pixel_view",
    "query_cell",
    "query_neighbors",
    "query_record",
    "receptive_field",
    "resolve_options",
    "rule_selection",
    "selection_spectrum",
    "set_cache_budget",
    "store_upload",
    "top_classes",
    "trace_image",
    "user_error_message",
    "whole_number",
]
