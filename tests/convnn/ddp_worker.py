"""Run by ``torchrun`` in test_train.py: train, then each rank saves the weights it ended with."""

import os
import sys

import torch

from convnn.train import parse_config, train

if __name__ == "__main__":
    config = parse_config(sys.argv[1:])
    model, _ = train(config)
    torch.save(model.state_dict(), os.path.join(config.out, f"rank{os.environ['RANK']}.pt"))
