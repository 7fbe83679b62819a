"""Shared test settings: the repository root on sys.path, Triton's interpreter when there is no GPU."""

import os
import sys
from pathlib import Path

import torch

# The fused kernel runs in Triton's CPU interpreter where there is no GPU; it must be set before Triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
