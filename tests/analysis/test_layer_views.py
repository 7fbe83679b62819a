"""Aggregation weights, λ mix, spectrum, multi-hop, equivalence and attribution on small models."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch

from analysis import (
    RuleOptions,
    aggregation_kernel,
    attention_equivalence,
    attribution_map,
    branch_mix,
    conv_equivalence,
    load_model,
    neighbor_contributions,
    receptive_field,
    receptive_fields,
    rule_selection,
    selection_spectrum,
    top_classes,
    trace_image,
)
from analysis.rendering import figures
from analysis.views import spectrum
from convnn import save_checkpoint
from tests.tolerances import FP32_EXACT

EQUIVALENCE_TOL = FP32_EXACT["atol"]  # METHOD §4: fp32 ≤ 1e-5


def test_kernel_summaries_match_the_weights(load_small):
    loaded = load_small("cnn-l0.5")
    layer_info = loaded.layer_infos[3]
    weight = loaded.model.get_submodule(layer_info.name).knn.weight.detach().numpy()  # (8, 16, 9)
    kernel = aggregation_kernel(loaded, layer_info.name)
    assert kernel.kernel.shape == (8, 9) and not kernel.signed
    np.testing.assert_allclose(kernel.kernel, np.linalg.norm(weight, axis=1), rtol=1e-6)
    np.testing.assert_allclose(kernel.slot_norms, np.sqrt((weight**2).sum(axis=(0, 1))), rtol=1e-6)
    vit = load_small("vit-convnn")
    assert aggregation_kernel(vit, "blocks.0.attn").signed
    with pytest.raises(ValueError, match="no rank-slot kernel"):
        aggregation_kernel(load_small("vit-mhsa"), "blocks.0.attn")


def test_long_chart_titles_wrap_to_lines_a_phone_shows_whole(load_small):
    """Plotly does not wrap a title: the weights tab's ran off a 390-px phone ("… ConvNN branch Con"), and at 44
    characters a line still did ("How much does the t-th neighbour matte")."""
    kernel = aggregation_kernel(load_small("cnn-l0.5"), "stages.1.0.conv2")
    for figure in figures.kernel_figures(kernel):
        text = figure.layout.title.text
        lines = text.split("<br>")
        assert all(len(line) <= 36 for line in lines) and len(lines) >= 2
        assert figure.layout.margin.t == 30 + 20 * len(lines)
    heat, bars = figures.kernel_figures(kernel)
    assert heat.layout.title.text.replace("<br>", " ") == f"Aggregation kernel: {kernel.description}"
    assert bars.layout.title.text == "How much does the t-th neighbour<br>matter? ‖W[:,:,t]‖"  # 32 + 18 chars
    assert figures.wrapped_title("short") == ("short", 50)


@pytest.mark.parametrize(("name", "layer", "head"), [("cnn-l0.5", "stages.1.0.conv2", 0),
                                                     ("cnn-random", "stages.0.0.conv1", 0),
                                                     ("vit-convnn", "blocks.1.attn", 1)])
def test_contributions_plus_bias_equal_the_layer_output(load_small, image, name, layer, head):
    contributions = neighbor_contributions(load_small(name), image, layer, (13, 7), head)
    np.testing.assert_allclose(contributions.vectors.sum(0) + contributions.bias, contributions.output, atol=1e-5)
    assert contributions.max_abs_residual < 1e-5
    np.testing.assert_allclose(contributions.norms, np.linalg.norm(contributions.vectors, axis=1), rtol=1e-5)


@pytest.mark.parametrize(("name", "module"), [("cnn-l0.5", "stages.1.0.conv2.knn"), ("vit-convnn", "blocks.1.attn")])
def test_clicks_and_heads_reuse_one_call_of_the_layer(load_small, fresh_image, name, module):
    """The layer's own output is computed once per (model, image, layer); a click only gathers its K terms."""
    loaded = load_small(name)
    layer = module.removesuffix(".knn")
    trace_image(loaded, fresh_image)  # the model's forward pass calls the layer too
    calls = []
    handle = loaded.model.get_submodule(module).register_forward_hook(lambda *_: calls.append(1))
    try:
        for query_px in [(13, 7), (2, 30)]:
            for head in range(loaded.layer_info(layer).num_heads):
                neighbor_contributions(loaded, fresh_image, layer, query_px, head)
    finally:
        handle.remove()
    assert len(calls) == 1


