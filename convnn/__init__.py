"""ConvNN: convolution and attention as one k-nearest-neighbour aggregation (docs/method.md, cited as METHOD §N).

Layers (``ConvNN2d``, ``HybridConvNN2d``, ``ConvNNAttention``, ``KVTAttention``, ``MultiheadSelfAttention``),
models (``create_model``), ``convert`` (the ConvNN version of a model you have), checkpoints (``save_checkpoint`` /
``load_checkpoint``) and the neighbour recorder.
"""

from .checkpoint import CheckpointError, ModelCard, load_checkpoint, save_checkpoint
from .conversion import convert
from .layers import ConvNN2d, ConvNNAttention, HybridConvNN2d, KVTAttention, MultiheadSelfAttention
from .models import create_model, list_models
from .recording import NeighborRecord, record_neighbors

__all__ = [
    "CheckpointError",
    "ConvNN2d",
    "ConvNNAttention",
    "HybridConvNN2d",
    "KVTAttention",
    "ModelCard",
    "MultiheadSelfAttention",
    "NeighborRecord",
    "convert",
    "create_model",
    "list_models",
    "load_checkpoint",
    "record_neighbors",
    "save_checkpoint",
]
