"""Random candidates across a model (METHOD §3, convnn.candidates): own seeds per layer, per-sample eval draws."""

import itertools
import math

import numpy as np
import pytest
import torch

from convnn import candidates as candidates_module
from convnn import create_model, record_neighbors
from convnn.candidates import candidate_draw, keyed_candidates, sample_keys, splitmix64
from convnn.data import normalize
from convnn.functional import sample_candidates

VIT_RANDOM = dict(dim=32, depth=6, num_heads=2, attention="convnn", num_neighbors=9, selection="random",
                  num_candidates=32)  # 64 patches + CLS = 65 tokens, r = 32
CNN_RANDOM = dict(widths=[8, 16], depths=[1, 0], num_neighbors=4, selection="random", num_candidates=12)


def _candidates(model, x) -> dict[str, torch.Tensor]:
    """Each random layer's recorded candidates for one forward call on ``x``: name → (B or 1, r)."""
    with torch.no_grad(), record_neighbors(model) as records:
        model(x)
    return {name: calls[0].candidates for name, calls in records.items() if calls and calls[0].candidates is not None}


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name, args", [("convnn_vit_cifar", VIT_RANDOM), ("convnn_resnet_cifar", CNN_RANDOM)])
def test_two_random_layers_of_one_model_draw_different_candidates(name, args, mode):
    model = create_model(name, **args).train(mode == "train")
    drawn = _candidates(model, torch.randn(2, 3, 32, 32))
    assert len(drawn) >= 2
    for (first, a), (second, b) in itertools.pairwise(drawn.items()):
        if a.shape == b.shape:  # layers of the same token count
            assert not torch.equal(a, b), (first, second)


@pytest.mark.parametrize("name, args", [("convnn_vit_cifar", VIT_RANDOM), ("convnn_resnet_cifar", CNN_RANDOM)])
def test_the_same_image_alone_and_inside_a_batch_gets_the_same_candidates(name, args):
    torch.manual_seed(0)
    model = create_model(name, **args).eval()
    batch = torch.randn(5, 3, 32, 32)
    together, alone = _candidates(model, batch), _candidates(model, batch[3:4])
    for layer, candidates in together.items():
        assert candidates.shape[0] == 5
        assert torch.equal(alone[layer][0], candidates[3]), layer
        assert not torch.equal(candidates[0], candidates[1]), layer  # another image, other candidates
    with torch.no_grad():
        torch.testing.assert_close(model(batch[3:4]), model(batch)[3:4], rtol=1e-5, atol=1e-5)


def test_a_vit_with_r_32_of_65_tokens_over_6_blocks_sees_the_tokens_the_draws_predict():
    """Each block draws 32 of the 65 tokens independently, so a token is missed by all 6 with (33/65)^6: the union
    covers ≈ 98.3 % of the tokens of an image (a draw shared by every block covered 32/65 ≈ 49 %)."""
    torch.manual_seed(1)
    model = create_model("convnn_vit_cifar", **VIT_RANDOM).eval()
    drawn = _candidates(model, torch.randn(64, 3, 32, 32))
    assert len(drawn) == 6
    covered = torch.zeros(64, 65, dtype=torch.bool)
    for candidates in drawn.values():
        covered.scatter_(1, candidates, True)
    expected = 1 - (33 / 65) ** 6
    # 64 × 65 token indicators, each Bernoulli(expected): the mean's std is ≈ 0.002.
    assert covered.float().mean().item() == pytest.approx(expected, abs=0.01)


def test_a_random_vit_is_not_blind_to_any_patch(monkeypatch):
    """Replacing one patch by noise moves the eval logits for nearly every patch, with the draws pinned to the clean
    image's (every image keyed as the clean one: a changed image's own key redraws every block, which moves the
    logits whatever the draws). A patch reaches the CLS token unless all 6 blocks miss it, (33/65)^6 ≈ 1.7 %: 62 of
    the 64 here; with one candidate set shared by every block, 31 of them."""
    torch.manual_seed(2)
    model = create_model("convnn_vit_cifar", **VIT_RANDOM).eval()
    image = torch.randn(1, 3, 32, 32)
    changed = image.repeat(64, 1, 1, 1)
    for patch in range(64):
        row, col = divmod(patch, 8)
        changed[patch, :, 4 * row:4 * row + 4, 4 * col:4 * col + 4] = torch.randn(3, 4, 4)
    clean_key = sample_keys(image)
    monkeypatch.setattr(candidates_module, "sample_keys", lambda x, draw=0: clean_key.repeat(x.shape[0]))
    with torch.no_grad():
        moved = (model(changed) - model(image)).abs().amax(1)
    assert (moved > 1e-4).sum() >= 60


