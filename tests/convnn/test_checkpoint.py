"""Checkpoints: bit-exact round trip, fp16 and int8 storage, and clear errors for broken files."""

import copy
import hashlib
import json
import os
import re
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from convnn import CheckpointError, ModelCard, budget, create_model, load_checkpoint, save_checkpoint
from convnn import checkpoint as checkpoint_module
from convnn.checkpoint import INT8_SCALE_SUFFIX
from convnn.presets import PRESETS
from tests.small_models import SMALL_MODELS

ARGS = {"widths": [8, 16], "depths": [1, 1], "branch_ratio": 0.5, "num_neighbors": 4}
# A ViT whose parameters are 98 % matrices (qkv, proj, MLP, patch embedding, position embedding): int8 halves it.
MATRIX_VIT_ARGS = {"dim": 64, "depth": 2, "num_heads": 2, "attention": "mhsa"}
INT8_MAX_SIZE_RATIO = 0.55  # int8 file / fp16 file: 0.5 for the matrices + fp16 vectors, scales, header (0.541)
INT8_LOGIT_TOL = 0.03  # max |logit change| / max |logit| after the int8 round trip (0.8 % measured for that ViT)


def _card() -> ModelCard:
    return ModelCard(name="m", model="convnn_resnet_cifar", model_args=ARGS, classes=[str(c) for c in range(10)],
                     input_size=32, mean=[0.5] * 3, std=[0.25] * 3, metrics={"test_top1": 12.5})


@pytest.fixture(scope="module")
def _saved_once(tmp_path_factory):
    """The model of :func:`saved`, its files and the global random state it leaves, made once per module: building,
    running and saving it was most of the time of each of the ~50 tests that take it."""
    torch.manual_seed(0)
    model = create_model("convnn_resnet_cifar", **ARGS)
    model(torch.randn(4, 3, 32, 32))  # move the BatchNorm statistics off their initial values
    path = tmp_path_factory.mktemp("saved") / "m"
    save_checkpoint(model, path, _card())
    return model, path, torch.get_rng_state()


@pytest.fixture
def saved(tmp_path, _saved_once):
    """A model and its checkpoint ``tmp_path / "m"`` (.json + .safetensors), the test's own to edit: a copy of the
    model and of the files :func:`_saved_once` wrote, with torch's global random state where making them left it."""
    model, source, rng_state = _saved_once
    for suffix in (".json", ".safetensors"):
        shutil.copyfile(source.with_suffix(suffix), (tmp_path / "m").with_suffix(suffix))
    torch.set_rng_state(rng_state)
    return copy.deepcopy(model), tmp_path / "m"


def test_save_then_load_round_trips_bit_exactly(saved):
    model, path = saved
    loaded, card = load_checkpoint(path.with_suffix(".json"))
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert card.metrics == {"test_top1": 12.5} and card.weights_sha256 and not loaded.training
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), model.eval()(x), rtol=0, atol=0)


def test_fp16_storage_loads_into_fp32_parameters(tmp_path):
    model = create_model("convnn_resnet_cifar", **ARGS)
    weights, _ = save_checkpoint(model, tmp_path / "h", _card(), dtype=torch.float16)
    loaded, card = load_checkpoint(weights)
    assert card.weights_dtype == "float16"
    for name, tensor in model.state_dict().items():
        assert loaded.state_dict()[name].dtype == tensor.dtype
        assert torch.equal(loaded.state_dict()[name], tensor.half().to(tensor.dtype)), name


def test_corrupt_weights_are_refused(saved):
    _, path = saved
    weights = path.with_suffix(".safetensors")
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(path)


def test_truncated_weights_without_a_checksum_are_refused(saved):
    _, path = saved
    card = json.loads(path.with_suffix(".json").read_text())
    card["weights_sha256"] = ""
    path.with_suffix(".json").write_text(json.dumps(card))
    path.with_suffix(".safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="safetensors"):
        load_checkpoint(path)


@pytest.mark.parametrize("edit, message", [
    (lambda card: card.pop("model"), "lacks"),
    (lambda card: card.update(model="no_such_model"), "no_such_model"),
    (lambda card: card.update(model_args={**ARGS, "widths": [8, 32]}), "do not fit"),
    (lambda card: card.update(surprise=1), "unknown fields"),
])
def test_inconsistent_cards_are_refused(saved, edit, message):
    _, path = saved
    card = json.loads(path.with_suffix(".json").read_text())
    edit(card)
    path.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def test_missing_or_non_json_files_are_refused(saved, tmp_path):
    _, path = saved
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "absent")
    path.with_suffix(".json").write_text("{broken")
    with pytest.raises(CheckpointError, match="JSON"):
        load_checkpoint(path)


def test_a_fifo_or_a_folder_is_refused_unread(saved, deadline):
    """A FIFO named ``x.json`` hung whatever read it (the app's startup): it is refused before it is opened."""
    _, path = saved
    deadline(30)
    for file in (path.with_suffix(".json"), path.with_suffix(".safetensors")):
        file.unlink()
        os.mkfifo(file)
        with pytest.raises(CheckpointError, match=re.escape(f"{file.name}: not a regular file")):
            load_checkpoint(path)
        with pytest.raises(CheckpointError, match=re.escape("x.json: not a regular file")):
            ModelCard.read(file, "x.json")
        file.unlink()
        file.mkdir()
        with pytest.raises(CheckpointError, match="not a regular file"):
            load_checkpoint(path)
        file.rmdir()
        save_checkpoint(saved[0], path, _card())


