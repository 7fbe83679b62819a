"""Run by ``torchrun`` in test_train.py: train, then each rank saves the weights it ended with. Several runs, their
arguments separated by ``---``, train one after the other in the same two processes (each start imports torch)."""

import itertools
import os
import sys

import torch
from torch.distributed import distributed_c10d

from convnn.train import parse_config, train

if __name__ == "__main__":
    runs = [list(args) for separator, args in itertools.groupby(sys.argv[1:], lambda arg: arg == "---")
            if not separator]
    for number, argv in enumerate(runs):
        # train() makes the process group and destroys it, which resets torch's count of groups: the next run's
        # group would take the same name, read the keys the last one left in torchrun's store and wait on the old
        # addresses. Each run's group gets a name of its own.
        distributed_c10d._world.group_count = 1000 * number
        config = parse_config(argv)
        model, _ = train(config)
        torch.save(model.state_dict(), os.path.join(config.out, f"rank{os.environ['RANK']}.pt"))
