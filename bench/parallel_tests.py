"""Run a test directory as several pytest processes at once, for the kernel tests on a fresh GPU machine.

    python bench/parallel_tests.py tests/kernels 8 LOGDIR

On a machine with an empty Triton cache, compiles are nearly all of ``tests/kernels``'s time (one process got
through 36 of its 184 tests in 260 s on the H200 machine) and Triton compiles one kernel at a time per process.
This collects the directory's test ids, deals them round-robin to N processes (each its own ``pytest -q`` with
its log in ``LOGDIR/tests_I.log``), waits, prints each process's last lines, and exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def collect_ids(target: str) -> list[str]:
    """The node ids ``pytest --collect-only -q`` lists for ``target``."""
    listing = subprocess.run([sys.executable, "-m", "pytest", target, "--collect-only", "-q"], capture_output=True,
                             text=True, check=False).stdout
    return [line for line in listing.splitlines() if "::" in line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="a test directory or file")
    parser.add_argument("processes", type=int, help="how many pytest processes")
    parser.add_argument("logdir", type=Path, help="where each process writes tests_I.log")
    args = parser.parse_args()
    ids = collect_ids(args.target)
    if not ids:
        print(f"no tests collected from {args.target}")
        return 1
    args.logdir.mkdir(parents=True, exist_ok=True)
    print(len(ids), "tests", flush=True)
    started = time.perf_counter()
    runs = []
    for rank in range(args.processes):
        log = (args.logdir / f"tests_{rank}.log").open("w")
        command = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "--durations=5",
                   *ids[rank::args.processes]]
        runs.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log))
    codes = [process.wait() for process, _ in runs]
    for _, log in runs:
        log.close()
    print("exit codes", codes, f"wall {time.perf_counter() - started:.0f} s", flush=True)
    for rank in range(args.processes):
        tail = (args.logdir / f"tests_{rank}.log").read_text().splitlines()[-3:]
        print(rank, " | ".join(tail), flush=True)
    return int(any(codes))


if __name__ == "__main__":
    sys.exit(main())