def test_the_candidate_seed_is_a_model_argument_that_sets_every_layers_draws():
    x = torch.randn(2, 3, 32, 32)
    first, again = (_candidates(create_model("convnn_vit_cifar", **VIT_RANDOM, candidate_seed=7).eval(), x)
                    for _ in range(2))
    other = _candidates(create_model("convnn_vit_cifar", **VIT_RANDOM, candidate_seed=8).eval(), x)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not any(torch.equal(first[name], other[name]) for name in first)
    with pytest.raises(ValueError, match="candidate_seed"):
        create_model("convnn_vit_cifar", **VIT_RANDOM, seed=3)


def test_training_draws_advance_per_step_from_the_layers_stream():
    model = create_model("convnn_resnet_cifar", **CNN_RANDOM).train()
    x = torch.randn(2, 3, 32, 32)
    steps = [_candidates(model, x) for _ in range(2)]
    restarted = _candidates(create_model("convnn_resnet_cifar", **CNN_RANDOM).train(), x)
    for name in steps[0]:
        assert steps[0][name].shape == (1, 12)  # one draw shared by the batch
        assert not torch.equal(steps[0][name], steps[1][name])
        assert torch.equal(restarted[name], steps[0][name])


def test_keyed_draws_are_uniform_without_replacement():
    """Over 4000 keys each of 20 tokens is drawn r/N = 25 % of the time; no token twice in a row."""
    keys = sample_keys(torch.arange(4000, dtype=torch.float32).view(4000, 1))
    drawn = keyed_candidates(keys, 12345, num_tokens=20, num_candidates=5).numpy()
    assert all(len(set(row)) == 5 for row in drawn)
    frequency = np.bincount(drawn.ravel(), minlength=20) / 4000
    std = math.sqrt(0.25 * 0.75 / 4000)
    assert np.abs(frequency - 0.25).max() < 5 * std


def test_a_training_draw_is_the_r_smallest_of_n_uniform_numbers():
    """sample_candidates keeps r distinct keys per row: the r smallest of N uniform draws, in increasing order."""
    drawn = sample_candidates(1024, 32, 128, torch.Generator().manual_seed(3))
    uniforms = torch.rand(128, 1024, generator=torch.Generator().manual_seed(3))
    expected = np.argsort(uniforms.numpy(), axis=1, kind="stable")[:, :32]
    assert drawn.shape == (128, 32) and drawn.dtype == torch.int64
    assert np.array_equal(drawn.numpy(), expected)
    assert all(len(set(row)) == 32 for row in drawn.tolist())