def test_a_card_holding_a_lone_surrogate_is_refused(saved):
    """JSON can escape a lone surrogate; a card name holding one broke every reply that carried it (an upload's,
    and the page's config: the app did not start)."""
    _, path = saved
    card = json.loads(path.with_suffix(".json").read_text())
    for edit in ({"name": "\ud800"}, {"classes": ["ok"] * 9 + ["a\udfffb"]}, {"recipe": {"\ud83d": 1}}):
        path.with_suffix(".json").write_text(json.dumps(card | edit))  # written escaped, as ASCII
        with pytest.raises(CheckpointError, match="text that is not valid Unicode"):
            ModelCard.read(path.with_suffix(".json"))


def test_the_weights_file_check_reads_only_the_header(saved):
    """check_weights_file refuses a half-written weights file (what a listing of a runs folder meets) from its
    header and size alone."""
    _, path = saved
    weights = path.with_suffix(".safetensors")
    checkpoint_module.check_weights_file(weights, "m.safetensors")  # a whole file passes
    data = weights.read_bytes()
    for broken in (data[:len(data) // 2], data + b"\0", data[:5]):
        weights.write_bytes(broken)
        with pytest.raises(CheckpointError, match=re.escape("m.safetensors: not a whole safetensors file")):
            checkpoint_module.check_weights_file(weights, "m.safetensors")


def test_deeply_nested_cards_are_checkpoint_errors(saved):
    """Too deep for the JSON parser (a RecursionError inside it), or parsed but deeper than any card needs."""
    _, path = saved
    card = json.loads(path.with_suffix(".json").read_text())
    path.with_suffix(".json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="not a readable JSON model card"):
        load_checkpoint(path)
    path.with_suffix(".json").write_text(json.dumps(card | {"recipe": {"x": json.loads("[" * 500 + "]" * 500)}}))
    with pytest.raises(CheckpointError, match="nests more than 16 levels"):
        load_checkpoint(path)


def test_a_card_larger_than_any_card_needs_is_refused_before_it_is_parsed(saved, monkeypatch):
    """An 18 MB card (6 M empty lists in its metrics) took 53 s and 2.4 GB to parse; the cap comes first."""
    _, path = saved
    card_path = path.with_suffix(".json")
    text = card_path.read_text()
    card_path.write_text(text + " " * (200 * 1024))  # valid JSON, under 256 KiB: loads
    assert load_checkpoint(path)[1].name == ModelCard.from_json(text).name
    card_path.write_text(text + " " * (300 * 1024))
    parsed = []
    monkeypatch.setattr(json, "loads", lambda *args, **kwargs: parsed.append(1))
    with pytest.raises(CheckpointError, match=r"the model card is 30\d KB, more than a card's 256 KB"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="more than a card's 256 KB"):
        ModelCard.from_json(text + " " * (300 * 1024))
    assert parsed == []


@pytest.mark.parametrize("field, value, message", [
    ("classes", ["a", "b", "c"], "classes"),
    ("classes", ["cat"] * 10, "classes"),
    ("metrics", [1], "metrics"),
    ("mean", "abc", "mean"),
    ("std", [0.0, 0.0, 0.0], "std"),
    ("mean", [0.5] * 4, "mean must be 3 finite numbers, one per RGB channel"),
    ("std", [0.25], "std must be 3 finite numbers, one per RGB channel"),
    ("input_size", "32", "input_size"),
    ("input_size", 100000, "input_size"),
    ("model_args", [1], "model_args"),
    ("weights_dtype", "int4", "weights_dtype must be one of"),
    ("weights_dtype", None, "weights_dtype must be one of"),
    ("weights_sha256", 123, "weights_sha256 must be"),
    ("weights_sha256", "abc", "weights_sha256 must be"),
    ("format_version", True, "format_version must be the integer 1"),
    ("format_version", 1.0, "format_version must be the integer 1"),
    ("model_args", {"num_classes": "10"}, r"model_args.num_classes must be a positive integer, got '10'"),
    ("model_args", {"num_classes": True}, r"model_args.num_classes must be a positive integer, got True"),
])
def test_card_fields_of_the_wrong_type_or_range_are_refused(saved, field, value, message):
    _, path = saved
    card = json.loads(path.with_suffix(".json").read_text())
    card[field] = value
    if field == "classes":
        card["model_args"]["num_classes"] = 10
    path.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


def test_weights_that_do_not_fit_give_a_short_message_without_the_folder(saved):
    _, path = saved
    card = json.loads(path.with_suffix(".json").read_text())
    card["model_args"]["widths"] = [8, 32]
    path.with_suffix(".json").write_text(json.dumps(card))
    with pytest.raises(CheckpointError, match="mis-shaped") as info:
        load_checkpoint(path)
    assert str(path.parent) not in str(info.value) and len(str(info.value)) < 300


def _small_model(name: str) -> tuple[torch.nn.Module, ModelCard]:
    """A random-init model of tests/small_models.py (with one all-zero output channel) and its card."""
    model_name, args = SMALL_MODELS[name]
    torch.manual_seed(0)
    model = create_model(model_name, **args).eval()
    with torch.no_grad():
        model.head.weight[3] = 0  # an all-zero slice: scale 1, stored as exact zeros
    card = ModelCard(name=name, model=model_name, model_args=args, classes=[str(c) for c in range(10)],
                     input_size=32, mean=[0.5] * 3, std=[0.25] * 3)
    return model, card


@pytest.mark.parametrize("name", ["cnn-l0.5", "vit-mhsa"])
def test_int8_storage_rounds_each_weight_to_within_half_its_channel_scale(name, tmp_path):
    """ndim ≥ 2: q = round(w / scale), scale = max|w[o]| / 127, so |q · scale - w| ≤ scale / 2 exactly (float64);
    ndim < 2 floating tensors in fp16, integer buffers unchanged; loading gives fp32(q · scale)."""
    model, card = _small_model(name)
    weights, _ = save_checkpoint(model, tmp_path / name, card, dtype=torch.int8)
    stored, (loaded, loaded_card) = load_file(weights), load_checkpoint(weights)
    assert loaded_card.weights_dtype == "int8"
    for key, tensor in model.state_dict().items():
        if tensor.is_floating_point() and tensor.dim() >= 2:
            q, scale = stored[key], stored[key + INT8_SCALE_SUFFIX]
            assert q.dtype == torch.int8 and q.shape == tensor.shape and scale.shape == tensor.shape[:1], key
            channel_max = q.flatten(1).abs().amax(1)
            assert torch.equal(channel_max, torch.where(tensor.flatten(1).abs().amax(1) > 0, 127, 0).to(torch.int8))
            scale = scale.double().view(-1, *[1] * (tensor.dim() - 1))
            dequantized = q.double() * scale  # exact: 8-bit times 24-bit significands
            assert ((dequantized - tensor.double()).abs() <= scale / 2).all(), key
            assert torch.equal(loaded.state_dict()[key], dequantized.float()), key
        elif tensor.is_floating_point():
            assert stored[key].dtype == torch.float16, key
            assert torch.equal(loaded.state_dict()[key], tensor.half().float()), key
        else:
            assert torch.equal(stored[key], tensor) and torch.equal(loaded.state_dict()[key], tensor), key
    assert not loaded.head.weight[3].any()


def test_int8_storage_halves_the_file_and_keeps_the_outputs(tmp_path):
    torch.manual_seed(0)
    model = create_model("convnn_vit_cifar", **MATRIX_VIT_ARGS).eval()
    card = ModelCard(name="v", model="convnn_vit_cifar", model_args=MATRIX_VIT_ARGS,
                     classes=[str(c) for c in range(10)], input_size=32, mean=[0.5] * 3, std=[0.25] * 3)
    half, _ = save_checkpoint(model, tmp_path / "half", card, dtype=torch.float16)
    int8, _ = save_checkpoint(model, tmp_path / "int8", card, dtype=torch.int8)
    assert int8.stat().st_size <= INT8_MAX_SIZE_RATIO * half.stat().st_size
    loaded, _ = load_checkpoint(int8)
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, actual = model(x), loaded(x)
    torch.testing.assert_close(actual, expected, rtol=0, atol=INT8_LOGIT_TOL * expected.abs().max().item())


def _drop_scale(state: dict) -> None:
    del state["head.weight" + INT8_SCALE_SUFFIX]


def _misshape_scale(state: dict) -> None:
    state["head.weight" + INT8_SCALE_SUFFIX] = state["head.weight" + INT8_SCALE_SUFFIX][:-1].clone()


def _orphan_scale(state: dict) -> None:
    state["head.bias" + INT8_SCALE_SUFFIX] = torch.ones(10)


def _unquantize(state: dict) -> None:
    state["head.weight"] = state["head.weight"].half()
    del state["head.weight" + INT8_SCALE_SUFFIX]


def _rewrite_int8(tmp_path, edit, card_dtype: str = "int8"):
    """An int8 checkpoint whose weights file ``edit`` rewrote, its card carrying the new sha256; the weights path."""
    model, card = _small_model("vit-mhsa")
    weights, card_path = save_checkpoint(model, tmp_path / "q", card, dtype=torch.int8)
    state = load_file(weights)
    edit(state)
    save_file(state, str(weights))
    card_json = json.loads(card_path.read_text())
    card_json.update(weights_dtype=card_dtype, weights_sha256=hashlib.sha256(weights.read_bytes()).hexdigest())
    card_path.write_text(json.dumps(card_json))
    return weights


@pytest.mark.parametrize("edit, card_dtype, message", [
    (_drop_scale, "int8", "1 int8 tensors without a scale"),
    (_misshape_scale, "int8", "scales not of shape"),
    (_orphan_scale, "int8", "scales without an int8 tensor"),
    (_unquantize, "int8", "not stored as int8"),
    (lambda state: None, "float16", "card says weights_dtype='float16'"),
])
def test_int8_files_that_do_not_match_their_card_are_refused(edit, card_dtype, message, tmp_path):
    """A rewritten weights file whose card carries its new sha256: only the int8 checks can catch the mismatch."""
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(_rewrite_int8(tmp_path, edit, card_dtype))


@pytest.mark.parametrize("scale, message", [
    (float("nan"), r"q.safetensors: .* 1 scales not finite and > 0 \(e.g. head.weight\)"),
    (float("inf"), r"1 scales not finite and > 0 \(e.g. head.weight\)"),
    (0.0, r"1 scales not finite and > 0 \(e.g. head.weight\)"),
    (-0.01, r"1 scales not finite and > 0 \(e.g. head.weight\)"),
    (1e300, r"q.safetensors: 1 tensors hold an inf or NaN once loaded \(e.g. head.weight, stored as torch.int8\)"),
])
def test_int8_scales_that_are_not_finite_and_positive_are_refused(scale, message, tmp_path):
    def corrupt(state: dict) -> None:
        key = "head.weight" + INT8_SCALE_SUFFIX
        state[key] = torch.full_like(state[key], scale, dtype=torch.float64)

    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(_rewrite_int8(tmp_path, corrupt))


def test_a_mis_shaped_int8_tensor_is_refused_before_it_is_dequantized(tmp_path, monkeypatch):
    """A large upload of the wrong shape must not cost a float64 copy: the shape check comes first."""
    def large(state: dict) -> None:
        state["head.weight"] = torch.ones(10, 100_000, dtype=torch.int8)

    weights = _rewrite_int8(tmp_path, large)

    def never(*args, **kwargs):
        raise AssertionError("dequantize ran before the shapes were checked")

    monkeypatch.setattr(checkpoint_module, "dequantize", never)
    with pytest.raises(CheckpointError, match=r"1 mis-shaped \(e.g. head.weight\)"):
        load_checkpoint(weights)


FLOAT32_MAX = torch.finfo(torch.float32).max
NOT_FINITE = r"1 tensors of the model hold an inf or NaN \(e.g. {}\): not saved"
WOULD_NOT_LOAD = (r"not saved, as load_checkpoint would refuse it: bad.safetensors: 1 tensors hold an inf or NaN once "
                  r"loaded \(e.g. {}, stored as torch.{}")


@pytest.mark.parametrize("dtype, tensor, value, message", [
    (torch.int32, None, None, "dtype must be None or one of"),
    (torch.float64, None, None, "dtype must be None or one of"),
    (torch.int8, "head.weight", float("nan"), NOT_FINITE.format("head.weight")),
    (torch.int8, "head.weight", float("inf"), NOT_FINITE.format("head.weight")),
    (torch.int8, "head.bias", float("nan"), NOT_FINITE.format("head.bias")),
    (None, "head.bias", float("inf"), NOT_FINITE.format("head.bias")),  # kept as it is, the loader would refuse it
    (torch.bfloat16, "head.weight", float("inf"), NOT_FINITE.format("head.weight")),
    (torch.float32, "head.bias", float("nan"), NOT_FINITE.format("head.bias")),
    # finite in the model, not once stored: ndim < 2 in fp16 (also with int8), ±max|w| · 127 / 127 past fp32
    (torch.int8, "head.bias", 1e6, WOULD_NOT_LOAD.format("head.bias", "float16") + r", which ends at ±65504\)"),
    (torch.float16, "norm.weight", -1e6, WOULD_NOT_LOAD.format("norm.weight", "float16")),
    (torch.int8, "head.weight", FLOAT32_MAX, WOULD_NOT_LOAD.format("head.weight", "int8") + r"\)"),
    (torch.int8, "head.weight", -FLOAT32_MAX, WOULD_NOT_LOAD.format("head.weight", "int8") + r"\)"),
])
def test_unstorable_dtypes_and_weights_are_refused_before_anything_is_written(dtype, tensor, value, message,
                                                                              tmp_path):
    """Save refuses whatever load_checkpoint would refuse, naming the tensor, and writes nothing."""
    model, card = _small_model("vit-mhsa")
    if tensor is not None:
        with torch.no_grad():
            model.state_dict()[tensor].view(-1)[0] = value
    with pytest.raises(ValueError, match=message):
        save_checkpoint(model, tmp_path / "out" / "bad", card, dtype=dtype)
    assert not (tmp_path / "out").exists()


def test_a_card_that_does_not_fit_the_model_is_refused_before_anything_is_written(tmp_path):
    model, card = _small_model("vit-mhsa")
    card.model_args = {**card.model_args, "dim": 16}
    with pytest.raises(CheckpointError, match=r"not saved, as load_checkpoint would refuse it: bad.safetensors: "
                                              r"weights do not fit 'convnn_vit_cifar' .*mis-shaped"):
        save_checkpoint(model, tmp_path / "out" / "bad", card, dtype=torch.float16)
    assert not (tmp_path / "out").exists()


def test_measure_sees_the_stored_weights_before_any_file_is_written(tmp_path):
    """save_checkpoint(measure=...): the measured model holds exactly what load_checkpoint later returns; the card
    written afterwards carries its metrics, the saved model's (card) ones kept with _before_quantization."""
    model, card = _small_model("vit-mhsa")
    card.metrics = {"test_top1": 50.0, "test_loss": 1.0, "epochs": 3}
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    seen = []

    def measure(stored: nn.Module, stored_card: ModelCard) -> dict[str, float]:
        seen.append((stored(x), stored_card.weights_dtype, sorted(path.name for path in tmp_path.iterdir())))
        return {"test_top1": 40.0, "test_loss": 1.25}

    weights, _ = save_checkpoint(model, tmp_path / "q", card, dtype=torch.int8, measure=measure)
    loaded, loaded_card = load_checkpoint(weights)
    (logits, weights_dtype, files), = seen
    assert files == [] and weights_dtype == "int8"
    torch.testing.assert_close(logits, loaded(x), rtol=0, atol=0)
    assert loaded_card.metrics == card.metrics == {"test_top1": 40.0, "test_loss": 1.25, "epochs": 3,
                                                   "test_top1_before_quantization": 50.0,
                                                   "test_loss_before_quantization": 1.0}


def test_a_failed_measurement_writes_nothing(tmp_path):
    model, card = _small_model("vit-mhsa")

    def fail(stored: nn.Module, stored_card: ModelCard) -> dict[str, float]:
        raise RuntimeError("measurement failed")

    with pytest.raises(RuntimeError, match="measurement failed"):
        save_checkpoint(model, tmp_path / "out" / "m", card, dtype=torch.int8, measure=fail)
    assert not (tmp_path / "out").exists()


def test_write_false_measures_without_writing(tmp_path):
    """A float dtype keeps no _before_quantization metrics; write=False (a dry run, or a non-zero DDP rank)."""
    model, card = _small_model("vit-mhsa")
    card.metrics = {"test_top1": 50.0}
    save_checkpoint(model, tmp_path / "out" / "m", card, dtype=torch.float16, write=False,
                    measure=lambda stored, stored_card: {"test_top1": 1.0, "test_loss": 2.0})
    assert card.metrics == {"test_top1": 1.0, "test_loss": 2.0} and card.weights_dtype == "float16"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("make_model, dtype, message", [
    (nn.Identity, None, "no floating-point tensor"),
    (nn.Identity, torch.int8, "no floating-point tensor"),
    (lambda: nn.Linear(0, 3), torch.int8, r"weight: shape \(3, 0\) has no elements"),
    (lambda: nn.Linear(2, 2).double(), None, r"floating tensors are \['float64'\].*pass dtype"),
    (lambda: nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).half()), None, r"\['float16', 'float32'\]"),
])
@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")
def test_models_a_card_cannot_describe_are_refused_before_anything_is_written(make_model, dtype, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        save_checkpoint(make_model(), tmp_path / "out" / "bad", _card(), dtype=dtype)
    assert not (tmp_path / "out").exists()


def _rewrite(path, edit=lambda state: None, **card_fields) -> None:
    """Rewrite the checkpoint ``path`` (stem): ``edit`` its tensors, update its card, keep the sha256 matching."""
    weights, card_path = path.with_suffix(".safetensors"), path.with_suffix(".json")
    state = load_file(weights)
    edit(state)
    save_file(state, str(weights))
    card = json.loads(card_path.read_text())
    card.update(card_fields, weights_sha256=hashlib.sha256(weights.read_bytes()).hexdigest())
    card_path.write_text(json.dumps(card))


def test_exhaustive_layers_beyond_the_token_budget_are_refused_without_running(saved):
    """At 96 px the first stage's all-pairs selection would hold (96²)² fp32 scores (340 MB per image): over the
    token budget though within the activation budget; at 128 px (1 GB) the card's cost refuses it first."""
    _, path = saved
    _rewrite(path, input_size=64)  # N = 4096 = the limit: loads
    assert load_checkpoint(path)[1].input_size == 64
    _rewrite(path, input_size=96)
    with pytest.raises(CheckpointError, match=r"m.json: at input_size 96, layer .*knn \(selection='all'\) scores "
                                              r"all N = 9216 tokens .* more than the 4096 allowed"):
        load_checkpoint(path)
    _rewrite(path, input_size=128)
    with pytest.raises(CheckpointError, match=r"m.json: .* activation values per image at input_size 128"):
        load_checkpoint(path)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_int8_scales_are_refused(dtype, tmp_path):
    def to_float8(state: dict) -> None:
        key = "head.weight" + INT8_SCALE_SUFFIX
        state[key] = state[key].to(dtype)

    with pytest.raises(CheckpointError, match=r"1 scales not of shape \(C_out,\) or not float16, bfloat16, float32 or "
                                              r"float64 \(e.g. head.weight\)"):
        load_checkpoint(_rewrite_int8(tmp_path, to_float8))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_refused(value, saved):
    _, path = saved
    _rewrite(path, lambda state: state["head.bias"].fill_(value))
    with pytest.raises(CheckpointError, match=r"m.safetensors: 1 tensors hold an inf or NaN once loaded \(e.g. "
                                              r"head.bias, stored as torch.float32\)"):
        load_checkpoint(path)


@pytest.mark.parametrize("std", [[1e-300] * 3, [1e-7] * 3, [0.25, 0.25, float("nan")]])
def test_tiny_or_non_finite_std_is_refused(std, saved):
    _, path = saved
    _rewrite(path, std=std)
    with pytest.raises(CheckpointError, match="std must be 3 finite numbers, one per RGB channel, each ≥ 1e-06"):
        load_checkpoint(path)


def test_floating_tensors_must_be_stored_in_the_cards_dtype(tmp_path):
    weights, _ = save_checkpoint(create_model("convnn_resnet_cifar", **ARGS), tmp_path / "m", _card(),
                                 dtype=torch.float16)
    _rewrite(tmp_path / "m", weights_dtype="float32")
    with pytest.raises(CheckpointError, match=r"m.safetensors: the card says weights_dtype='float32', but \d+ "
                                              r"floating tensors are stored otherwise \(e.g. .*: torch.float16\)"):
        load_checkpoint(weights)


def _nested(levels: int) -> dict:
    """A JSON object nesting ``levels`` objects deep: {"a": {"a": ... {}}}."""
    value: dict = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("field, value, message", [
    ("std", [0.0, 0.0, 0.0], r"std must be 3 finite numbers, one per RGB channel, each ≥ 1e-06"),
    ("format_version", 2, r"format_version must be the integer 1"),
    ("recipe", _nested(20), r"the model card nests more than 16 levels deep"),
    ("weights_sha256", "ABC", None),  # save_checkpoint sets it: not the caller's to get wrong
])
def test_save_refuses_a_card_that_load_would_refuse(field, value, message, tmp_path):
    """The card is written as JSON and read back with load_checkpoint's checks before anything is written."""
    torch.manual_seed(0)
    model, card = create_model("convnn_resnet_cifar", **ARGS), _card()
    setattr(card, field, value)
    if message is None:
        save_checkpoint(model, tmp_path / "out" / "ok", card)
        assert load_checkpoint(tmp_path / "out" / "ok")[1].weights_sha256 == card.weights_sha256 != "ABC"
        return
    with pytest.raises(CheckpointError, match=r"^not saved, as load_checkpoint would refuse it: .*bad.json: "
                                              + message):
        save_checkpoint(model, tmp_path / "out" / "bad", card)
    assert not (tmp_path / "out").exists()


def test_numpy_and_torch_scalars_in_a_card_are_written_as_numbers(tmp_path):
    """A metric computed with numpy, and a measurement returned as 0-d tensors, become plain JSON numbers."""
    np = pytest.importorskip("numpy")
    model, card = _small_model("vit-mhsa")
    card.metrics = {"test_top1": np.float32(61.5), "test_loss": 1.5, "epochs": np.int64(3)}

    def measure(stored: nn.Module, stored_card: ModelCard) -> dict:
        return {"test_top1": torch.tensor(40.0), "test_loss": torch.tensor(1.25, dtype=torch.float64)}

    weights, card_path = save_checkpoint(model, tmp_path / "q", card, dtype=torch.int8, measure=measure)
    expected = {"test_top1": 40.0, "test_loss": 1.25, "epochs": 3, "test_top1_before_quantization": 61.5,
                "test_loss_before_quantization": 1.5}
    assert json.loads(card_path.read_text())["metrics"] == expected
    assert load_checkpoint(weights)[1].metrics == card.metrics == expected
    assert {key: type(card.metrics[key]) for key in expected} == {key: type(value) for key, value in expected.items()}


def _first_replace_fails(monkeypatch) -> None:
    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_module.os, "replace", fail)


@pytest.mark.parametrize("failure, error, message", [
    ("a metric JSON cannot hold", CheckpointError, r"q.json: the model card cannot be written as JSON \(a "
                                                   r"builtins.set is not a JSON value: \{1\}\)"),
    ("a measurement JSON cannot hold", CheckpointError, r"cannot be written as JSON \(a torch.Tensor is not a JSON "
                                                        r"value: tensor\(\[1., 2.\]\)\)"),
    ("renaming the files fails", OSError, "No space left on device"),
])
def test_a_failed_save_leaves_the_existing_checkpoint_as_it_was(failure, error, message, tmp_path, monkeypatch):
    """Overwriting a checkpoint is all or nothing: the old pair still loads, byte for byte, with no stray files."""
    model, card = _small_model("vit-mhsa")
    weights, _ = save_checkpoint(model, tmp_path / "q", card, dtype=torch.float16)
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    old_bias = model.head.bias.detach().half().float()
    with torch.no_grad():
        model.head.bias.add_(1)  # the new weights differ from the old
    new_card, measure = replace(card, metrics={"test_top1": 50.0}), None
    if failure == "a metric JSON cannot hold":
        new_card.metrics["epochs"] = {1}
    elif failure == "a measurement JSON cannot hold":
        measure = lambda stored, stored_card: {"test_top1": torch.tensor([1.0, 2.0])}  # noqa: E731
    else:
        _first_replace_fails(monkeypatch)
    with pytest.raises(error, match=message):
        save_checkpoint(model, tmp_path / "q", new_card, dtype=torch.float16, measure=measure)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before
    loaded, loaded_card = load_checkpoint(weights)
    assert loaded_card.metrics == {} and torch.equal(loaded.head.bias, old_bias)


@pytest.mark.parametrize("failure", ["a zero std", "a failed measurement", "a write that fails"])
def test_a_save_that_raises_leaves_the_callers_card_as_it_was(failure, tmp_path, monkeypatch):
    """The card passed in is set (name, dtype, sha256, metrics) only when the save succeeds."""
    model, card = _small_model("vit-mhsa")
    card.metrics = {"test_top1": 50.0}
    measure = None
    if failure == "a zero std":
        card.std = [0.0] * 3
    elif failure == "a failed measurement":
        def measure(stored: nn.Module, stored_card: ModelCard) -> dict[str, float]:
            raise RuntimeError("measurement failed")
    else:
        _first_replace_fails(monkeypatch)
    unchanged = replace(card, metrics=dict(card.metrics))
    with pytest.raises((ValueError, RuntimeError, OSError)):
        save_checkpoint(model, tmp_path / "other", card, dtype=torch.int8, measure=measure)
    assert card == unchanged and (card.name, card.weights_dtype, card.weights_sha256) == ("vit-mhsa", "float32", "")


def test_the_class_count_must_be_the_models_number_of_logits(saved, tmp_path):
    """model_args without num_classes: only running the model (on the meta device) shows it gives 10 logits."""
    model, path = saved
    message = r"m.json: the card names 2 classes, but the model built from it outputs \(1, 10\) for one image"
    card = _card()
    card.classes = ["a", "b"]
    with pytest.raises(CheckpointError, match=r"^not saved, as load_checkpoint would refuse it: .*" + message):
        save_checkpoint(model, tmp_path / "out" / "m", card)
    assert not (tmp_path / "out").exists()
    _rewrite(path, classes=["a", "b"])
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


@pytest.mark.parametrize("model_args, message", [
    ({"widths": [1536] * 3, "depths": [1, 1, 1]}, "would have 188,868,115 parameters and buffers at input_size 32"),
    ({"widths": [30000] * 3, "depths": [1, 1, 1]}, "would have 72,002,430,019 parameters and buffers"),
    ({"widths": [64, 128, 176], "depths": [1000] * 3}, "would have 1,033,135,117 parameters and buffers"),  # 55 s
    ({"widths": [2, 2, 2], "depths": [5000] * 3}, "would have 210,026 modules at input_size 32, more than the 2,000"),
    ({"widths": [16], "depths": [1], "num_neighbors": 1024, "input_size": 128}, "activation values per image at "
                                                                                 "input_size 128"),
    ({"widths": [8] * 3, "depths": ["1000"] * 3}, r"depths must be an integer in \[0, ∞\], got '1000'"),
], ids=["wide", "wider", "deep", "many-modules", "activations", "not-a-number"])
def test_a_card_asking_for_a_huge_model_is_refused_before_anything_is_built(model_args, message, tmp_path,
                                                                           monkeypatch):
    """A few hundred bytes of card could ask for gigabytes, or a minute of building: its cost is computed from the
    card's arguments (convnn.models.cost) and refused before any module exists, even on the meta device."""
    weights = tmp_path / "evil.safetensors"
    save_file({"x": torch.zeros(1)}, str(weights))
    card, model_args = _card(), dict(model_args)
    card.input_size = model_args.pop("input_size", card.input_size)
    card.model_args = {"branch_ratio": 0.5, **model_args}
    card.weights_sha256 = hashlib.sha256(weights.read_bytes()).hexdigest()
    (tmp_path / "evil.json").write_text(card.to_json(), encoding="utf-8")
    devices, create_model_ = [], budget.create_model

    def meta_only(name, **model_args):
        devices.append(torch.get_default_device().type)
        if devices[-1] != "meta":
            raise AssertionError(f"{name} built on {devices[-1]} before its size was checked")
        return create_model_(name, **model_args)

    monkeypatch.setattr(budget, "create_model", meta_only)
    monkeypatch.setattr(torch.nn.Module, "__init__", lambda *_: pytest.fail("a module was built"))
    with pytest.raises(CheckpointError, match=rf"evil.json: .*{message}"):
        load_checkpoint(weights)
    assert devices == []


@pytest.mark.parametrize("preset", ["imagenet-resnet50-hybrid", "imagenet-vit-b16-convnn"])
def test_the_largest_presets_fit_the_parameter_budget(preset):
    """ResNet-50 (31.3 M) and ViT-B/16 (86.8 M) at 224 px pass the meta-device checks, without being built."""
    fields = PRESETS[preset]
    card = ModelCard(name=preset, model=fields["model"], model_args=fields["model_args"],
                     classes=[str(c) for c in range(1000)], input_size=224, mean=[0.5] * 3, std=[0.25] * 3)
    budget.check_model(card, preset)
    card.classes = card.classes[:10]
    with pytest.raises(CheckpointError, match=r"names 10 classes, but the model built from it outputs \(1, 1000\)"):
        budget.check_model(card, preset)


@pytest.mark.parametrize("input_size", [64, 30])
def test_an_input_size_a_model_without_exhaustive_layers_cannot_take_is_refused(input_size, tmp_path):
    """An MHSA ViT built for 32 px (no ConvNN layer): its card may not claim another input size."""
    model, card = _small_model("vit-mhsa")
    message = rf"the model does not run on a {input_size}×{input_size} input \(input_size\): input must be 32×32"
    with pytest.raises(CheckpointError, match=message):
        save_checkpoint(model, tmp_path / "out" / "v", replace(card, input_size=input_size))
    assert not (tmp_path / "out").exists()
    save_checkpoint(model, tmp_path / "v", card)
    _rewrite(tmp_path / "v", input_size=input_size)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path / "v")


