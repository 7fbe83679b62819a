"""Random candidate keys (METHOD §3, ``random``): which r tokens a query may pick from, reproducibly.

The rules, for every layer with ``selection="random"`` (:class:`~convnn.ConvNN2d`,
:class:`~convnn.ConvNNAttention`):

* **Each layer has its own seed.** A model derives it from one model seed (``candidate_seed``, a model argument,
  so the checkpoint's card stores it) and the layer's qualified module name (:func:`layer_seed`), through
  :func:`assign_candidate_seeds`, which every model of this library calls when it is built. Two random layers of
  one model therefore never share their draws. A layer built on its own keeps the ``seed`` it was given.
* **Training mode draws from a stream.** Each forward call draws anew from the layer's own CPU generator, seeded
  with the layer's seed: one draw of r shared by the batch (``candidate_sampling="batch"``, as the paper) or one per
  sample (``"sample"``). The generators' states belong to a training run's resume state
  (:func:`candidate_states`, :func:`load_candidate_states`), so a resumed run draws what it would have drawn.
* **Eval mode draws per sample, from the sample itself.** Each sample gets a 64-bit key hashed from the bytes of its
  model input (:func:`sample_keys`), computed once at the model input by the hook :func:`assign_candidate_seeds`
  installs on the model; each layer draws that sample's r candidates from (layer seed, sample key) with a
  counter-based hash (:func:`keyed_candidates`). So the same image gets the same candidates, hence the same output,
  alone or inside any batch and on any device (for a bit-identical input), while different layers and different
  images get different candidates. A layer called outside such a model keys on its own input.

``r ≥ N`` means every token is a candidate (no draw).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from contextvars import ContextVar

import numpy as np
import torch
from torch import Tensor, nn

from .functional import sample_candidates
from .selection import SelectionRule
from .validation import SEED_RANGE, check_choice, check_int, derive_seed

__all__ = [
    "CANDIDATE_SAMPLINGS",
    "CandidateSampler",
    "assign_candidate_seeds",
    "candidate_states",
    "keyed_candidates",
    "keyed_draws",
    "layer_seed",
    "load_candidate_states",
    "sample_keys",
]

CANDIDATE_SAMPLINGS = ("batch", "sample")
# splitmix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014): the increment is
# 2**64 / golden ratio, then two xor-shift-multiply rounds; a bijection of the 64-bit integers with good avalanche.
_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_1, _MIX_2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_KEY_BYTES = 8  # sample keys are 64-bit
# The per-sample keys of the model input currently running, innermost model last (one tuple per context, so
# threads and nested models never see each other's keys).
_KEY_STACK: ContextVar[tuple[np.ndarray | None, ...]] = ContextVar("convnn_sample_keys", default=())


def layer_seed(model_seed: int, name: str) -> int:
    """The seed of the random layer called ``name`` (its qualified module name) in a model seeded ``model_seed``.

    Args:
        model_seed (int): the model's ``candidate_seed``.
        name (str): ``model.named_modules()`` name, e.g. ``"stages.0.0.conv1.knn"``.

    Returns:
        int: in [0, 2**63 − 1]: :func:`convnn.validation.derive_seed` of ``(model_seed, name)``, the first 8 bytes
        of ``blake2b(f"{model_seed}/{name}")`` as an integer.
    """
    return derive_seed(model_seed, name)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's output function on uint64 values (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN_GAMMA
        x = (x ^ (x >> np.uint64(30))) * _MIX_1
        x = (x ^ (x >> np.uint64(27))) * _MIX_2
        return x ^ (x >> np.uint64(31))


def sample_keys(x: Tensor) -> np.ndarray:
    """One 64-bit key per sample of a batch: a hash of the sample's bytes (dtype, shape and values).

    Args:
        x (Tensor): (B, ...) any dtype and device (copied to the CPU).

    Returns:
        np.ndarray: (B,) uint64; equal for bit-identical samples whatever the batch or the device.
    """
    rows = x.detach().to("cpu").contiguous().reshape(x.shape[0], -1)
    data = rows.view(torch.uint8).numpy() if rows.numel() else np.zeros((x.shape[0], 0), np.uint8)
    header = f"{x.dtype}{tuple(x.shape[1:])}".encode()
    keys = [hashlib.blake2b(header + row.tobytes(), digest_size=_KEY_BYTES).digest() for row in data]
    return np.frombuffer(b"".join(keys), dtype="<u8").astype(np.uint64)


def keyed_candidates(keys: np.ndarray, seed: int, num_tokens: int, num_candidates: int) -> Tensor:
    """Draw r of N tokens per sample, uniformly without replacement, as a function of (seed, sample key) alone.

    Token ``j`` of sample ``b`` gets the value ``splitmix64(splitmix64(seed ^ keys[b]) + j·γ)`` (γ the golden
    gamma); the candidates are the r tokens with the smallest values, in increasing order of value. The values of
    one sample are distinct (the map is a bijection), so every r-subset is equally likely.

    Args:
        keys (np.ndarray): (B,) uint64 sample keys (:func:`sample_keys`).
        seed (int): the layer's seed, in [0, 2**63 − 1].
        num_tokens (int): N.
        num_candidates (int): r, 1 ≤ r ≤ N.

    Returns:
        Tensor: (B, r) int64 token indices on the CPU, distinct within a row.
    """
    base = _splitmix64(np.asarray(keys, dtype=np.uint64) ^ np.uint64(seed))  # (B,)
    with np.errstate(over="ignore"):
        counters = base[:, None] + np.arange(num_tokens, dtype=np.uint64)[None, :] * _GOLDEN_GAMMA
    values = _splitmix64(counters)  # (B, N), distinct within a row
    chosen = np.argpartition(values, num_candidates - 1, axis=1)[:, :num_candidates]
    order = np.take_along_axis(values, chosen, axis=1).argsort(axis=1)
    return torch.from_numpy(np.take_along_axis(chosen, order, axis=1).astype(np.int64))


class CandidateSampler:
    """The candidate draws of one layer (module docstring): a training stream, keyed draws in eval mode.

    Args:
        num_candidates (int, optional): r; None: every key is a candidate.
        candidate_sampling (str): training draws, ``"batch"`` (one shared by the batch) or ``"sample"`` (one per
            sample).
        seed (int): the layer's seed, in [0, 2**63 − 1].

    Raises:
        ValueError: a bad ``candidate_sampling`` or ``seed``.
    """

    def __init__(self, num_candidates: int | None, candidate_sampling: str, seed: int) -> None:
        check_choice("candidate_sampling", candidate_sampling, CANDIDATE_SAMPLINGS)
        self.num_candidates, self.candidate_sampling = num_candidates, candidate_sampling
        self.reseed(seed)

    @classmethod
    def for_rule(cls, rule: SelectionRule, num_candidates: int | None, num_neighbors: int, candidate_sampling: str,
                 seed: int) -> CandidateSampler:
        """The sampler of a layer selecting by ``rule``: it draws only for a rule that reads ``num_candidates``
        (``"random"``), which needs ``num_candidates ≥ K``.

        Raises:
            ValueError: such a rule without an integer ``num_candidates ≥ num_neighbors``, or a bad
                ``candidate_sampling`` or ``seed``.
        """
        if "num_candidates" not in rule.reads:
            return cls(None, candidate_sampling, seed)
        if num_candidates is None:
            raise ValueError(f"selection={rule.name!r} needs num_candidates ≥ num_neighbors = {num_neighbors}, "
                             "got None")
        check_int("num_candidates", num_candidates, num_neighbors)
        return cls(num_candidates, candidate_sampling, seed)

    @property
    def draws(self) -> bool:
        """Whether this layer draws candidates at all (``num_candidates`` set)."""
        return self.num_candidates is not None

    def reseed(self, seed: int) -> None:
        """Set the layer's seed and restart its training stream from it.

        Raises:
            ValueError: ``seed`` outside [0, 2**63 − 1].
        """
        check_int("seed", seed, *SEED_RANGE)
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, x: Tensor, num_tokens: int, training: bool) -> Tensor | None:
        """The candidates of one forward call of a layer whose input is ``x`` (B samples of N tokens).

        Returns:
            Tensor or None: (1 or B, r) int64 on the CPU, where the kernels check them without a device sync
            (:func:`kernels.knn_aggregate` moves them to ``x``'s device without blocking); None when every key is
            a candidate (r ≥ N).
        """
        if self.num_candidates is None or self.num_candidates >= num_tokens:
            return None
        batch = x.shape[0]
        if training:
            draws = batch if self.candidate_sampling == "sample" else 1
            return sample_candidates(num_tokens, self.num_candidates, draws, self.generator)
        stack = _KEY_STACK.get()
        keys = stack[-1] if stack and stack[-1] is not None and len(stack[-1]) == batch else sample_keys(x)
        return keyed_candidates(keys, self.seed, num_tokens, self.num_candidates)


@contextlib.contextmanager
def keyed_draws(keys: np.ndarray) -> Iterator[None]:
    """Inside the block, a layer called in eval mode draws as it does inside a model whose input had these sample
    keys (:func:`sample_keys`), e.g. to run one layer again on the input it saw inside the model.

    Args:
        keys (np.ndarray): (B,) uint64, one per sample of the batch the layer is called on.
    """
    token = _KEY_STACK.set((*_KEY_STACK.get(), keys))
    try:
        yield
    finally:
        _KEY_STACK.reset(token)


def _samplers(model: nn.Module) -> Iterator[tuple[str, CandidateSampler]]:
    for name, module in model.named_modules():
        sampler = getattr(module, "_sampler", None)
        if isinstance(sampler, CandidateSampler):
            yield name, sampler


def _push_sample_keys(model: nn.Module, args: tuple) -> None:
    """Forward pre-hook of a model: the per-sample keys of its input, for its layers' eval draws."""
    x = args[0] if args else None
    real = isinstance(x, Tensor) and x.dim() > 0 and x.device.type != "meta"
    _KEY_STACK.set((*_KEY_STACK.get(), sample_keys(x) if real and not model.training else None))


def _pop_sample_keys(model: nn.Module, args: tuple, output: object) -> None:
    """Forward hook of a model (always called, also when the forward raises): drop its input's keys."""
    _KEY_STACK.set(_KEY_STACK.get()[:-1])


def assign_candidate_seeds(model: nn.Module, candidate_seed: int) -> nn.Module:
    """Give every random-candidate layer of ``model`` its own seed and key its eval draws on the model input.

    Each layer's seed becomes :func:`layer_seed` ``(candidate_seed, name)`` (its training stream restarts from it),
    and hooks on ``model`` compute the per-sample keys of the model's input once per forward call in eval mode
    (module docstring; only models with a layer that draws get the hooks). The library's models call this when they
    are built; call it on your own model to give it the same semantics. Calling it again re-seeds; the hooks are
    installed once.

    Args:
        model (nn.Module): any module containing ConvNN layers.
        candidate_seed (int): the model seed, in [0, 2**63 − 1].

    Returns:
        nn.Module: ``model`` itself.

    Raises:
        ValueError: ``candidate_seed`` outside [0, 2**63 − 1].
    """
    check_int("candidate_seed", candidate_seed, *SEED_RANGE)
    samplers = list(_samplers(model))
    for name, sampler in samplers:
        sampler.reseed(layer_seed(candidate_seed, name))
    if any(sampler.draws for _, sampler in samplers) and not getattr(model, "_keys_candidates", False):
        model.register_forward_pre_hook(_push_sample_keys)
        model.register_forward_hook(_pop_sample_keys, always_call=True)
        model._keys_candidates = True
    return model


def candidate_states(model: nn.Module) -> dict[str, Tensor]:
    """The training-stream state of every layer of ``model`` that draws candidates, for a resume file.

    Returns:
        dict[str, Tensor]: qualified layer name → its generator's state (uint8 tensor).
    """
    return {name: sampler.generator.get_state() for name, sampler in _samplers(model) if sampler.draws}


def load_candidate_states(model: nn.Module, states: dict[str, Tensor]) -> None:
    """Restore what :func:`candidate_states` returned, so the training streams continue where they were.

    Raises:
        ValueError: the layers that draw candidates are not exactly those of ``states`` (names listed).
    """
    samplers = {name: sampler for name, sampler in _samplers(model) if sampler.draws}
    if samplers.keys() != states.keys():
        raise ValueError(f"candidate states are for layers {sorted(states)}, but the model's random layers are "
                         f"{sorted(samplers)}")
    for name, state in states.items():
        samplers[name].generator.set_state(state)
