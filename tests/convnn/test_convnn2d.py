"""ConvNN2d: the exact convolution special cases (METHOD §4.1–4.2), selection rules, the recorder, errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from convnn import ConvNN2d, record_neighbors
from convnn.functional import window_indices
from convnn.selection import SelectionOptions, selection_rule
from kernels import knn_aggregate
from kernels.reference import aggregate_neighbors
from tests.tolerances import FP32_EXACT, FP64_EXACT


@pytest.mark.parametrize("window_size", [1, 3, 5])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("size", [(7, 9), (5, 5), (1, 11), (6, 1)])
def test_window_selection_with_k_equal_r_squared_is_conv2d(window_size, bias, size):
    """METHOD §4.1: window selection, K = R², zero padding R//2, raster order, weights copied ⇒ F.conv2d (fp32).
    With ρ = "none" the layer runs F.conv2d itself (the shortcut); its gather path: the test below."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, *size)
    conv = nn.Conv2d(4, 6, window_size, padding=window_size // 2, bias=bias)
    knn = ConvNN2d(4, 6, num_neighbors=window_size**2, selection="window", window_size=window_size, bias=bias)
    knn.load_conv2d_weight(conv)
    torch.testing.assert_close(knn(x), F.conv2d(x, conv.weight, conv.bias, padding=window_size // 2), **FP32_EXACT)


@pytest.mark.parametrize("window_size", [3, 5])
def test_depthwise_window_selection_is_depthwise_conv2d(window_size):
    """METHOD §4.2: the same with groups = C ⇒ F.conv2d(groups=C)."""
    torch.manual_seed(1)
    x = torch.randn(3, 5, 6, 7)
    conv = nn.Conv2d(5, 5, window_size, padding=window_size // 2, groups=5)
    knn = ConvNN2d(5, 5, num_neighbors=window_size**2, selection="window", window_size=window_size, groups=5)
    knn.load_conv2d_weight(conv)
    torch.testing.assert_close(knn(x), conv(x), **FP32_EXACT)


@pytest.mark.parametrize("window_size, groups", [(3, 1), (5, 2), (1, 1)])
def test_the_window_rules_gather_path_with_k_equal_r_squared_is_conv2d(window_size, groups):
    """METHOD §4.1 without the F.conv2d shortcut, in fp64: the window rule's K = R² cells (its own selection),
    gathered from the zero-padded map and aggregated by a Conv1D over rank slots written out here, equal F.conv2d
    with the same weights; so does the layer's own gather path, which it takes for any ρ but "none" (uniform
    weights, 1/K each, with its weights scaled by K)."""
    torch.manual_seed(8)
    x = torch.randn(2, 4, 6, 7, dtype=torch.float64)
    K, pad = window_size**2, window_size // 2
    conv = nn.Conv2d(4, 6, window_size, padding=pad, groups=groups).double()
    expected = F.conv2d(x, conv.weight, conv.bias, padding=pad, groups=groups)
    tokens = x.flatten(2).transpose(1, 2).unsqueeze(1)  # (B, 1, N, C)
    neighbors = selection_rule("window").select(tokens, tokens, (6, 7), SelectionOptions(K, window_size=window_size))
    assert neighbors.padding == pad
    cells = F.pad(x, (pad, pad, pad, pad)).flatten(2)  # (B, C, M)
    sequence = torch.stack([cells[b][:, neighbors.topk_idx[b, 0].flatten()] for b in range(2)])  # (B, C, N·K)
    gathered = F.conv1d(sequence, conv.weight.flatten(2), conv.bias, stride=K, groups=groups).view_as(expected)
    torch.testing.assert_close(gathered, expected, **FP64_EXACT)
    layer = ConvNN2d(4, 6, num_neighbors=K, selection="window", window_size=window_size, weighting="uniform",
                     groups=groups).double()
    layer.load_conv2d_weight(conv)
    with torch.no_grad():
        layer.weight.mul_(K)
    torch.testing.assert_close(layer(x), expected, **FP64_EXACT)


@pytest.mark.parametrize("groups, stride, dilation", [(1, 1, 1), (4, 1, 1), (1, 2, 1), (4, 2, 2)])
def test_without_the_conv_shortcut_window_selection_gathers_and_still_equals_conv2d(monkeypatch, groups, stride,
                                                                                   dilation):
    """METHOD §4.1–4.2 as the theorem states it: conv_shortcut=False with ρ = "none" selects, gathers and applies
    the Conv1D over rank slots (the F.conv2d shortcut's window_kernel is never called), and equals F.conv2d with
    the same weights, standard and depthwise, strided and dilated. Defect it catches: the flag ignored (the
    shortcut taken anyway), or the gather path wrong."""
    import convnn.layers.convnn2d as module

    torch.manual_seed(9)
    x = torch.randn(2, 4, 9, 8)
    conv = nn.Conv2d(4, 4, 3, stride=stride, padding=dilation, dilation=dilation, groups=groups)
    expected = F.conv2d(x, conv.weight, conv.bias, stride=stride, padding=dilation, dilation=dilation, groups=groups)
    layers = [ConvNN2d(4, 4, selection="window", kernel_size=3, stride=stride, padding=dilation, dilation=dilation,
                       groups=groups, conv_shortcut=shortcut) for shortcut in (False, True)]
    for layer in layers:
        layer.load_conv2d_weight(conv)

    def no_shortcut(*args):
        raise AssertionError("the F.conv2d shortcut ran")

    monkeypatch.setattr(module, "window_kernel", no_shortcut)
    assert not layers[0].runs_as_conv2d() and layers[1].runs_as_conv2d()
    with torch.no_grad():
        torch.testing.assert_close(layers[0](x), expected, **FP32_EXACT)
        with pytest.raises(AssertionError, match="shortcut ran"):
            layers[1](x)


def test_window_with_fewer_neighbors_takes_the_nearest_offsets_in_raster_order():
    """K = 5 in a 3×3 window: the centre and its 4-neighbourhood, in raster order (METHOD §2)."""
    idx = window_indices(4, 4, 3, 5)  # padded grid is 6 wide
    query = 1 * 4 + 2  # (row 1, col 2) → padded (2, 3)
    expected = [(1, 3), (2, 2), (2, 3), (2, 4), (3, 3)]
    assert idx[query].tolist() == [r * 6 + c for r, c in expected]


@pytest.mark.parametrize(("window_size", "num_neighbors", "groups"), [(3, 5, 1), (3, 1, 1), (5, 13, 2), (5, 21, 4)])
def test_window_selection_with_fewer_neighbors_is_the_gather_definition(window_size, num_neighbors, groups):
    """K < R²: output and gradients equal the definition written out here — gather the K window cells of the
    zero-padded map in raster order, then Conv1D over the rank slots (METHOD §2, §4.1)."""
    torch.manual_seed(3)
    x = torch.randn(2, 4, 6, 7, requires_grad=True)
    knn = ConvNN2d(4, 8, num_neighbors=num_neighbors, selection="window", window_size=window_size, groups=groups)
    out = knn(x)
    pad = window_size // 2
    padded = F.pad(x, (pad, pad, pad, pad))  # (B, C, H + 2p, W + 2p)
    cells = [(r, c) for r in range(window_size) for c in range(window_size)]
    taps = sorted(sorted(range(len(cells)), key=lambda t: ((cells[t][0] - pad) ** 2 + (cells[t][1] - pad) ** 2, t))
                  [:num_neighbors])
    shifted = torch.stack([padded[:, :, cells[t][0]:cells[t][0] + 6, cells[t][1]:cells[t][1] + 7] for t in taps], -1)
    sequence = shifted.flatten(2, 4)  # (B, C, N·K): query-major, rank slot minor
    expected = F.conv1d(sequence, knn.weight, knn.bias, stride=num_neighbors, groups=groups).view(2, 8, 6, 7)
    torch.testing.assert_close(out, expected, **FP32_EXACT)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, knn.weight, knn.bias), grad)
    want = torch.autograd.grad(expected, (x, knn.weight, knn.bias), grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **FP32_EXACT)


def test_all_selection_picks_the_most_cosine_similar_pixels_with_the_query_first():
    torch.manual_seed(2)
    x = torch.randn(2, 3, 5, 6)
    layer = ConvNN2d(3, 4, num_neighbors=7, selection="all")
    with record_neighbors(layer) as records:
        layer(x)
    idx = records[""][0].topk_idx  # (B, 1, N, K)
    tokens = x.flatten(2).transpose(1, 2)
    cosine = F.normalize(tokens, dim=-1) @ F.normalize(tokens, dim=-1).transpose(1, 2)  # (B, N, N)
    assert torch.equal(idx[..., 0], torch.arange(30).expand(2, 1, 30))
    chosen = cosine.gather(-1, idx[:, 0, :, 1:])
    unchosen = cosine.scatter(-1, idx[:, 0], -2.0)
    assert (chosen.amin(-1) >= unchosen.amax(-1)).all()


def test_random_selection_is_identical_for_the_same_seed_and_differs_for_another():
    torch.manual_seed(3)
    x = torch.randn(2, 4, 8, 8)
    outputs = {}
    for seed in (0, 0, 1):
        layer = ConvNN2d(4, 4, num_neighbors=5, selection="random", num_candidates=12, seed=seed)
        layer.weight.data.copy_(torch.arange(4 * 4 * 5, dtype=torch.float32).view(4, 4, 5).sin())
        layer.bias.data.zero_()
        with record_neighbors(layer) as records:
            outputs.setdefault(seed, []).append(layer.eval()(x))
        outputs[seed].append(records[""][0].candidates)
    first, second = outputs[0][0:2], outputs[0][2:4]
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not torch.equal(outputs[0][1], outputs[1][1])
    assert not torch.allclose(outputs[0][0], outputs[1][0])


def test_random_selection_in_eval_mode_repeats_and_in_training_mode_redraws():
    layer = ConvNN2d(3, 3, num_neighbors=4, selection="random", num_candidates=6, seed=5)
    x = torch.randn(1, 3, 6, 6)
    with record_neighbors(layer) as records:
        layer.train()(x)
        layer(x)
        layer.eval()(x)
        layer(x)
    draws = [r.candidates for r in records[""]]
    assert not torch.equal(draws[0], draws[1])
    assert torch.equal(draws[2], draws[3])


def test_random_selection_indices_are_the_query_or_its_candidates():
    layer = ConvNN2d(3, 3, num_neighbors=6, selection="random", num_candidates=10, candidate_sampling="sample")
    with record_neighbors(layer) as records:
        layer(torch.randn(3, 3, 7, 5))
    record = records[""][0]
    idx, cand = record.topk_idx[:, 0], record.candidates  # (B, N, K), (B, r)
    assert cand.shape == (3, 10)
    assert torch.equal(idx[..., 0], torch.arange(35).expand(3, 35))
    member = (idx[..., 1:, None] == cand[:, None, None, :]).any(-1)
    assert member.all()


def test_random_with_r_at_least_n_falls_back_to_all():
    """The shortcut: with r ≥ N the layer draws nothing and runs the all rule (the test below: the candidate path)."""
    torch.manual_seed(4)
    x = torch.randn(2, 3, 4, 4)
    exhaustive = ConvNN2d(3, 5, num_neighbors=9, selection="all")
    sampled = ConvNN2d(3, 5, num_neighbors=9, selection="random", num_candidates=16)
    sampled.load_state_dict(exhaustive.state_dict())
    torch.testing.assert_close(sampled(x), exhaustive(x), rtol=0, atol=0)


@pytest.mark.parametrize("weighting", ["none", "softmax"])
def test_the_candidate_path_with_every_token_sampled_is_the_all_rule(weighting):
    """METHOD §3 without the r ≥ N shortcut, in fp64: all N tokens passed as sampled candidates, in a shuffled order
    and per sample (the query is then a candidate twice: itself and its sampled copy, which is masked), select the
    all rule's neighbours in its order and aggregate to its output."""
    torch.manual_seed(9)
    B, N, C, K = 2, 30, 5, 7
    x = torch.randn(B, 1, N, C, dtype=torch.float64)
    weight = torch.randn(4, C, K, dtype=torch.float64)
    every = torch.stack([torch.randperm(N) for _ in range(B)])  # (B, r = N)
    options = dict(num_neighbors=K, weighting=weighting, self_first=True, backend="reference")
    sampled = knn_aggregate(x, x, x, weight, candidates=every, **options)
    exhaustive = knn_aggregate(x, x, x, weight, **options)
    assert torch.equal(sampled.topk_idx, exhaustive.topk_idx)
    torch.testing.assert_close(sampled.out, exhaustive.out, **FP64_EXACT)
    torch.testing.assert_close(sampled.topk_weights, exhaustive.topk_weights, **FP64_EXACT)


def test_recorder_returns_the_indices_the_layer_used():
    """Re-aggregating the recorded indices reproduces the layer's output bit for bit, and recording changes nothing."""
    torch.manual_seed(5)
    x = torch.randn(2, 4, 6, 6)
    layer = ConvNN2d(4, 8, num_neighbors=9, selection="all")
    plain = layer(x)
    with record_neighbors(layer) as records:
        recorded = layer(x)
    record = records[""][0]
    again = aggregate_neighbors(x.flatten(2).transpose(1, 2).unsqueeze(1), record.topk_idx, None, layer.weight,
                                layer.bias).view_as(plain)
    torch.testing.assert_close(recorded, plain, rtol=0, atol=0)
    torch.testing.assert_close(again, plain, rtol=0, atol=0)
    assert layer._records is None


@pytest.mark.parametrize("weighting", ["none", "softmax"])
@pytest.mark.parametrize("window_size", [3, 5])
def test_blend_at_alpha_zero_is_the_convolution_itself(window_size, weighting):
    """METHOD §3–4.1: blend with α = 0 is window selection, order included: with a conv's weights it equals
    F.conv2d (under "none"), and the window layer under any weighting."""
    torch.manual_seed(6)
    x = torch.randn(2, 3, 6, 7)
    K = window_size**2
    conv = nn.Conv2d(3, 4, window_size, padding=window_size // 2)
    blend, window = (ConvNN2d(3, 4, num_neighbors=K, selection=selection, window_size=window_size, blend_alpha=0.0,
                              weighting=weighting) for selection in ("blend", "window"))
    for layer in (blend, window):
        layer.load_conv2d_weight(conv)
    torch.testing.assert_close(blend(x), window(x), rtol=0, atol=0)
    if weighting == "none":
        torch.testing.assert_close(blend(x), conv(x), **FP32_EXACT)


@pytest.mark.parametrize("weighting", ["none", "softmax"])
@pytest.mark.parametrize("num_neighbors", [4, 9])
def test_blend_at_alpha_one_is_the_all_rule_itself(num_neighbors, weighting):
    """METHOD §3: blend with α = 1 is exhaustive feature selection over the map's own tokens (no padding cell is a
    candidate), the query first: the same output as selection="all" with the same weights, and the same indices
    as a stable top-K of the cosine scores computed here."""
    torch.manual_seed(7)
    x = torch.randn(2, 3, 5, 6)
    blend = ConvNN2d(3, 4, num_neighbors=num_neighbors, selection="blend", blend_alpha=1.0, weighting=weighting)
    exhaustive = ConvNN2d(3, 4, num_neighbors=num_neighbors, selection="all", weighting=weighting)
    exhaustive.load_state_dict(blend.state_dict())
    with record_neighbors(blend) as records:
        out = blend(x)
    torch.testing.assert_close(out, exhaustive(x), rtol=0, atol=0)
    tokens = x.flatten(2).transpose(1, 2).double()  # (B, N, C)
    cosine = torch.nn.functional.normalize(tokens, dim=-1) @ torch.nn.functional.normalize(tokens, dim=-1).mT
    cosine.diagonal(dim1=1, dim2=2).fill_(math.inf)  # the query first
    expected = torch.sort(cosine, dim=-1, descending=True, stable=True).indices[..., :num_neighbors]
    assert torch.equal(records[""][0].topk_idx[:, 0], expected)


@pytest.mark.parametrize("weighting", ["none", "uniform"])
def test_learned_query_key_projections_need_softmax_weighting(weighting):
    """Top-K indices carry no gradient: without softmax weights q_proj and k_proj could never learn (and DDP
    stops on parameters that get no gradient)."""
    with pytest.raises(ValueError, match=f"qk_dim needs weighting='softmax'.*weighting='{weighting}'"):
        ConvNN2d(4, 4, qk_dim=8, weighting=weighting)
    layer = ConvNN2d(4, 4, qk_dim=8, weighting="softmax")
    layer(torch.randn(1, 4, 5, 5)).sum().backward()
    assert layer.q_proj.weight.grad.abs().sum() > 0 and layer.k_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("kwargs, message", [
    ({"num_neighbors": 10, "selection": "window"}, "num_neighbors"),
    ({"num_neighbors": 10, "selection": "blend", "blend_alpha": 0.0}, "num_neighbors"),
    ({"window_size": 4}, "window_size"),
    ({"selection": "random", "num_candidates": 4}, "num_candidates"),
    ({"selection": "random"}, "num_candidates"),
    ({"blend_alpha": 1.5, "selection": "blend"}, "blend_alpha"),
    ({"selection": "grid"}, "selection"),
    ({"similarity": "l1"}, "similarity"),
    ({"weighting": "max"}, "weighting"),
    ({"groups": 3}, "groups"),
    ({"temperature": 0.0}, "temperature"),
    ({"num_neighbors": 0}, "num_neighbors"),
    ({"coord_channels": "no"}, "coord_channels"),  # a card's string would read as True
    ({"bias": "false"}, "bias"),
    ({"candidate_padding": 1}, "candidate_padding"),
    ({"blend_alpha": True, "selection": "blend"}, "blend_alpha"),
])
def test_impossible_configurations_raise_value_errors_naming_the_argument(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ConvNN2d(4, 8, **kwargs)


@pytest.mark.parametrize("shape", [(4, 6, 6), (1, 3, 6, 6), (1, 4, 2, 6, 6)])
def test_wrong_input_shapes_raise(shape):
    with pytest.raises(ValueError, match="C_in=4"):
        ConvNN2d(4, 8)(torch.randn(shape))


def test_more_neighbors_than_pixels_raises():
    with pytest.raises(ValueError, match="num_neighbors"):
        ConvNN2d(4, 8, num_neighbors=9)(torch.randn(1, 4, 2, 2))


@pytest.mark.parametrize("kwargs, message", [
    ({"num_neighbors": 9.0}, "num_neighbors"),
    ({"window_size": 3.0, "selection": "window"}, "window_size"),
    ({"selection": "random", "num_candidates": 9.5}, "num_candidates"),
    ({"seed": 2**70}, "seed"),
    ({"temperature": float("nan")}, "temperature"),
])
def test_non_integer_and_out_of_range_arguments_name_themselves(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ConvNN2d(4, 4, **kwargs)


def test_integer_inputs_are_refused_rather_than_truncated():
    with pytest.raises(ValueError, match="floating-point"):
        ConvNN2d(4, 4, selection="window")(torch.randint(0, 5, (1, 4, 5, 5)))
