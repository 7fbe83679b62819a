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
* **Eval mode draws per sample, from the sample itself** (METHOD §3b). Each sample gets a 64-bit
  key hashed from the bit patterns of its model input and a **draw index** (:func:`sample_keys`; draw 0 unless
  :func:`candidate_draw` says otherwise), computed once at the model input by the hook
  :func:`assign_candidate_seeds` installs on the model; each layer draws that sample's r candidates from (layer
  seed, sample key) with a counter-based hash (:func:`keyed_candidates`). Both are integer PyTorch operations
  (wrapping int64 arithmetic, a sum, ``topk``), so they are exact, independent of the device and of the order of
  the sum, and traceable; :func:`convnn.data.normalize` gives a uint8 image the same input bits on every device.
  So the same image gets the same candidates, hence the same output, alone or inside any batch and on any device,
  while different layers, images and draw indices get different candidates. A layer called outside such a model
  keys on its own input.

``r ≥ N`` means every token is a candidate (no draw).

**In a traced graph** (``torch.compile(fullgraph=True)``, ``torch.export``; METHOD §9) the same draws run as graph
ops: a training draw is the operator ``convnn::stream_candidates``, which draws from the layer's own generator when
the graph runs (so a compiled training run draws what an eager one draws); an eval draw's keys are computed in the
graph from the model input, pushed by the model's hook onto a plain list that the graph may mutate (a
``ContextVar`` may only be read there), and stay on the input's device. The draw index :func:`candidate_draw` sets
is read at trace time and guarded: a compiled model recompiles for a new index (or takes it as a graph input once
Dynamo sees it vary); an exported model keeps the index it was exported with.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterator
from contextvars import ContextVar

import torch
from torch import Tensor, nn

from .functional import sample_candidates
from .selection import SelectionRule
from .validation import SEED_RANGE, check_choice, check_int, derive_seed

__all__ = [
    "CANDIDATE_SAMPLINGS",
    "DRAW_SCHEME",
    "CandidateSampler",
    "assign_candidate_seeds",
    "candidate_draw",
    "candidate_states",
    "draws_candidates",
    "keyed_candidates",
    "keyed_draws",
    "layer_seed",
    "load_candidate_states",
    "sample_keys",
    "splitmix64",
    "stream_candidates",
]

CANDIDATE_SAMPLINGS = ("batch", "sample")
# The eval draw scheme (METHOD §3b), as a card records it: change the name whenever a draw would change.
DRAW_SCHEME = "input-bits-splitmix64/v2"
# splitmix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014): the increment is
# 2**64 / golden ratio, then two xor-shift-multiply rounds; a bijection of the 64-bit integers with good avalanche.
# PyTorch has no full uint64 arithmetic: the values are int64 tensors holding the same bit patterns (two's
# complement, wrapping add and multiply), and the constants are written as the int64 of their bits.
_GOLDEN_GAMMA, _MIX_1, _MIX_2 = (value - (1 << 64) for value in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9,
                                                                   0x94D049BB133111EB))
_BIT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # element size → same-width integer
# The per-sample keys of the model input currently running, innermost model last (one tuple per context, so
# threads and nested models never see each other's keys).
_KEY_STACK: ContextVar[tuple[torch.Tensor | None, ...]] = ContextVar("convnn_sample_keys", default=())
# The eval draw index of the model forwards in this context (candidate_draw): an int, or one per sample.
_DRAW: ContextVar[int | torch.Tensor] = ContextVar("convnn_eval_draw", default=0)
# The keys of the model inputs whose forward is being traced (torch.compile, torch.export), innermost last: a graph
# may push and pop a plain list but not set a ContextVar. Empty whenever no trace is running.
_TRACED_KEYS: list[torch.Tensor | None] = []
# Every sampler's training stream by its id, for the convnn::stream_candidates operator (module docstring).
_STREAMS: weakref.WeakValueDictionary[int, CandidateSampler] = weakref.WeakValueDictionary()
_STREAM_IDS = itertools.count()


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


