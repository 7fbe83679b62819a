"""ConvNN layers: the 2-D layer, the hybrid branch layer, and the attention family."""

from .attention import ATTENTIONS, ConvNNAttention, KVTAttention, MultiheadSelfAttention, create_attention
from .convnn2d import ConvNN2d
from .hybrid import HybridConvNN2d

__all__ = [
    "ATTENTIONS",
    "ConvNN2d",
    "ConvNNAttention",
    "HybridConvNN2d",
    "KVTAttention",
    "MultiheadSelfAttention",
    "create_attention",
]