class _TiedNet(nn.Module):
    """Two convolutions sharing one weight (as a model that ties its embeddings), then a linear head."""

    def __init__(self, num_classes: int = 10, candidate_seed: int = 0) -> None:
        super().__init__()
        self.first, self.second = nn.Conv2d(3, 3, 3, padding=1), nn.Conv2d(3, 3, 3, padding=1)
        self.second.weight = self.first.weight
        self.head = nn.Linear(3, num_classes)

    def forward(self, x):
        return self.head(self.second(self.first(x)).mean((2, 3)))


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.float16, torch.int8])
def test_tied_weights_are_stored_once_and_tied_again_on_load(tmp_path, monkeypatch, dtype):
    """A model whose modules share a weight saves (safetensors alone refuses shared tensors), stores it once, and
    loads back tied: the same logits as stored in fp32 / as-is, within rounding in fp16 and int8."""
    from convnn.models import registry

    monkeypatch.setitem(registry._MODELS, "tied_net", _TiedNet)
    torch.manual_seed(0)
    model = _TiedNet().eval()
    card = ModelCard(name="t", model="tied_net", model_args={}, classes=[str(c) for c in range(10)], input_size=8,
                     mean=[0.5] * 3, std=[0.25] * 3)
    weights, _ = save_checkpoint(model, tmp_path / "t", card, dtype)
    assert "second.weight" not in load_file(weights)  # stored once
    loaded, _ = load_checkpoint(tmp_path / "t")
    assert loaded.second.weight is loaded.first.weight
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        if dtype in (None, torch.float32):
            torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
        else:
            change = (loaded(x) - model(x)).abs().max() / model(x).abs().max()
            assert change < INT8_LOGIT_TOL


