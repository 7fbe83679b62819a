"""Checkpoints: bit-exact round trip, fp16 storage, and clear errors for broken files."""

import json

import pytest
import torch

from convnn import CheckpointError, ModelCard, create_model, load_checkpoint, save_checkpoint

ARGS = {"widths": [8, 16], "depths": [1, 1], "branch_ratio": 0.5, "num_neighbors": 4}


def _card() -> ModelCard:
    return ModelCard(name="m", model="convnn_resnet_cifar", model_args=ARGS, classes=[str(c) for c in range(10)],
                     input_size=32, mean=[0.5] * 3, std=[0.25] * 3, metrics={"test_top1": 12.5})


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    model = create_model("convnn_resnet_cifar", **ARGS)
    model(torch.randn(4, 3, 32, 32))  # move the BatchNorm statistics off their initial values
    save_checkpoint(model, tmp_path / "m", _card())
    return model, tmp_path / "m"


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


@pytest.mark.parametrize("field, value, message", [
    ("classes", ["a", "b", "c"], "classes"),
    ("classes", ["cat"] * 10, "classes"),
    ("metrics", [1], "metrics"),
    ("mean", "abc", "mean"),
    ("std", [0.0, 0.0, 0.0], "std"),
    ("input_size", "32", "input_size"),
    ("input_size", 100000, "input_size"),
    ("model_args", [1], "model_args"),
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
