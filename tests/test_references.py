"""Every reference to a name of this project in a docstring or a document resolves: the Sphinx roles of docstrings
(:func:`name`, :class:`module.Name`, :attr:`Name.field`, …), relative to the module, its class and its packages as
Sphinx looks them up, and each ``package.module.name`` in backticks, in docstrings, README.md and docs/*.md, imported
from the top. A name moved or renamed without its references fails here with the file and the reference."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("analysis", "convnn", "kernels", "server")
MODULES = tuple(path.stem for path in sorted(ROOT.glob("app*.py")))  # app, app_api, app_limits, …
ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):`~?(\.*[A-Za-z_][A-Za-z0-9_.]*)`")
DOTTED = re.compile(r"`+((?:" + "|".join(PACKAGES + MODULES) + r")(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`+")
FILES = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py")) + sorted(ROOT.glob("app*.py"))
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_MISSING = object()


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def lookup(obj: object, names: list[str]) -> object:
    """``obj.a.b…`` for ``names`` [a, b, …]; a dataclass field or an attribute its methods set counts as found."""
    for index, name in enumerate(names):
        found = getattr(obj, name, _MISSING)
        if found is _MISSING and isinstance(obj, type):
            fields = {field.name for field in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
            if name in fields or name in getattr(obj, "__annotations__", {}) or name in _instance_attributes(obj):
                return True if index == len(names) - 1 else _MISSING  # nothing further can be looked up there
        if found is _MISSING:
            return _MISSING
        obj = found
    return obj


def _instance_attributes(cls: type) -> set[str]:
    """The names ``self.<name> = …`` assigns in ``cls``'s own methods (its instances' attributes)."""
    try:
        source = Path(importlib.import_module(cls.__module__).__file__).read_text(encoding="utf-8")
    except (OSError, TypeError):
        return set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            targets = [target for item in ast.walk(node) if isinstance(item, (ast.Assign, ast.AnnAssign))
                       for target in (item.targets if isinstance(item, ast.Assign) else [item.target])]
            targets += [element for target in targets if isinstance(target, ast.Tuple) for element in target.elts]
            return {target.attr for target in targets if isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name) and target.value.id == "self"}
    return set()


def resolves_from_top(name: str) -> bool:
    """``name`` as an absolute ``package.module.attribute…`` path."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        return lookup(module, parts[split:]) is not _MISSING
    return False


def resolves_in(name: str, module: ModuleType, classes: list[type]) -> bool:
    """``name`` as a Sphinx role finds it: in the enclosing classes, the module, then each package above it, then
    from the top; a leading dot (``.select``) is relative to the module's own package."""
    if name.startswith("."):
        package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
        return resolves_from_top(f"{package}.{name.lstrip('.')}")
    parts = name.split(".")
    if any(lookup(scope, parts) is not _MISSING for scope in (*classes, module)):
        return True
    package = module.__name__
    while "." in package:
        package = package.rsplit(".", 1)[0]
        if resolves_from_top(f"{package}.{name}"):
            return True
    return resolves_from_top(name)


def docstring_references(path: Path) -> list[tuple[str, bool]]:
    """(reference, resolves) for each reference in the docstrings of ``path``."""
    module = importlib.import_module(module_name(path))
    found = []

    def visit(node: ast.AST, classes: list[type]) -> None:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False) or ""
            found.extend((ref, resolves_in(ref, module, classes)) for ref in ROLE.findall(doc))
            found.extend((ref, resolves_from_top(ref) or resolves_in(ref, module, classes))
                         for ref in DOTTED.findall(doc) if not ref.endswith(".py"))  # a file's name
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                scope = classes[0] if classes else module
                cls = getattr(scope, child.name, None)
                visit(child, [cls, *classes] if isinstance(cls, type) else classes)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, classes)

    visit(ast.parse(path.read_text(encoding="utf-8")), [])
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_docstring_reference_resolves(path):
    unresolved = sorted({ref for ref, ok in docstring_references(path) if not ok})
    assert not unresolved, f"{path.relative_to(ROOT)}: {unresolved}"


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_dotted_name_in_the_documents_resolves(path):
    names = {name for name in DOTTED.findall(path.read_text(encoding="utf-8")) if not name.endswith(".py")}
    unresolved = sorted(name for name in names if not resolves_from_top(name))
    assert not unresolved, f"{path.relative_to(ROOT)}: {unresolved}"


PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|json|js|css|sh|txt))(?:::[\w\[\]-]+)?`")


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_file_a_document_names_exists(path):
    """A file named in backticks with its folder (``tests/app/test_architecture.py::test_…``) is in the tree."""
    missing = sorted({name for name in PATH.findall(path.read_text(encoding="utf-8")) if not (ROOT / name).exists()})
    assert not missing, f"{path.relative_to(ROOT)}: {missing}"


def test_a_moved_name_is_caught():
    """The check itself: a reference to a name that is not there fails, one that is passes."""
    module = importlib.import_module("analysis")
    assert not resolves_in("analysis.probes.layer_query_key", module, [])
    assert not resolves_from_top("convnn.functional.blend_select")
    assert resolves_from_top("analysis.session.image_intake.MAX_IMAGE_SIDE_PX")
    assert resolves_in("ViewState", module, [])
    assert resolves_from_top("analysis.session.models.LoadedModel.card")  # a field
    assert not resolves_from_top("analysis.session.models.LoadedModel.card.anything")
    package = importlib.import_module("kernels.knn_triton")
    assert resolves_in(".select", package, []) and not resolves_in(".selection", package, [])
