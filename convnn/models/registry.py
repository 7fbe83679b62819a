"""Model registry: names → constructors (timm-style ``register_model`` / ``create_model``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from .cost import ModelCost

__all__ = ["create_model", "list_models", "model_cost", "register_model"]

_MODELS: dict[str, Callable[..., nn.Module]] = {}
_COSTS: dict[str, Callable[..., ModelCost]] = {}


def register_model(fn: Callable[..., nn.Module] | None = None, *, cost: Callable[..., ModelCost] | None = None,
                   name: str | None = None):
    """Decorator: register ``fn`` under its ``__name__`` as a model constructor taking keyword arguments.

    The registry is the allow-list of what a model card may build: a card names a registered model, never an import
    path.

    Args:
        fn (Callable): the constructor (``@register_model``), or None (``@register_model(cost=...)``).
        cost (Callable, optional): ``cost(input_size, **model_args) -> ModelCost``, what the model costs without
            building it (:mod:`convnn.models.cost`); :func:`model_cost` answers from it, so a card can be refused
            before any module is built. Default: None (the model's cost is only known once built)
        name (str, optional): the name cards use, e.g. ``"torchvision.models.resnet18"``. Default: ``fn.__name__``
    """
    def register(constructor: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        key = name or constructor.__name__
        if key in _MODELS:
            raise ValueError(f"model {key!r} is already registered")
        _MODELS[key] = constructor
        if cost is not None:
            _COSTS[key] = cost
        return constructor
    return register if fn is None else register(fn)


def model_cost(name: str, input_size: int, /, **model_args) -> ModelCost | None:
    """What the registered model ``name`` with ``model_args`` costs at ``input_size``² pixels, without building it.

    Returns:
        ModelCost or None: None when the model was registered without a cost function.

    Raises:
        ValueError: unknown ``name``, or an argument the cost function refuses (a size that is not an integer…).
        TypeError: an argument the cost function does not take.
    """
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {list_models()}")
    if name not in _COSTS:
        return None
    _check_arguments(name, _COSTS[name], model_args)
    return _COSTS[name](input_size, **model_args)


def _check_arguments(name: str, fn: Callable, model_args: dict) -> None:
    """Raise ``TypeError`` naming the model, not an internal function, for arguments ``fn`` does not take."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(model_args) - set(params))
    if unknown:
        taken = sorted(p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY)
        raise TypeError(f"model {name!r} takes no argument {', '.join(map(repr, unknown))}; it takes {taken}")


def list_models() -> list[str]:
    """Sorted names of the registered models."""
    return sorted(_MODELS)


def create_model(name: str, /, **model_args) -> nn.Module:
    """Build the registered model ``name`` with ``model_args`` (check :func:`model_cost` first for untrusted arguments).

    Raises:
        ValueError: unknown ``name`` (the message lists the known ones).
        TypeError: an argument the constructor does not take.
    """
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {list_models()}")
    return _MODELS[name](**model_args)