# splitmix64 in numpy's uint64 (the reference the torch int64 version must match bit for bit)
_GAMMA, _MIX = np.uint64(0x9E3779B97F4A7C15), (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _splitmix64_reference(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x.astype(np.uint64) + _GAMMA
        x = (x ^ (x >> np.uint64(30))) * _MIX[0]
        x = (x ^ (x >> np.uint64(27))) * _MIX[1]
        return x ^ (x >> np.uint64(31))


def _keys_reference(x: torch.Tensor, draw: int) -> np.ndarray:
    """METHOD §3b's key, sample by sample in numpy uint64: Σ_i splitmix64(bits_i ^ splitmix64(i)), then
    splitmix64(digest + draw·γ)."""
    keys = []
    for row in x.reshape(x.shape[0], -1).numpy():
        bits = row.view(np.uint32).astype(np.uint64)
        mixed = _splitmix64_reference(bits ^ _splitmix64_reference(np.arange(len(bits), dtype=np.uint64)))
        with np.errstate(over="ignore"):
            digest = np.uint64(sum(int(v) for v in mixed) % 2**64)
            keys.append(_splitmix64_reference(np.array([digest + np.uint64(draw) * _GAMMA]))[0])
    return np.array(keys, dtype=np.uint64)


def test_splitmix64_on_int64_bit_patterns_is_the_uint64_function():
    """Defect it catches: a constant or a shift changed, or an arithmetic (sign-filling) shift for a logical one."""
    values = np.random.default_rng(0).integers(0, 2**64, 1000, dtype=np.uint64, endpoint=False)
    values[:4] = [0, 1, 2**63, 2**64 - 1]
    got = splitmix64(torch.from_numpy(values.view(np.int64))).numpy().view(np.uint64)
    assert np.array_equal(got, _splitmix64_reference(values))


@pytest.mark.parametrize("draw", [0, 3])
def test_sample_keys_are_the_position_keyed_sum_of_the_inputs_bits(draw):
    """The key of METHOD §3b, against a numpy uint64 reference; a swap of two values changes it (the sum is keyed
    on positions). Defect it catches: positions not mixed in, the draw ignored, a sum that saturates."""
    x = torch.randn(3, 3, 8, 8)
    assert np.array_equal(sample_keys(x, draw).numpy().view(np.uint64), _keys_reference(x, draw))
    swapped = x.clone()
    swapped[0, 0, 0, :2] = x[0, 0, 0, [1, 0]]
    assert sample_keys(swapped)[0] != sample_keys(x)[0] and sample_keys(swapped)[1] == sample_keys(x)[1]


def test_keyed_candidates_are_the_r_smallest_hash_values_of_a_numpy_reference():
    keys = sample_keys(torch.randn(6, 10))
    seed, num_tokens, r = 12345, 65, 32
    base = _splitmix64_reference(keys.numpy().view(np.uint64) ^ np.uint64(seed))
    with np.errstate(over="ignore"):
        values = _splitmix64_reference(base[:, None] + np.arange(num_tokens, dtype=np.uint64) * _GAMMA)
    expected = np.argsort(values.view(np.int64), axis=1, kind="stable")[:, :r]  # compared as int64 bit patterns
    assert np.array_equal(keyed_candidates(keys, seed, num_tokens, r).numpy(), expected)


def test_the_key_and_the_draw_compile_into_one_graph():
    """Torch operations only (no hashlib, no numpy): both trace with fullgraph=True and give the eager bits."""
    x = torch.randn(4, 3, 32, 32)
    keys = torch.compile(sample_keys, fullgraph=True, backend="eager")(x, 2)
    assert torch.equal(keys, sample_keys(x, 2))
    draw = torch.compile(keyed_candidates, fullgraph=True, backend="eager")(keys, 7, 65, 32)
    assert torch.equal(draw, keyed_candidates(keys, 7, 65, 32))


def test_normalize_gives_a_uint8_image_the_correctly_rounded_bits_on_every_device():
    """The table is (p/255 − mean)/std in float64 rounded once to float32, whatever the device (a CUDA division by
    255 multiplies by a reciprocal). Defect it catches: float32 arithmetic on the device."""
    images = torch.arange(256, dtype=torch.uint8).repeat(2, 3, 1).permute(0, 2, 1).reshape(2, 16, 16, 3)
    mean, std = (0.4914, 0.4822, 0.4465), (0.247, 0.2435, 0.2616)
    expected = ((images.permute(0, 3, 1, 2).numpy().astype(np.float64) / 255 - np.array(mean)[:, None, None])
                / np.array(std)[:, None, None]).astype(np.float32)
    assert np.array_equal(normalize(images, mean, std).numpy(), expected)
    if torch.cuda.is_available():
        assert torch.equal(normalize(images.cuda(), mean, std).cpu(), normalize(images, mean, std))


@pytest.mark.parametrize("name, args", [("convnn_vit_cifar", VIT_RANDOM), ("convnn_resnet_cifar", CNN_RANDOM)])
def test_each_draw_index_is_another_draw_and_a_batch_may_hold_several(name, args):
    """Draw 0 is the default; draw 1 draws other candidates; 16 copies of an image with draws 0 … 15 in one batch
    answer as the 16 draws one at a time. Defect it catches: the draw ignored, or applied to the wrong sample."""
    torch.manual_seed(3)
    model = create_model(name, **args).eval()
    image = torch.randn(1, 3, 32, 32)
    default = _candidates(model, image)
    with candidate_draw(0):
        assert all(torch.equal(c, default[n]) for n, c in _candidates(model, image).items())
    with candidate_draw(1):
        other = _candidates(model, image)
    assert not any(torch.equal(c, default[n]) for n, c in other.items())
    with torch.no_grad(), candidate_draw(torch.arange(16)):
        together = model(image.repeat(16, 1, 1, 1))
    for draw in (0, 1, 15):
        with torch.no_grad(), candidate_draw(draw):
            torch.testing.assert_close(together[draw:draw + 1], model(image), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="one per sample"), candidate_draw(torch.arange(3)):
        model(image)
    with pytest.raises(ValueError, match="draw"):
        candidate_draw(-1).__enter__()
