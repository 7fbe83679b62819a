"""Train many presets at once on one machine: ``python -m convnn.zoo``, a small queue over the visible GPUs.

Each job is ``PRESET`` or ``PRESET:SEED``; jobs start in the order given, at most ``--jobs-per-gpu`` at a time on
each GPU (small CIFAR models leave an H200 mostly idle, so several share one), each as its own
``python -m convnn.train`` process with ``CUDA_VISIBLE_DEVICES`` set. Example (the CIFAR zoo, seed 0)::

    python -m convnn.zoo --jobs cnn-l0.5 cnn-l0 vit-mhsa vit-convnn16 --jobs-per-gpu 3 \\
        --out runs -- --data-root ../shared/data/cifar10 --lite

Arguments after ``--`` go to every job. Each job's console output goes to ``OUT/NAME.out``; a job still running at
``--deadline`` seconds is stopped and reported. The exit status is 0 only when every job finished.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger("convnn.zoo")


@dataclass
class Job:
    """One training run: a preset, a seed, and once started its process and GPU."""

    preset: str
    seed: int | None
    process: subprocess.Popen | None = None
    gpu: int | None = None
    started: float = 0.0

    @property
    def name(self) -> str:
        return self.preset if self.seed is None else f"{self.preset}-s{self.seed}"


def parse_job(text: str) -> Job:
    """``"cnn-l0.5"`` or ``"cnn-l0.5:2"`` → a job (seed 0 keeps the preset's plain name)."""
    preset, _, seed = text.partition(":")
    return Job(preset, int(seed) if seed and int(seed) != 0 else None)


def device_ids(num_gpus: int, visible: str | None) -> list[str]:
    """What each job's ``CUDA_VISIBLE_DEVICES`` names for GPUs 0 … num_gpus − 1: the entries of the parent's
    ``visible`` list when it names exactly that many devices, else the indices (an unset or empty variable names
    none: it must not hide the GPU from the jobs)."""
    named = [entry.strip() for entry in (visible or "").split(",") if entry.strip()]
    return named if len(named) == num_gpus else [str(gpu) for gpu in range(num_gpus)]


def run_jobs(jobs: list[Job], num_gpus: int, jobs_per_gpu: int, out: Path, extra: list[str],
             deadline: float) -> dict[str, str]:
    """Run ``jobs`` over ``num_gpus`` GPUs (0 = CPU, one at a time); returns name → "ok" / "failed (rc)" / ...."""
    out.mkdir(parents=True, exist_ok=True)
    pending, running, status = list(jobs), [], {}
    slots = {gpu: jobs_per_gpu for gpu in range(max(num_gpus, 1))}
    devices = device_ids(num_gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    start = time.monotonic()
    while pending or running:
        for job in list(running):
            code = job.process.poll()
            if code is not None:
                running.remove(job)
                slots[job.gpu] += 1
                status[job.name] = "ok" if code == 0 else f"failed (exit {code})"
                log.info("%s: %s after %.0fs", job.name, status[job.name], time.monotonic() - job.started)
        while pending and max(slots.values()) > 0:
            gpu = max(slots, key=slots.get)
            job = pending.pop(0)
            command = [sys.executable, "-m", "convnn.train", "--preset", job.preset, "--out", str(out), *extra]
            if job.seed is not None:
                command += ["--seed", str(job.seed)]
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices[gpu]} if num_gpus else dict(os.environ)
            with (out / f"{job.name}.out").open("w") as console:
                job.process = subprocess.Popen(command, env=env, stdout=console, stderr=subprocess.STDOUT)
            job.gpu, job.started = gpu, time.monotonic()
            slots[gpu] -= 1
            running.append(job)
            log.info("%s: started on %s", job.name, f"GPU {gpu}" if num_gpus else "CPU")
        if time.monotonic() - start > deadline:
            for job in running:
                job.process.terminate()
                status[job.name] = "stopped at the deadline"
            for job in pending:
                status[job.name] = "not started"
            break
        time.sleep(1)
    return status


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m convnn.zoo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", nargs="+", required=True, help="PRESET or PRESET:SEED, in start order")
    parser.add_argument("--jobs-per-gpu", type=int, default=2)
    parser.add_argument("--out", default="runs")
    parser.add_argument("--deadline", type=float, default=float("inf"), help="seconds before running jobs stop")
    args = parser.parse_args(own)
    status = run_jobs([parse_job(text) for text in args.jobs], torch.cuda.device_count(), args.jobs_per_gpu,
                      Path(args.out), extra, args.deadline)
    for name, state in status.items():
        log.info("%-28s %s", name, state)
    sys.exit(0 if all(state == "ok" for state in status.values()) else 1)


if __name__ == "__main__":
    main()