class _CountingNet(nn.Module):
    """A linear head with an integer buffer of the bias's shape, so that a tie between the two differs in dtype only."""

    def __init__(self, num_classes: int = 10, candidate_seed: int = 0) -> None:
        super().__init__()
        self.head = nn.Linear(3, num_classes)
        self.register_buffer("counts", torch.zeros(num_classes, dtype=torch.int64))

    def forward(self, x):
        return self.head(x.mean((2, 3)))


def _tie(path, aliases: str, *left_out: str) -> None:
    """Rewrite the checkpoint ``path``: its tensors ``left_out``, ``aliases`` (JSON text) as its tied names."""
    weights, card_path = path.with_suffix(".safetensors"), path.with_suffix(".json")
    state = {name: tensor for name, tensor in load_file(weights).items() if name not in left_out}
    save_file(state, str(weights), metadata={checkpoint_module.ALIASES_KEY: aliases})
    card = json.loads(card_path.read_text())
    card_path.write_text(json.dumps(card | {"weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}))


@pytest.mark.parametrize(("model", "aliases", "left_out", "message"), [
    ("resnet", {"head.bias": "stem.1.weight"}, ["head.bias"],
     r"the tied-weight alias 'head\.bias' → 'stem\.1\.weight' ties tensors of different shapes or dtypes: the model "
     r"holds \(10,\) float32 and \(8,\) float32$"),
    ("counting", {"counts": "head.bias"}, ["counts"],
     r"the tied-weight alias 'counts' → 'head\.bias' ties tensors of different shapes or dtypes: the model holds "
     r"\(10,\) int64 and \(10,\) float32$"),
    ("counting", {"head.bias": "counts"}, ["head.bias"],
     r"the tied-weight alias 'head\.bias' → 'counts' ties tensors of different shapes or dtypes: the model holds "
     r"\(10,\) float32 and \(10,\) int64$"),
    ("resnet-int8", {"head.bias": "head.weight::scale"}, ["head.bias"],
     r"the tied-weight alias 'head\.bias' → 'head\.weight::scale' must tie a tensor the file leaves out to one it "
     r"stores$"),
    ("resnet", {"head.bias": "head.weight"}, [],  # head.bias is stored
     r"the tied-weight alias 'head\.bias' → 'head\.weight' must tie a tensor the file leaves out to one it stores$"),
    ("resnet", "[" * 100_000, ["head.bias"], r"the tied-weight aliases are not readable JSON \(RecursionError"),
    ("resnet", "{", ["head.bias"], r"the tied-weight aliases are not readable JSON \(JSONDecodeError"),
    ("resnet", ["head.bias"], ["head.bias"], "the tied-weight aliases must be a JSON object of tensor names"),
], ids=["shape", "int alias of a float", "float alias of an int", "int8 scale", "stored twice", "nested", "not JSON",
        "a list"])
def test_tied_weight_aliases_the_model_cannot_hold_are_refused_naming_them(saved, tmp_path, monkeypatch, model,
                                                                          aliases, left_out, message):
    """A crafted "tied" entry — an alias of another shape (a bias of the wrong shape), an integer buffer tied to a
    float weight or the reverse (which loaded, cast), an int8 scale, JSON nested 100,000 deep (RecursionError) —
    failed with Gradio's generic "upstream app raised an exception" instead of a CheckpointError."""
    from convnn.models import registry

    resnet, path = saved
    if model == "resnet-int8":
        save_checkpoint(resnet, path, _card(), dtype=torch.int8)
    if model == "counting":
        monkeypatch.setitem(registry._MODELS, "counting_net", _CountingNet)
        card = ModelCard(name="c", model="counting_net", model_args={}, classes=[str(c) for c in range(10)],
                         input_size=8, mean=[0.5] * 3, std=[0.25] * 3)
        path = tmp_path / "c"
        save_checkpoint(_CountingNet(), path, card)
    _tie(path, aliases if isinstance(aliases, str) else json.dumps(aliases), *left_out)
    with pytest.raises(CheckpointError, match=f"^{path.name}\\.safetensors: {message}"):
        load_checkpoint(path)