@pytest.mark.parametrize("head", [2, -1])
def test_a_head_outside_the_layer_is_refused_by_contributions_and_multihop(load_small, image, head):
    """vit-convnn has 2 heads: head 2 or −1 is refused with the range, never an IndexError or a silent clamp."""
    loaded = load_small("vit-convnn")
    message = rf"attention head must be from 0 to 1 for blocks.1.attn \(2 heads\), got {head}"
    with pytest.raises(ValueError, match=message):
        neighbor_contributions(loaded, image, "blocks.1.attn", (13, 7), head)
    with pytest.raises(ValueError, match=message):
        receptive_field(loaded, image, "blocks.1.attn", (13, 7), num_hops=2, head=head)


def test_multihop_and_contributions_take_whole_floats_and_refuse_the_rest(load_small, image):
    loaded = load_small("vit-convnn")
    as_float = receptive_field(loaded, image, "blocks.1.attn", (13, 7), num_hops=2.0, head=1.0)
    np.testing.assert_array_equal(as_float.hops, receptive_field(loaded, image, "blocks.1.attn", (13, 7), 2, 1).hops)
    for hops in (math.inf, 1.5):
        with pytest.raises(ValueError, match=f"num_hops must be a whole number, got {hops}"):
            receptive_field(loaded, image, "blocks.1.attn", (13, 7), num_hops=hops)
    with pytest.raises(ValueError, match="attention head must be a whole number, got nan"):
        neighbor_contributions(loaded, image, "blocks.1.attn", (13, 7), math.nan)


@pytest.fixture(params=["every query", "one query"])
def field_table(request, monkeypatch):
    """The receptive-field table bound as shipped (every query of a small layer in one table), or so small that
    :func:`receptive_field` follows its query alone."""
    if request.param == "one query":
        monkeypatch.setattr(spectrum, "MAX_FIELD_TABLE", 1024)
    return request.param


