"""The old "probe" names of a layer info (analysis.session.renamed), kept for one release: each warns with its new
name and gives what the new name gives."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import pkgutil
import warnings

import numpy as np
import pytest
import torch

import analysis
from analysis import LoadedModel, RuleOptions, model_input, model_view, query_neighbors, receptive_fields
from analysis.rendering import export, overlay, page
from analysis.session import selections, traces
from analysis.session.renamed import RenamedAttribute, renamed_keywords
from analysis.views import neighbors, spectrum

LAYER = "stages.1.0.conv1"  # a hybrid of cnn-l0.5: 16×16, K=9


def same(a: object, b: object) -> bool:
    """Equal, looking into dataclasses, containers, tensors and arrays (a NaN equals a NaN)."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a is b or a == b


@pytest.fixture(scope="module")
def loaded(load_small) -> LoadedModel:
    return load_small("cnn-l0.5")


def test_the_old_attribute_probes_warns_and_is_layer_infos(loaded):
    with pytest.warns(DeprecationWarning, match=r"LoadedModel\.probes is renamed LoadedModel\.layer_infos"):
        old = loaded.probes
    assert old is loaded.layer_infos


def test_the_old_method_probe_warns_and_looks_up_the_same_layer_info(loaded):
    with pytest.warns(DeprecationWarning, match=r"LoadedModel\.probe is renamed LoadedModel\.layer_info"):
        old = loaded.probe(LAYER)
    assert old is loaded.layer_info(LAYER)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=r"is not a layer of cnn-l0\.5"):
        loaded.probe("stem")


def test_the_old_property_first_probe_warns_and_is_first_layer_info(loaded):
    with pytest.warns(DeprecationWarning, match=r"LoadedModel\.first_probe is renamed LoadedModel\.first_layer_info"):
        old = loaded.first_probe
    assert old is loaded.first_layer_info is not None


def test_the_old_constructor_keyword_probes_warns_and_builds_the_same_model(loaded):
    with pytest.warns(DeprecationWarning, match=r"LoadedModel\(probes=…\) is renamed LoadedModel\(layer_infos=…\)"):
        old = LoadedModel(loaded.model, loaded.card, probes=loaded.layer_infos, device=loaded.device)
    assert old.layer_infos is loaded.layer_infos and old.model is loaded.model
    with pytest.raises(TypeError, match="got both probes= and layer_infos="):
        LoadedModel(loaded.model, loaded.card, probes=(), layer_infos=())


def test_the_old_function_probe_module_warns_and_is_layer_module():
    with pytest.warns(DeprecationWarning, match=r"traces\.probe_module is renamed [a-z.]*traces\.layer_module"):
        from analysis.session.traces import probe_module
    assert probe_module is traces.layer_module
    with pytest.raises(AttributeError, match="has no attribute 'probe_modules'"):
        traces.probe_modules  # noqa: B018 (a name never defined stays an AttributeError)


def test_the_old_keyword_probes_of_run_trace_warns_and_records_the_same_pass(loaded, image):
    x = model_input(image, loaded.card)
    new = traces.run_trace(loaded.model, layer_infos=loaded.layer_infos, x=x)
    with pytest.warns(DeprecationWarning, match=r"run_trace\(probes=…\) is renamed run_trace\(layer_infos=…\)"):
        old = traces.run_trace(loaded.model, probes=loaded.layer_infos, x=x)
    assert same(old, new)


def _calls(loaded, image) -> dict:
    """For each public function taking a layer info: (its arguments but the layer info, its keyword arguments)."""
    layer_info = loaded.layer_info(LAYER)
    module = traces.layer_module(loaded.model, layer_info)
    options = selections.resolve_options(layer_info, RuleOptions())
    tables, overlaps = neighbors.rule_rows(loaded, image, layer_info, options, ("window", "all"), np.arange(3))
    result = query_neighbors(loaded, image, LAYER, (10, 20))
    fields = receptive_fields(loaded, image, LAYER, 2, 0, (17,))
    return {
        traces.layer_label: ((), {}),
        traces.layer_module: ((loaded.model,), {}),
        traces.query_cell: ((), {"row_px": 10, "col_px": 20}),
        traces.cell_rect_px: ((), {"row": 2, "col": 3}),
        traces.layer_conv: ((module,), {}),
        traces.knn_branch: ((module,), {}),
        traces.layer_query_key: ((module,), {"x": traces.trace_image(loaded, image).inputs[LAYER]}),
        selections.max_window_size: ((), {}),
        selections.resolve_options: ((), {"options": RuleOptions(num_neighbors=4)}),
        neighbors.rule_rows: ((loaded, image), {"options": options, "rules": ("window", "blend"),
                                                 "rows": np.array([0, 5])}),
        neighbors.query_row: ((), {"options": options, "query_px": (0, 2), "tables": tables, "overlaps": overlaps,
                                   "row": 1}),
        spectrum.fits_field_table: ((), {"queries": 3}),
        page.page_hops: ((model_view(image, 32), fields), {}),
        export.neighbor_notes: ((), {"options": options}),
        overlay.ranks_labelled: ((), {"num_neighbors": 9}),
        overlay.overlay_marks: ((), {"nset": result.sets["window"], "query_cell": result.query_cell}),
    }


def _public_functions_taking_a_layer_info() -> set:
    """Every function of a module's ``__all__`` in :mod:`analysis` with a ``layer_info`` parameter."""
    found = set()
    for info in pkgutil.walk_packages(analysis.__path__, "analysis."):
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            function = getattr(module, name)
            if inspect.isfunction(function) and "layer_info" in inspect.signature(function).parameters:
                found.add(function)
    return found


def test_every_public_function_taking_a_layer_info_is_called_here(loaded, image):
    assert set(_calls(loaded, image)) == _public_functions_taking_a_layer_info()


def test_the_old_keyword_probe_warns_and_gives_what_layer_info_gives(loaded, image):
    layer_info = loaded.layer_info(LAYER)
    for function, (args, kwargs) in _calls(loaded, image).items():
        new = function(*args, layer_info=layer_info, **kwargs)
        with pytest.warns(DeprecationWarning, match=rf"{function.__name__}\(probe=…\) is renamed "
                                                    rf"{function.__name__}\(layer_info=…\)"):
            old = function(*args, probe=layer_info, **kwargs)
        assert same(old, new), function.__name__
        with pytest.raises(TypeError, match="got both probe= and layer_info="):
            function(*args, probe=layer_info, layer_info=layer_info, **kwargs)


def test_the_new_names_never_warn_and_signatures_show_them(loaded, image):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for function, (args, kwargs) in _calls(loaded, image).items():
            function(*args, layer_info=loaded.layer_info(LAYER), **kwargs)
        assert loaded.layer_infos and loaded.first_layer_info
    assert "layer_info" in inspect.signature(traces.query_cell).parameters
    assert "layer_infos" in inspect.signature(LoadedModel).parameters


def test_the_helpers_point_the_warning_at_the_caller():
    @renamed_keywords(old="new")
    def function(new: int) -> int:
        return new

    class Holder:
        old = RenamedAttribute("new")
        new = 7

    with pytest.warns(DeprecationWarning) as caught:
        assert function(old=3) == 3 and Holder().old == 7
    assert [record.filename for record in caught] == [__file__, __file__]
    assert isinstance(Holder.old, RenamedAttribute)  # read on the class: the descriptor itself, no warning
