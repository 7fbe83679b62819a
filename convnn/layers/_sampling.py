"""Reproducible random candidate draws shared by the ConvNN layers (METHOD §3, ``random``)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..functional import sample_candidates
from ._validation import SEED_RANGE, check_choice, check_int

CANDIDATE_SAMPLINGS = ("batch", "sample")


class CandidateSampler:
    """Draws r candidate keys per call from a generator owned by the layer.

    In training mode each call advances the generator; in eval mode each call redraws from ``seed``, so an eval
    model returns the same output every time (METHOD §3). ``num_candidates=None`` or ``r ≥ N`` means every key.

    Args:
        num_candidates (int, optional): r.
        candidate_sampling (str): ``"batch"`` (one draw shared by the batch) or ``"sample"`` (one per sample).
        seed (int): generator seed.
    """

    def __init__(self, num_candidates: int | None, candidate_sampling: str, seed: int) -> None:
        check_choice("candidate_sampling", candidate_sampling, CANDIDATE_SAMPLINGS)
        check_int("seed", seed, *SEED_RANGE)
        self.num_candidates, self.candidate_sampling, self.seed = num_candidates, candidate_sampling, seed
        self._generator = torch.Generator().manual_seed(seed)

    @classmethod
    def for_selection(cls, selection: str, num_candidates: int | None, num_neighbors: int, candidate_sampling: str,
                      seed: int) -> CandidateSampler:
        """The sampler of a layer: draws only for ``selection="random"``, which needs ``num_candidates ≥ K``.

        Raises:
            ValueError: ``selection="random"`` without an integer ``num_candidates ≥ num_neighbors``, or a bad
                ``candidate_sampling`` or ``seed``.
        """
        if selection != "random":
            return cls(None, candidate_sampling, seed)
        if num_candidates is None:
            raise ValueError(f"selection='random' needs num_candidates ≥ num_neighbors = {num_neighbors}, got None")
        check_int("num_candidates", num_candidates, num_neighbors)
        return cls(num_candidates, candidate_sampling, seed)

    def __call__(self, num_tokens: int, batch_size: int, device, training: bool) -> Tensor | None:
        """(1 or B, r) int64 candidate keys, or None when every key is a candidate."""
        if self.num_candidates is None or self.num_candidates >= num_tokens:
            return None
        generator = self._generator if training else torch.Generator().manual_seed(self.seed)
        draws = batch_size if self.candidate_sampling == "sample" else 1
        return sample_candidates(num_tokens, self.num_candidates, draws, generator, device)
