"""ConvNN k-nearest-neighbour aggregation: the PyTorch reference, the fused Triton kernel, and the dispatch."""

from .dispatch import BACKEND_ENV_VAR, BACKENDS, knn_aggregate, resolve_backend, triton_available, use_backend
from .reference import SIMILARITIES, WEIGHTINGS, KnnResult, knn_aggregate_reference
from .usage import record_backends

__all__ = [
    "BACKENDS",
    "BACKEND_ENV_VAR",
    "SIMILARITIES",
    "WEIGHTINGS",
    "KnnResult",
    "knn_aggregate",
    "knn_aggregate_reference",
    "record_backends",
    "resolve_backend",
    "triton_available",
    "use_backend",
]