def test_multihop_follows_the_chosen_head(load_small, image, field_table):
    loaded = load_small("vit-convnn")
    fields = [receptive_field(loaded, image, "blocks.1.attn", (13, 7), num_hops=1, head=h).hops for h in (0, 1)]
    for head, hops in enumerate(fields):
        cells = rule_selection(loaded, image, "blocks.1.attn", "layer", RuleOptions(head=head)).cells[3 * 8 + 1]
        expected = {(int(r), int(c)) for r, c in cells if r >= 0} - {(3, 1)}  # the query's own cell is hop 0
        assert {(r // 4, c // 4) for r, c in zip(*np.nonzero(hops == 1), strict=True)} == expected


def test_branch_mix_shares(load_small, image):
    mix = branch_mix(load_small("cnn-l0.5"), image, "stages.1.0.conv1")
    assert (mix.knn_channels, mix.conv_channels, mix.share.shape) == (8, 8, (16, 16))
    np.testing.assert_allclose(mix.share, mix.knn_norm / (mix.knn_norm + mix.conv_norm), rtol=1e-5)
    conv_only = branch_mix(load_small("cnn-l0"), image, "stages.1.0.conv1")
    assert conv_only.knn_channels == 0 and np.all(conv_only.share == 0)
    with pytest.raises(ValueError, match="not a hybrid layer"):
        branch_mix(load_small("vit-convnn"), image, "blocks.0.attn")


def test_spectrum_of_a_convolution_is_fully_local(load_small, image):
    rows = selection_spectrum(load_small("cnn-l0"), image)
    assert [r.window_share for r in rows] == [1.0] * 8
    assert all(r.mean_distance == pytest.approx((4 + 4 * math.sqrt(2)) / 9) for r in rows)
    knn_rows = selection_spectrum(load_small("cnn-l0.5"), image)
    assert all(r.window_share < 1.0 for r in knn_rows)


def test_multihop_through_two_convolutions_grows_the_window(load_small, image, field_table):
    """Two 3×3 hops at 8×8 (4 px cells) from cell (4, 4): 3×3 cells = 12×12 px, then 5×5 cells = 20×20 px; and
    from the corner cell (0, 7) with zero padding: 2×2 cells, then 3×3 cells (the window's other cells are
    padding)."""
    field = receptive_field(load_small("cnn-l0"), image, "stages.2.0.conv2", (16, 16), num_hops=2)
    assert field.layers == ["stages.2.0.conv2", "stages.2.0.conv1"]
    assert field.pixel_counts == [16, 144, 400]
    assert (field.hops[8:28, 8:28] >= 0).all() and (field.hops[16:20, 16:20] == 0).all()
    corner = receptive_field(load_small("cnn-l0"), image, "stages.2.0.conv2", (1, 30), num_hops=2)
    assert corner.pixel_counts == [16, 64, 144]
    assert (corner.hops[0:12, 20:32] >= 0).all() and (corner.hops[0:4, 28:32] == 0).all()


def test_the_fields_of_more_queries_than_one_table_holds_are_refused_before_any_work(load_small, image,
                                                                                     monkeypatch):
    """An uploaded 504 px ViT (3,969 queries × 254,016 pixels) took over 7 GB for one multi-hop request: the fields
    of every query are now refused past MAX_FIELD_TABLE, before a selection is computed; one query's are not."""
    loaded = load_small("cnn-l0")
    monkeypatch.setattr(spectrum, "MAX_FIELD_TABLE", 2 * 32 * 32)
    monkeypatch.setattr(spectrum, "rule_selection", None)  # any selection computed would fail
    with pytest.raises(ValueError, match="the receptive fields of 64 queries on a 32×32 px input are more than the "
                                         "multi-hop view's 2,048 query-pixels"):
        receptive_fields(loaded, image, "stages.2.0.conv2", 2)
    with pytest.raises(ValueError, match=r"query cells must be from 0 to 63 for stages.2.0.conv2, got \[64\]"):
        receptive_fields(loaded, image, "stages.2.0.conv2", 2, 0, (64,))
    assert not spectrum.fits_field_table(loaded.layer_info("stages.2.0.conv2"))


def test_equivalence_demo_differences_are_zero(load_small, image):
    cnn = load_small("cnn-l0.5")
    assert conv_equivalence(cnn, image, "stages.1.0.conv1").max_abs_diff < EQUIVALENCE_TOL
    assert conv_equivalence(load_small("cnn-l0.5"), image, "stages.2.0.conv2").max_abs_output > 0
    assert attention_equivalence(cnn, image, "stages.2.0.conv1").max_abs_diff < EQUIVALENCE_TOL
    for vit in ("vit-convnn", "vit-mhsa"):
        assert attention_equivalence(load_small(vit), image, "blocks.1.attn").max_abs_diff < EQUIVALENCE_TOL


def test_the_equivalence_pictures_show_conv2d_and_a_zero_difference(load_small, image):
    """The reference picture is F.conv2d of the layer's input with its own conv branch (computed here); the
    difference map is ≤ 1e-5 at every cell, for the convolution and for attention with K = N."""
    import torch.nn.functional as F

    from analysis import equivalences, trace_image

    cnn = load_small("cnn-l0.5")
    conv, _, attention = equivalences(cnn, image, "stages.1.0.conv1")
    branch = cnn.model.get_submodule("stages.1.0.conv1").conv
    x = trace_image(cnn, image).inputs["stages.1.0.conv1"]
    expected = F.conv2d(x, branch.weight, branch.bias, padding=1)[0]  # (C, 16, 16)
    assert conv.channel == int(expected.flatten(1).std(1).argmax())
    np.testing.assert_allclose(conv.reference, expected[conv.channel].detach().numpy(), rtol=1e-5, atol=1e-6)
    for result in (conv, attention, *equivalences(load_small("vit-convnn"), image, "blocks.1.attn")):
        assert result.difference.max() <= 1e-5 and result.difference.shape == result.convnn.shape
    assert attention.convnn.shape == (16, 16)  # every pixel a token
    vit = equivalences(load_small("vit-convnn"), image, "blocks.1.attn")[0]
    assert vit.convnn.shape == (8, 8)  # the patch grid; CLS is in the max |difference|, not the picture
    figure = figures.equivalence_figure([conv, attention])
    assert len(figure.data) == 6 and figure.layout.annotations[2].text == "|difference|"
    for trace, result in ((figure.data[2], conv), (figure.data[5], attention)):  # |difference|: a scale from 0
        assert (trace.zmin, trace.zmax) == (0, max(float(result.difference.max()), 1e-12))


def test_the_convolution_demos_run_the_theorem_not_the_conv2d_shortcut(load_small, image, monkeypatch):
    """METHOD §4.1–4.2 through k-NN aggregation: the ConvNN side selects, gathers and applies the Conv1D (the layer's
    F.conv2d shortcut, window_kernel, never runs) and each result names both paths; the depthwise demo's reference
    is F.conv2d(groups=C) of the layer's input with the seeded weights, computed here. Defects it catches: the demo
    taking the shortcut, a depthwise demo that is not depthwise."""
    import torch
    import torch.nn.functional as F

    import convnn.layers.convnn2d as layer_module
    from analysis import depthwise_equivalence, equivalence_summary, equivalences, trace_image
    from analysis.views.equivalence import DEMO_SEED

    def no_shortcut(*args):
        raise AssertionError("the F.conv2d shortcut ran")

    monkeypatch.setattr(layer_module, "window_kernel", no_shortcut)
    cnn = load_small("cnn-l0.5")
    conv, depthwise, attention = equivalences(cnn, image, "stages.1.0.conv1")
    for result in (conv, depthwise):
        assert result.max_abs_diff < EQUIVALENCE_TOL and result.max_abs_output > 0
        assert result.convnn_path.startswith("window selection by spatial distance → gather → Conv1d over 9 rank")
        assert result.convnn_path.endswith("(reference path)")
    assert conv.reference_path == "F.conv2d" and depthwise.reference_path == "F.conv2d, groups=16"
    assert attention.reference_path == "F.scaled_dot_product_attention" and "softmax" in attention.convnn_path
    x = trace_image(cnn, image).inputs["stages.1.0.conv1"]  # (1, 16, 16, 16)
    generator = torch.Generator().manual_seed(DEMO_SEED)  # the demo's stand-in weights: N(0, 0.05²), weight first
    weight = torch.randn(16, 1, 3, 3, generator=generator) * 0.05
    bias = torch.randn(16, generator=generator) * 0.05
    expected = F.conv2d(x, weight, bias, padding=1, groups=16)[0]
    assert depthwise.channel == int(expected.flatten(1).std(1, correction=0).argmax())
    np.testing.assert_allclose(depthwise.reference, expected[depthwise.channel].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(depthwise.convnn, expected[depthwise.channel].numpy(), rtol=1e-5, atol=1e-5)
    assert depthwise_equivalence(cnn, image, "stages.1.0.conv1").description.startswith("Depthwise ConvNN2d")
    summary = equivalence_summary(cnn, image, "stages.1.0.conv1")
    assert summary.count("ConvNN side: window selection by spatial distance") == 2 and "reference: F.conv2d" in summary


@pytest.mark.parametrize("method", ["saliency", "integrated_gradients", "occlusion"])
def test_attribution_maps(load_small, image, method):
    loaded = load_small("vit-convnn")
    result = attribution_map(loaded, image, method)
    assert result.values.shape == (32, 32) and (result.values >= 0).all() and result.values.max() > 0
    assert result.target == next(iter(top_classes(loaded, image)))


def test_occlusion_costs_64_passes_at_any_input_size_in_batches_the_model_can_hold(tmp_path, image, monkeypatch):
    """8 × 8 squares of ⌈S / 8⌉ px: at 64 px, 64 occluded passes (plus Captum's one unoccluded), not (64 / 4)² = 256;
    a model whose pass holds more activation values than a batch may runs fewer passes per batch."""
    import torch

    from analysis import load_model
    from analysis.views import attribution
    from convnn import ModelCard, create_model, save_checkpoint

    args = dict(widths=[8], depths=[1], branch_ratio=0.0, num_classes=3)
    card = ModelCard(name="wide", model="convnn_resnet_cifar", model_args=args, classes=["a", "b", "c"],
                     input_size=64, mean=[0.5] * 3, std=[0.25] * 3)
    save_checkpoint(create_model("convnn_resnet_cifar", **args).eval(), tmp_path / "wide", card)
    loaded = load_model(tmp_path / "wide.json")
    batches = []
    model = attribution._own_model(loaded)
    handle = model.register_forward_pre_hook(lambda _, args: batches.append(args[0].shape[0]))
    try:
        assert attribution.attribution_map(loaded, image, "occlusion").values.shape == (64, 64)
        assert sum(batches) == 64 + 1 and max(batches) == 16
        monkeypatch.setattr(attribution, "_BATCH_VALUES", 4 * model_cost_values(loaded))
        batches.clear()
        attribution._attribute(model, torch.zeros(1, 3, 64, 64), "occlusion", 0, attribution._batch_size(loaded))
        assert sum(batches) == 64 + 1 and max(batches) == 4
    finally:
        handle.remove()


def model_cost_values(loaded) -> int:
    """The activation values of one forward pass of ``loaded``, from its card (convnn.models.model_cost)."""
    from convnn.models import model_cost

    return model_cost(loaded.card.model, loaded.card.input_size, **loaded.card.model_args).activations


def test_attribution_rejects_unknown_classes_and_methods(load_small, image):
    loaded = load_small("vit-convnn")
    with pytest.raises(ValueError, match="not one of the model's classes"):
        attribution_map(loaded, image, "saliency", "unicorn")
    with pytest.raises(ValueError, match="method must be one of"):
        attribution_map(loaded, image, "lime")


def test_attribution_takes_a_class_as_typed(load_small, image):
    """A newcomer typed "Dog" and was refused: a class equal ignoring case and surrounding spaces is that class."""
    loaded = load_small("cnn-l0.5")
    typed, exact = (attribution_map(loaded, image, "saliency", name) for name in (" Dog ", "dog"))
    assert typed.target == "dog"
    np.testing.assert_array_equal(typed.values, exact.values)
    assert not np.array_equal(exact.values, attribution_map(loaded, image, "saliency", "cat").values)
    classes = ["Dog", *loaded.card.classes[1:]]  # "Dog" and "dog": typed "DOG" names neither
    twin = dataclasses.replace(loaded, card=dataclasses.replace(loaded.card, classes=classes))
    with pytest.raises(ValueError, match="not one of the model's classes"):
        attribution_map(twin, image, "saliency", "DOG")


def test_attention_without_biases_is_compared_with_sdpa_on_its_own_projections(image):
    """A bias-free attention (any researcher's, built in Python: no card needed) runs the equivalence demo with its
    own projections: ConvNN-attention with K = N equals SDPA to fp32 precision."""
    import torch
    from torch import nn

    from analysis import LoadedModel, attention_equivalence
    from convnn import ModelCard
    from convnn.introspect import convnn_layers

    class BiasFree(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Conv2d(3, 16, 4, stride=4)
            self.attn = nn.MultiheadAttention(16, 2, bias=False, batch_first=True)
            self.head = nn.Linear(16, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            tokens = self.embed(x).flatten(2).transpose(1, 2)
            return self.head(self.attn(tokens, tokens, tokens, need_weights=False)[0].mean(1))

    torch.manual_seed(0)
    model = BiasFree().eval()
    card = ModelCard(name="bias-free", model="mine", model_args={}, classes=["a", "b", "c"], input_size=32,
                     mean=[0.5] * 3, std=[0.25] * 3)
    loaded = LoadedModel(model, card, convnn_layers(model, 32), torch.device("cpu"))
    assert [layer_info.name for layer_info in loaded.layer_infos] == ["embed", "attn"]
    result = attention_equivalence(loaded, image, "attn")
    assert "the layer's own q, k, v" in result.description and result.max_abs_diff <= 1e-5


@pytest.mark.parametrize("method", ["saliency", "integrated_gradients", "occlusion"])
def test_an_attribution_reports_the_passes_it_makes(load_small, fresh_image, method):
    """Each batch of forward passes is reported as (passes made, passes in all); a cached answer reports none."""
    from analysis import attribution_passes, reporting_passes

    loaded, reports = load_small("vit-convnn"), []
    with reporting_passes(lambda done, total: reports.append((done, total))):
        attribution_map(loaded, fresh_image, method)
        total = attribution_passes(method)
        assert total == {"saliency": 1, "integrated_gradients": 16, "occlusion": 65}[method]
        assert reports[-1] == (total, total) and all(report[1] == total for report in reports)
        assert [done for done, _ in reports] == sorted({done for done, _ in reports})
        reports.clear()
        attribution_map(loaded, fresh_image, method)
    assert reports == []
    attribution_map(loaded, fresh_image, "occlusion" if method != "occlusion" else "saliency")  # outside: none
    assert reports == []


def test_every_view_of_an_image_refuses_numbers_that_are_not_finite_naming_the_model(load_small, fresh_image):
    """A card whose mean makes the mid-grey probe exactly 0 passes the load-time check, and on a real image its
    std (1e-40) makes the input inf: /predict and /table refused, 8 other views answered NaN-derived numbers."""
    import dataclasses

    from analysis import (
        LoadedModel,
        blend_sweep,
        compare_neighbors,
        contribution_norms,
        draw_spread,
        equivalences,
        neighbor_table,
    )

    small = load_small("cnn-l0.5")
    card = dataclasses.replace(small.card, name="overflowing", mean=(0.5, 0.5, 0.5), std=(1e-40, 1e-40, 1e-40))
    loaded = LoadedModel(small.model, card, small.layer_infos, small.device)
    layer = "stages.1.0.conv1"
    views = {
        "predict": lambda: top_classes(loaded, fresh_image),
        "table": lambda: neighbor_table(loaded, fresh_image, layer),
        "attribution": lambda: attribution_map(loaded, fresh_image, "saliency"),
        "mix": lambda: branch_mix(loaded, fresh_image, layer),
        "spectrum": lambda: selection_spectrum(loaded, fresh_image),
        "hops": lambda: receptive_fields(loaded, fresh_image, layer),
        "hop": lambda: receptive_field(loaded, fresh_image, layer, (3, 3)),
        "equivalence": lambda: equivalences(loaded, fresh_image, layer),
        "contributions": lambda: neighbor_contributions(loaded, fresh_image, layer, (3, 3)),
        "norms": lambda: contribution_norms(loaded, fresh_image, layer),
        "draws": lambda: draw_spread(loaded, fresh_image),
        "sweep": lambda: blend_sweep(loaded, fresh_image, layer),
        "compare": lambda: compare_neighbors([small, loaded], fresh_image, [layer, layer], (3, 3)),
    }
    for name, view in views.items():
        with pytest.raises(ValueError, match=r"^overflowing gives numbers that are not finite \(inf or NaN\) on this "
                                             r"image, in the normalised input"):
            view()
            pytest.fail(f"{name} answered")
    assert top_classes(small, fresh_image)  # the same weights with their own card answer


def test_a_weights_view_whose_norms_overflow_is_refused_naming_the_model(load_small, tmp_path):
    """A checkpoint whose ConvNN Conv1D weights are scaled by 1e20 loads (on a mid-grey image its forward pass stays
    finite), but the weights view drew inf for the layer's kernel and rank slots' norms."""
    small = load_small("cnn-l0.5")
    layer = "stages.2.0.conv1"
    model = copy.deepcopy(small.model)
    model.get_submodule(layer).knn.weight.data.mul_(1e20)  # ≈ 8e18 at most: finite, but their squares are not
    save_checkpoint(model, tmp_path / "scaled", dataclasses.replace(small.card, name="scaled"))
    loaded = load_model(tmp_path / "scaled.json")
    with pytest.raises(ValueError, match=r"^scaled gives numbers that are not finite \(inf or NaN\), in the "
                                         r"aggregation kernel of stages\.2\.0\.conv1: its weights overflow float32, "
                                         r"so its answers are refused$"):
        aggregation_kernel(loaded, layer)
    first = aggregation_kernel(loaded, "stages.0.0.conv1")  # the layers left as they were answer as before
    np.testing.assert_array_equal(first.kernel, aggregation_kernel(small, "stages.0.0.conv1").kernel)


def test_an_attribution_whose_own_passes_overflow_is_refused_naming_the_model(load_small, fresh_image):
    """The image's recorded pass is checked finite, but occlusion's 64 passes on the occluded image are the
    attribution's own: a model whose class scores overflow there drew an attribution of inf."""
    small = load_small("cnn-l0.5")
    model = copy.deepcopy(small.model)
    # the class scores are inf where the input holds the occluding value (0 in normalised space) anywhere
    model.register_forward_hook(lambda module, args, out: out + torch.where(
        (args[0] == 0).flatten(1).any(1), float("inf"), 0.0)[:, None])
    loaded = dataclasses.replace(small, model=model, card=dataclasses.replace(small.card, name="occluded"))
    assert top_classes(loaded, fresh_image) == top_classes(small, fresh_image)  # the image itself: finite
    np.testing.assert_array_equal(attribution_map(loaded, fresh_image, "saliency").values,
                                  attribution_map(small, fresh_image, "saliency").values)
    with pytest.raises(ValueError, match=r"^occluded gives numbers that are not finite \(inf or NaN\) on this "
                                         r"image, in the Occlusion attribution \(its passes on the occluded or scaled "
                                         r"image\): its weights or its card's mean/std overflow float32"):
        attribution_map(loaded, fresh_image, "occlusion")


def test_the_equivalence_demos_can_be_stopped_between_them(load_small, image):
    """A dropped equivalence demo computed to its end (it never looked at the drop check) and kept the slow views'
    one place meanwhile: ``between`` is called before each demo, and what it raises stops the rest."""
    from analysis import equivalences

    cnn = load_small("cnn-l0.5")
    calls = []

    def between():
        calls.append(len(calls))
        if len(calls) == 2:
            raise RuntimeError("dropped")

    with pytest.raises(RuntimeError, match="dropped"):
        equivalences(cnn, image, "stages.1.0.conv1", between=between)
    assert calls == [0, 1]  # the first demo computed, the second stopped before it started
    assert len(equivalences(cnn, image, "stages.1.0.conv1", between=calls.clear)) == 3  # conv, depthwise, attention


def test_an_attention_demo_past_its_memory_bound_is_left_out_and_the_summary_says_why(load_small, image,
                                                                                      monkeypatch):
    """K = N gathers every key's value for every query: on a large layer that was gigabytes (a 64 px model's first
    layer asked for 64 GB and failed). Past the bound the attention demo is not run; the convolution demos are, and
    the summary names the layer's N, its channels and the memory it would have held. Each head scores its own N·N
    pairs: a ViT's heads count (12 heads at 4,096 tokens took 9.4 GB where one head's estimate said 1.8)."""
    from analysis import equivalence_summary, equivalences, trace_image
    from analysis.views import equivalence

    cnn = load_small("cnn-l0.5")
    x = trace_image(cnn, image).inputs["stages.1.0.conv1"]  # (1, C, H, W): every pixel a token
    tokens, channels = x.shape[2] * x.shape[3], x.shape[1]
    need = 8 * tokens**2 * channels + 48 * tokens**2  # the gathered values and their weighted copy (fp32), and one
    #                                                    head's N·N scores, ranks and selections
    monkeypatch.setattr(equivalence, "ATTENTION_DEMO_MAX_BYTES", need)  # at the bound: run
    assert [r.reference_path for r in equivalences(cnn, image, "stages.1.0.conv1")][-1] == \
        "F.scaled_dot_product_attention"
    monkeypatch.setattr(equivalence, "ATTENTION_DEMO_MAX_BYTES", need - 1)
    results = equivalences(cnn, image, "stages.1.0.conv1")
    assert [r.reference_path for r in results] == ["F.conv2d", f"F.conv2d, groups={channels}"]
    summary = equivalence_summary(cnn, image, "stages.1.0.conv1", results=results)
    assert summary.endswith(f"The attention demo is left out on this layer: with K = N = {tokens} tokens of "
                            f"{channels} channels in 1 head it would hold {need / 2**30:.1f} GB (every query gathers "
                            f"every key's value), more than the {(need - 1) / 2**30:.0f} GB it may; a later layer "
                            "has fewer tokens.")


def test_the_attention_demo_s_memory_counts_every_head(load_small, image, monkeypatch):
    """On a ViT layer the estimate counts its heads (read from the layer's own attention, not assumed one): a bound
    just above one head's estimate leaves the demo out on vit-convnn's two heads, and the summary says 2 heads."""
    from analysis import equivalence_summary, equivalences, trace_image
    from analysis.views import equivalence

    vit = load_small("vit-convnn")
    tokens, dim = trace_image(vit, image).inputs["blocks.1.attn"].shape[1:]
    heads = vit.model.get_submodule("blocks.1.attn").num_heads
    assert heads == 2
    one, both = (8 * tokens**2 * dim + 48 * count * tokens**2 for count in (1, heads))
    monkeypatch.setattr(equivalence, "ATTENTION_DEMO_MAX_BYTES", both)
    assert len(equivalences(vit, image, "blocks.1.attn")) == 1  # the attention demo, run
    monkeypatch.setattr(equivalence, "ATTENTION_DEMO_MAX_BYTES", one)
    assert equivalences(vit, image, "blocks.1.attn") == []
    assert f"{dim} channels in 2 heads it would hold" in equivalence_summary(vit, image, "blocks.1.attn")
