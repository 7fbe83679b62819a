"""A training run's resume file: weights, optimiser and every random stream of every rank, so that a resumed run
draws what the interrupted one would have drawn — bit for bit on a CPU, given the same number of processes.

The streams of one rank (:class:`RandomStreams`): torch's global generators (dropout, DropPath, Beta draws, data
loader workers), the loader's augmentation stream, the mixup/CutMix generator and each random layer's candidate
stream (:mod:`convnn.candidates`). The file is written atomically: a run stopped while writing keeps the last one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from .candidates import candidate_states, load_candidate_states

__all__ = ["RandomStreams", "load_resume", "save_resume"]

log = logging.getLogger("convnn.train")


@dataclass
class RandomStreams:
    """The random streams one rank of a run draws from, besides torch's global ones.

    Attributes:
        model (nn.Module): the model (its random layers' candidate streams).
        loader: the training loader, with ``rng_state()`` and ``load_rng_state()``.
        mix_generator (torch.Generator): mixup/CutMix's generator.
        device (torch.device): the run's device (its CUDA generator, if any).
    """

    model: nn.Module
    loader: object
    mix_generator: torch.Generator
    device: torch.device

    def state(self) -> dict:
        """Every stream's state, CPU tensors."""
        state = {"torch": torch.get_rng_state(), "mix": self.mix_generator.get_state(),
                 "loader": self.loader.rng_state(), "candidates": candidate_states(self.model)}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def load(self, state: dict) -> None:
        """Continue every stream from :meth:`state`'s ``state``."""
        torch.set_rng_state(state["torch"])
        if "cuda" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], self.device)
        self.mix_generator.set_state(state["mix"])
        self.loader.load_rng_state(state["loader"])
        load_candidate_states(self.model, state["candidates"])

    def of_every_rank(self) -> list[dict]:
        """:meth:`state` of every rank, in rank order (gathered to every rank; rank 0 saves them)."""
        state = self.state()
        if not dist.is_initialized():
            return [state]
        states: list = [None] * dist.get_world_size()
        dist.all_gather_object(states, state)
        return states


def save_resume(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, elapsed: float,
                streams: list[dict]) -> None:
    """Write the resume file of a run after ``epoch`` epochs and ``elapsed`` training seconds (rank 0 only), with
    ``streams`` = :meth:`RandomStreams.of_every_rank`; through a temporary file renamed into place."""
    partial = path.with_name(path.name + ".partial")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                "elapsed": elapsed, "rng": streams}, partial)
    os.replace(partial, path)


def load_resume(path: Path, optimizer: torch.optim.Optimizer, streams: RandomStreams, rank: int,
                world_size: int) -> tuple[int, float]:
    """Load a resume file into the model, the optimiser and this rank's random streams.

    A file written by another number of processes restores weights and optimiser but not the random streams
    (logged): the run continues, though not exactly as it would have.

    Returns:
        tuple[int, float]: epochs done and training seconds so far.
    """
    state = torch.load(path, map_location=streams.device, weights_only=True)
    streams.model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    saved = state.get("rng", [])
    if len(saved) == world_size:
        streams.load(_to_cpu(saved[rank]))
    elif rank == 0:
        log.warning("%s holds the random streams of %d processes, this run has %d: they start afresh, so the "
                    "resumed run is not the one that was interrupted", path.name, len(saved), world_size)
    return state["epoch"], state["elapsed"]


def _to_cpu(value):
    """Generator states must be CPU byte tensors (``torch.load`` maps them to the run's device)."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    return {key: _to_cpu(item) for key, item in value.items()} if isinstance(value, dict) else value
