"""Every layer and rule in one graph (docs/method.md §9): ``torch.compile(fullgraph=True)`` matches eager, forward
and gradient, in eval and training mode; ``torch.export`` runs inference on new inputs; the fused kernel is a
registered operator that a compiled graph calls; ONNX of the reference path runs in onnxruntime on the shipped models.

CPU only: ``backend="aot_eager"`` (Dynamo + AOTAutograd, no code generation) for the whole matrix and one Inductor
case; the fused kernel's operator runs in Triton's interpreter (``TRITON_INTERPRET=1``, set by tests/conftest.py
without a GPU). The GPU check of the same (Inductor, the kernel compiled) is bench/train_step.py ``--compile``.
"""

from __future__ import annotations

import copy
import importlib
import os

import pytest
import torch

from convnn import ConvNN2d, ConvNNAttention, HybridConvNN2d, KVTAttention, create_model, load_checkpoint
from convnn.candidates import candidate_draw
from kernels.reference import select_topk
from tests.small_models import REPO_ROOT, SMALL_MODELS
from tests.tolerances import FP32_EXACT

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
IMAGE = (2, 4, 6, 6)
TOKENS = (2, 10, 8)
LAYERS = {  # name → (layer factory, input shape); softmax where q/k get a gradient
    "all": (lambda: ConvNN2d(4, 6, selection="all", weighting="softmax", qk_dim=3), IMAGE),
    "window": (lambda: ConvNN2d(4, 6, selection="window", weighting="softmax", num_neighbors=5), IMAGE),
    "window-conv": (lambda: ConvNN2d(4, 6, selection="window"), IMAGE),
    "random": (lambda: ConvNN2d(4, 6, selection="random", num_candidates=12, candidate_sampling="sample"), IMAGE),
    "blend": (lambda: ConvNN2d(4, 6, selection="blend", blend_alpha=0.5, stride=2), IMAGE),
    "hybrid": (lambda: HybridConvNN2d(4, 6, branch_ratio=0.5, selection="all", num_neighbors=5), IMAGE),
    "attention": (lambda: ConvNNAttention(8, 2, num_neighbors=4), TOKENS),
    "attention-random": (lambda: ConvNNAttention(8, 2, num_neighbors=4, selection="random", num_candidates=6),
                         TOKENS),
    "kvt": (lambda: KVTAttention(8, 2, num_neighbors=4, weighting="uniform"), TOKENS),
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from an empty cache: Dynamo's recompile limit (8 graphs per code object) counts every
    layer compiled in the process, so the tests of one pytest worker would reach it together."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _run(module, x):
    """Output and the gradients of a fixed loss w.r.t. the parameters and the input."""
    x = x.detach().clone().requires_grad_()
    out = module(x)
    out.square().sum().backward()
    grads = [p.grad.clone() for p in module.parameters()] + [x.grad]
    module.zero_grad(set_to_none=True)
    return out.detach(), grads


def _assert_same(got, expected):
    (out, grads), (out_e, grads_e) = got, expected
    torch.testing.assert_close(out, out_e, **FP32_EXACT)
    assert len(grads) == len(grads_e)
    for g, g_e in zip(grads, grads_e, strict=True):
        torch.testing.assert_close(g, g_e, **FP32_EXACT)


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_compiled_layer_matches_eager_with_its_gradient(name, mode):
    """Planted defects this catches: the tie check's ``.any()`` back in ``select_topk`` (fullgraph raises), a
    compiled training draw from torch's global generator instead of the layer's own stream."""
    factory, shape = LAYERS[name]
    torch.manual_seed(0)
    layer = factory()
    getattr(layer, mode)()
    twin = copy.deepcopy(layer)  # its own copy of the training stream, at the same state
    compiled = torch.compile(twin, fullgraph=True, backend="aot_eager")
    for step in range(2):  # the second step: a training stream moves on, in the graph as in eager
        x = torch.randn(shape, generator=torch.Generator().manual_seed(step))
        _assert_same(_run(compiled, x), _run(layer, x))


def test_inductor_compiles_a_layer_to_the_eager_result():
    """One Inductor (code-generating) case on the CPU: the ``all`` rule with learned q/k and softmax, gradient
    included."""
    torch.manual_seed(0)
    layer = ConvNN2d(4, 6, selection="all", weighting="softmax", qk_dim=3, num_neighbors=5)
    compiled = torch.compile(copy.deepcopy(layer), fullgraph=True, backend="inductor")
    x = torch.randn(IMAGE)
    _assert_same(_run(compiled, x), _run(layer, x))


def test_select_topk_in_a_graph_breaks_ties_as_a_stable_sort():
    """Integer scores tie everywhere, across the K-th place too; with the query forced first. Planted defect: the
    tied slots not refilled with the lowest-index keys (the order then follows torch.topk)."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(-3, 3, (4, 30, 40), generator=gen).float()
    scores[0, :, 5:] = -torch.inf  # rows with fewer finite candidates than K
    self_index = torch.randint(0, 40, (30,), generator=gen)
    compiled = torch.compile(select_topk, fullgraph=True, backend="aot_eager", dynamic=False)
    for k in (1, 7, 12):
        expected = scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]
        assert torch.equal(compiled(scores, k)[1], expected)
        forced = scores.clone()
        forced[:, torch.arange(30), self_index] = torch.inf
        expected = forced.sort(dim=-1, descending=True, stable=True).indices[..., :k]
        top_scores, idx = compiled(scores, k, self_index)
        assert torch.equal(idx, expected)
        assert torch.equal(top_scores, scores.gather(-1, idx))  # the query's real score


# The random CNN with one random layer per resolution, its two down blocks (32 and 16 px): SMALL_MODELS' eight
# layers (a residual block per stage too) took 2-4× as long to compile and to export, the same graph eight times.
MODELS = {**SMALL_MODELS,
          "cnn-random": ("convnn_resnet_cifar", dict(SMALL_MODELS["cnn-random"][1], depths=[0, 0, 0])),
          "vit-random": ("convnn_vit_cifar", dict(SMALL_MODELS["vit-convnn"][1], selection="random",
                                                  num_candidates=12))}


def _random_model(name: str):
    model_name, args = MODELS[name]
    torch.manual_seed(0)
    return create_model(model_name, **args).eval()


@pytest.mark.parametrize("name", ["cnn-random", "vit-random"])
def test_a_compiled_random_model_draws_what_eager_draws_for_every_draw_index(name):
    """The keys come from the model input inside the graph, and the draw index is guarded. Planted defects: the
    model's hook not pushing the traced keys (each layer then keys on its own input), the draw index baked in at
    the first trace (draw 3 then answers as draw 0)."""
    model = _random_model(name)
    compiled = torch.compile(copy.deepcopy(model), fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        draw0 = model(x)
        torch.testing.assert_close(compiled(x), draw0, **FP32_EXACT)
        for draw in (3, torch.tensor([0, 5, 2])):
            with candidate_draw(draw):
                expected = model(x)
                torch.testing.assert_close(compiled(x), expected, **FP32_EXACT)
            assert not torch.allclose(expected[1], draw0[1])  # sample 1 drew otherwise: the draw index counts
        torch.testing.assert_close(compiled(x[2:]), draw0[2:], **FP32_EXACT)  # alone as in the batch


@pytest.mark.parametrize("name", list(LAYERS))
def test_exported_layer_runs_inference_on_new_inputs(name):
    """``torch.export`` of the eval layer, run on an input it was not traced with. Planted defect: a traced eval
    draw keyed on something other than the input (zeros): the random rules then draw other candidates than eager."""
    factory, shape = LAYERS[name]
    torch.manual_seed(0)
    layer = factory().eval()
    traced, fresh = (torch.randn(shape, generator=torch.Generator().manual_seed(s)) for s in (0, 1))
    exported = torch.export.export(layer, (traced,)).module()
    with torch.no_grad():
        torch.testing.assert_close(exported(fresh), layer(fresh), **FP32_EXACT)


@pytest.mark.parametrize("name", ["cnn-random", "vit-random", "vit-convnn"])
def test_exported_model_runs_inference_on_new_inputs(name):
    model = _random_model(name)
    traced, fresh = (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in (0, 1))
    exported = torch.export.export(model, (traced,)).module()
    with torch.no_grad():
        torch.testing.assert_close(exported(fresh), model(fresh), **FP32_EXACT)


def _aot_eager_noting_targets(targets: set):
    """A ``torch.compile`` backend: ``aot_eager``, after adding the call targets of the graph Dynamo captured (one,
    with fullgraph) to ``targets``."""
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        targets.update(node.target for node in gm.graph.nodes if node.op == "call_function")
        return aot_eager(gm, example_inputs)

    return backend


@pytest.mark.skipif(not INTERPRETER, reason="runs the fused kernel on CPU tensors in Triton's interpreter")
@pytest.mark.parametrize("name", ["all", "blend", "attention-random"])
def test_a_compiled_graph_calls_the_fused_kernel_as_one_operator(name):
    """backend="triton": the graph holds ``convnn::knn_fused`` (no break, no kernel traced into), and compiled
    matches eager in both modes with its gradient. Planted defect: the fused entry calling the autograd Function in
    a graph too (Dynamo then traces into the launch and the operator is not in the graph)."""
    factory, shape = LAYERS[name]
    torch.manual_seed(0)
    layer = factory()
    layer.backend = "triton"
    x = torch.randn(shape)
    for mode in ("eval", "train"):  # the graph each mode compiles is the one looked into (a separate capture
        getattr(layer, mode)()      # compiled the eval graph once more: a third of the test's time)
        targets: set = set()
        compiled = torch.compile(copy.deepcopy(layer), fullgraph=True, backend=_aot_eager_noting_targets(targets))
        _assert_same(_run(compiled, x), _run(layer, x))
        assert torch.ops.convnn.knn_fused.default in targets, mode


@pytest.mark.skipif(not INTERPRETER, reason="runs the fused kernel on CPU tensors in Triton's interpreter")
def test_the_fused_operators_pass_opcheck():
    """Schema, fake (meta) implementation, autograd registration and AOT dispatch of ``convnn::knn_fused`` for the
    standard, random-candidate and blend calls. Planted defect: a fake ``idx`` of the wrong dtype or shape."""
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 1, 20, 8, generator=gen).requires_grad_() for _ in range(2))
    v = torch.randn(2, 1, 20, 6, generator=gen).requires_grad_()
    weight = torch.randn(5, 6, 4, generator=gen).requires_grad_()
    bias = torch.randn(5, generator=gen).requires_grad_()
    candidates = torch.tensor([[1, 5, 7, 9, 11, 3], [0, 2, 4, 6, 8, 19]])
    calls = [(q, k, v, weight, bias, None, 4, "cosine", "softmax", 0.5, 1, True, None, 0.0),
             (q, k, v, weight, None, candidates, 4, "dot", "none", 1.0, 1, False, None, 0.0),
             (q, k, v, weight, bias, None, 4, "cosine", "uniform", 1.0, 1, True, [4, 5, 3], 0.5)]
    importlib.import_module("kernels.knn_triton.function")  # registers the operators: this test may run first
    for args in calls:
        torch.library.opcheck(torch.ops.convnn.knn_fused.default, args)


def test_training_draws_are_an_operator_of_the_layers_own_stream():
    """``convnn::stream_candidates`` draws what the layer's generator draws, advances it, and a deep copy draws from
    its own copy. Planted defect: the registry keyed so that a copy shares the original's stream."""
    layer = ConvNN2d(4, 6, selection="random", num_candidates=12, seed=7)
    twin = copy.deepcopy(layer)
    sampler, twin_sampler = layer._sampler, twin._sampler
    assert sampler.stream_id != twin_sampler.stream_id
    expected = torch.rand(1, 36, generator=torch.Generator().manual_seed(7)).topk(12, largest=False).indices
    first = torch.ops.convnn.stream_candidates(sampler.stream_id, 36, 12, 1)
    assert torch.equal(first, expected)
    assert not torch.equal(torch.ops.convnn.stream_candidates(sampler.stream_id, 36, 12, 1), first)  # moved on
    assert torch.equal(torch.ops.convnn.stream_candidates(twin_sampler.stream_id, 36, 12, 1), first)  # its own copy


SHIPPED = ["cnn-l0.5", "vit-convnn16"]


@pytest.mark.parametrize("name", SHIPPED)
def test_onnx_export_of_a_shipped_model_matches_pytorch_in_onnxruntime(name, tmp_path):
    """The reference path as ONNX (TopK, GatherElements, Conv, …) in onnxruntime, within 1e-4 of PyTorch on new
    inputs. Planted defect: the tie check's ``.any()`` back in ``select_topk`` (the export raises)."""
    pytest.importorskip("onnxscript")
    onnxruntime = pytest.importorskip("onnxruntime")
    model, _ = load_checkpoint(REPO_ROOT / "checkpoints" / name)
    model.eval()
    traced, fresh = (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(s)) for s in (0, 1))
    program = torch.onnx.export(model, (traced,), dynamo=True, verbose=False)
    program.save(tmp_path / "model.onnx")
    session = onnxruntime.InferenceSession(tmp_path / "model.onnx", providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: fresh.numpy()})[0]
    with torch.no_grad():
        expected = model(fresh)
    torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-4, atol=1e-4)
