"""Old names kept for one release: using one warns (a ``DeprecationWarning`` naming the new name) and then does
exactly what the new name does.

Up to version 0.1.0 :mod:`analysis` called a :class:`~convnn.introspect.LayerInfo` a "probe": the old names are
``LoadedModel.probes``, ``LoadedModel.probe(name)``, ``LoadedModel.first_probe``, ``LoadedModel(probes=…)``, the
function ``probe_module`` of :mod:`analysis.session.traces`, ``run_trace(probes=…)`` and the keyword ``probe=`` of
the public functions that take a layer info (:func:`~analysis.session.traces.query_cell`,
:func:`~analysis.session.traces.layer_label`, …).

* :func:`renamed_keywords`: a decorator passing a function's (or a class's constructor's) old keyword arguments on
  under their new names;
* :class:`RenamedAttribute`: a class's old attribute or method name, read as the new one;
* :func:`renamed_module_names`: a module's ``__getattr__`` for its old module-level names.
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["RenamedAttribute", "renamed_keywords", "renamed_module_names"]

T = TypeVar("T")


def _warn(old: str, new: str) -> None:
    """Warn that ``old`` is now ``new``, pointing at the line that used ``old`` (the caller's caller)."""
    warnings.warn(f"{old} is renamed {new}; the old name goes in the next release", DeprecationWarning, stacklevel=3)


def renamed_keywords(**renames: str) -> Callable[[T], T]:
    """Decorate a function, or a class (its ``__init__``), so that each old keyword argument of ``renames``
    (``old=new``) is passed on as the new one, with a ``DeprecationWarning``.

    Raises (from the decorated function):
        TypeError: both the old and the new keyword given.
    """

    def decorate(target: T) -> T:
        function = target.__init__ if isinstance(target, type) else target
        name = target.__qualname__

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            if kwargs and not renames.keys().isdisjoint(kwargs):
                for old, new in renames.items():
                    if old in kwargs:
                        if new in kwargs:
                            raise TypeError(f"{name}() got both {old}= and {new}=; give {new}= only")
                        _warn(f"{name}({old}=…)", f"{name}({new}=…)")
                        kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        if isinstance(target, type):
            target.__init__ = call
            return target
        return call

    return decorate


class RenamedAttribute:
    """A class attribute standing for an old attribute or method name: reading it on an instance warns and gives the
    new one (a method's old name gives the new bound method).

    Args:
        new (str): the new name, on the same class.
    """

    def __init__(self, new: str) -> None:
        self.new = new
        self.owner = ""
        self.old = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner, self.old = owner.__name__, name

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        _warn(f"{self.owner}.{self.old}", f"{self.owner}.{self.new}")
        return getattr(instance, self.new)


def renamed_module_names(module: str, **renames: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for the module called ``module``: each old name of ``renames`` (``old=new``)
    warns and gives the module's object of the new name; any other missing name raises ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name in renames:
            _warn(f"{module}.{name}", f"{module}.{renames[name]}")
            return getattr(sys.modules[module], renames[name])
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
