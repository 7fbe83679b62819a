"""Model registry: names → constructors (timm-style ``register_model`` / ``create_model``)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

__all__ = ["create_model", "list_models", "register_model"]

_MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Decorator: register ``fn`` under its ``__name__`` as a model constructor taking keyword arguments."""
    if fn.__name__ in _MODELS:
        raise ValueError(f"model {fn.__name__!r} is already registered")
    _MODELS[fn.__name__] = fn
    return fn


def list_models() -> list[str]:
    """Sorted names of the registered models."""
    return sorted(_MODELS)


def create_model(name: str, **model_args) -> nn.Module:
    """Build the registered model ``name`` with ``model_args``.

    Raises:
        ValueError: unknown ``name`` (the message lists the known ones).
        TypeError: an argument the constructor does not take.
    """
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {list_models()}")
    return _MODELS[name](**model_args)