def _shift_right(x: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 bit patterns (PyTorch's ``>>`` on int64 is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(x: Tensor) -> Tensor:
    """splitmix64's output function, elementwise, on 64-bit patterns held in an int64 tensor (wrapping arithmetic).

    Args:
        x (Tensor): any shape, int64, any device.

    Returns:
        Tensor: ``x``'s shape, int64: the bits of ``splitmix64(x as uint64)``, the same on every device (integer
        operations only). A bijection of the 64-bit patterns.
    """
    x = x + _GOLDEN_GAMMA
    x = (x ^ _shift_right(x, 30)) * _MIX_1
    x = (x ^ _shift_right(x, 27)) * _MIX_2
    return x ^ _shift_right(x, 31)


def sample_keys(x: Tensor, draw: int | Tensor = 0) -> Tensor:
    """One 64-bit key per sample and draw index: a hash of the sample's values, exact on every device (METHOD §3b).

    Each element's bit pattern ``b_i`` (its dtype's width, zero-extended) is mixed with its position,
    ``splitmix64(b_i ^ splitmix64(i))``; the sample's digest is the wrapping sum of those over the sample (integer
    addition: the same whatever the order or the device that sums), and draw ``d``'s key is
    ``splitmix64(digest + d·γ)``. Torch operations only, so it runs on ``x``'s device and inside a traced graph.

    Args:
        x (Tensor): (B, ...) any dtype whose elements are 1, 2, 4 or 8 bytes (a float32 model input), any device.
        draw (int or Tensor): the draw index, ≥ 0: one for the batch, or a (B,) int64 tensor, one per sample.
            Default: 0

    Returns:
        Tensor: (B,) int64 on ``x``'s device; equal for bit-identical samples and equal draws, whatever the batch
        or the device.

    Raises:
        ValueError: an element size without an integer view, or a ``draw`` that is negative or not one per sample.
    """
    rows = x.detach().reshape(x.shape[0], -1)
    width = rows.element_size()
    if width not in _BIT_VIEWS:
        raise ValueError(f"sample keys need elements of 1, 2, 4 or 8 bytes, got {x.dtype}")
    bits = rows.contiguous().view(_BIT_VIEWS[width]).to(torch.int64)
    if width < 8:
        bits = bits & ((1 << (8 * width)) - 1)
    positions = splitmix64(torch.arange(rows.shape[1], device=x.device))
    digest = splitmix64(bits ^ positions).sum(dim=1)
    return splitmix64(digest + _draw_index(draw, x.shape[0], x.device) * _GOLDEN_GAMMA)


def _draw_index(draw: int | Tensor, batch: int, device) -> Tensor:
    """``draw`` as an int64 tensor on ``device``: a scalar, or (B,) (module docstring; :func:`sample_keys`)."""
    if isinstance(draw, Tensor):
        if draw.shape != (batch,) or draw.dtype != torch.int64:
            raise ValueError(f"draw must be an int or a ({batch},) int64 tensor, one per sample, got {draw.dtype} "
                             f"{tuple(draw.shape)}")
        return draw.to(device)
    check_int("draw", draw, 0)
    return torch.tensor(draw, dtype=torch.int64, device=device)


def keyed_candidates(keys: Tensor, seed: int, num_tokens: int, num_candidates: int) -> Tensor:
    """Draw r of N tokens per sample, uniformly without replacement, as a function of (seed, sample key) alone.

    Token ``j`` of sample ``b`` gets the value ``splitmix64(splitmix64(seed ^ keys[b]) + j·γ)`` (γ the golden
    gamma; int64 bit patterns, compared as int64); the candidates are the r tokens with the smallest values, in
    increasing order of value. The values of one sample are distinct (the map is a bijection), so every r-subset is
    equally likely. Torch operations only (METHOD §3b).

    Args:
        keys (Tensor): (B,) int64 sample keys (:func:`sample_keys`), any device.
        seed (int): the layer's seed, in [0, 2**63 − 1].
        num_tokens (int): N.
        num_candidates (int): r, 1 ≤ r ≤ N.

    Returns:
        Tensor: (B, r) int64 token indices on ``keys``' device, distinct within a row.
    """
    base = splitmix64(keys ^ seed)  # (B,)
    counters = base[:, None] + torch.arange(num_tokens, device=keys.device)[None, :] * _GOLDEN_GAMMA
    return splitmix64(counters).topk(num_candidates, dim=1, largest=False).indices  # (B, r), values distinct


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
        self._register_stream()
        self.reseed(seed)

    def _register_stream(self) -> None:
        """Give this sampler its own id in the registry of :func:`stream_candidates` (also a copy: a deep copy
        or an unpickled sampler draws from its own generator, not the original's)."""
        self.stream_id = next(_STREAM_IDS)
        _STREAMS[self.stream_id] = self

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._register_stream()

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
            return stream_candidates(self.stream_id, num_tokens, self.num_candidates, draws)
        keys = _model_keys(batch)
        return keyed_candidates(_eval_keys(x) if keys is None else keys, self.seed, num_tokens, self.num_candidates)


def _model_keys(batch: int) -> Tensor | None:
    """The keys of the innermost model input running (traced first, then eager), if it has ``batch`` samples."""
    for stack in (_TRACED_KEYS, _KEY_STACK.get()):
        if stack:
            keys = stack[-1]
            return keys if keys is not None and len(keys) == batch else None
    return None


def _eval_keys(x: Tensor) -> Tensor:
    """The keys of ``x``'s samples for this context's draw index (:func:`candidate_draw`). Eager: on the CPU, where
    the layers draw their candidates (one (B,) copy per model call; the kernels check candidates without a sync);
    in a traced graph on ``x``'s device (no copy, no sync; the draws are the same integers)."""
    keys = sample_keys(x, _DRAW.get())
    return keys if torch.compiler.is_compiling() else keys.cpu()


@torch.library.custom_op("convnn::stream_candidates", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def stream_candidates(stream: int, num_tokens: int, num_candidates: int, draws: int) -> Tensor:
    """A training draw of the layer whose sampler has id ``stream`` (``CandidateSampler.stream_id``): the next
    :func:`convnn.functional.sample_candidates` of its generator, as an operator, so that a compiled graph draws
    from the layer's own stream when it runs (module docstring; METHOD §3, §9). Not pure: every call advances the
    stream (tagged ``nondeterministic_seeded``, so a graph neither merges nor recomputes calls).

    Args:
        stream (int): a live sampler's ``stream_id``.
        num_tokens (int): N.
        num_candidates (int): r, 1 ≤ r ≤ N.
        draws (int): 1 (one draw shared by the batch) or B (one per sample).

    Returns:
        Tensor: (draws, r) int64 on the CPU, distinct within a row.

    Raises:
        KeyError: no live sampler has id ``stream``.
    """
    return sample_candidates(num_tokens, num_candidates, draws, _STREAMS[stream].generator)


@stream_candidates.register_fake
def _stream_candidates_fake(stream: int, num_tokens: int, num_candidates: int, draws: int) -> Tensor:
    return torch.empty(draws, num_candidates, dtype=torch.int64)


@contextlib.contextmanager
def candidate_draw(draw: int | Tensor) -> Iterator[None]:
    """Inside the block, models and layers in eval mode draw their candidates with draw index ``draw``
    (:func:`sample_keys`; outside every such block: draw 0), e.g. to see how a random-candidate model's answer
    varies over draws, or to measure its accuracy over several (METHOD §3b).

    Args:
        draw (int or Tensor): ≥ 0, for every sample, or a (B,) int64 tensor, one per sample of each batch the
            models are called on inside the block.

    Raises:
        ValueError: a negative ``draw`` (a per-sample one of the wrong length raises when a model is called).
    """
    if not isinstance(draw, Tensor):
        check_int("draw", draw, 0)
    token = _DRAW.set(draw)
    try:
        yield
    finally:
        _DRAW.reset(token)


@contextlib.contextmanager
def keyed_draws(keys: Tensor) -> Iterator[None]:
    """Inside the block, a layer called in eval mode draws as it does inside a model whose input had these sample
    keys (:func:`sample_keys`), e.g. to run one layer again on the input it saw inside the model.

    Args:
        keys (Tensor): (B,) int64, one per sample of the batch the layer is called on.
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
    """Forward pre-hook of a model: the per-sample keys of its input, for its layers' eval draws (on the traced
    list inside a graph, else on this context's stack: module docstring)."""
    x = args[0] if args else None
    real = isinstance(x, Tensor) and x.dim() > 0 and x.device.type != "meta"
    if torch.compiler.is_compiling():
        _TRACED_KEYS.append(_eval_keys(x) if real and not model.training else None)
        return
    _KEY_STACK.set((*_KEY_STACK.get(), None))  # pushed first: the pop hook runs even when the keys raise
    if real and not model.training:
        _KEY_STACK.set((*_KEY_STACK.get()[:-1], _eval_keys(x)))


def _pop_sample_keys(model: nn.Module, args: tuple, output: object) -> None:
    """Forward hook of a model (always called, also when the forward raises): drop its input's keys."""
    if torch.compiler.is_compiling():
        _TRACED_KEYS.pop()
        return
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
    for name, sampler in _samplers(model):
        sampler.reseed(layer_seed(candidate_seed, name))
    if draws_candidates(model) and not getattr(model, "_keys_candidates", False):
        model.register_forward_pre_hook(_push_sample_keys)
        model.register_forward_hook(_pop_sample_keys, always_call=True)
        model._keys_candidates = True
    return model


def draws_candidates(model: nn.Module) -> bool:
    """Whether ``model`` has a layer that draws random candidates (r < N is then decided per input), so that its eval
    output depends on the draw index (:func:`candidate_draw`)."""
    return any(sampler.draws for _, sampler in _samplers(model))


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
