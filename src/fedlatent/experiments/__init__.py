"""Reproductions of the papers' tables and figures. Each returns a DataFrame and writes plots.

Every experiment is a function taking ``quick`` (a small size that runs in tests), ``out`` (where
plots go) and ``random_state``.

Experiments are found, not listed: every module of this package names its experiment functions
in its ``__all__`` (names there that do not take ``quick``, ``out`` and ``random_state`` are
helpers, not experiments), and the first line of each function's docstring describes it. Adding
``experiments/<name>.py`` adds its experiments to :func:`available`, to ``fl.experiments.NAME``
and to ``fedlatent experiment``, with no edit here. The modules are read without being imported
(their source is parsed), and imported on first use of one of their experiments.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import sys
import types
from functools import cache
from pathlib import Path

_CONTRACT = frozenset({"quick", "out", "random_state"})


def _first_line(doc: str | None) -> str:
    lines = inspect.cleandoc(doc or "").splitlines()
    return lines[0].strip() if lines else ""


def _from_source(path: str) -> dict[str, str] | None:
    """``{experiment: description}`` of a module's source; None when its ``__all__`` is not a
    literal list of names each defined in the module (then the module is imported)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    names = None
    functions: dict[str, ast.FunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = node
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            if isinstance(node, ast.AugAssign) or node.value is None:
                return None
            try:
                names = list(ast.literal_eval(node.value))
            except ValueError:
                return None
    if names is None or any(n not in functions for n in names):
        return None
    found = {}
    for n in names:
        a = functions[n].args
        params = {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
        if _CONTRACT <= params:
            found[n] = _first_line(ast.get_docstring(functions[n]))
    return found


def _from_import(module: str) -> dict[str, str]:
    mod = importlib.import_module(module)
    found = {}
    for n in getattr(mod, "__all__", ()):
        fn = getattr(mod, n, None)
        if callable(fn) and _CONTRACT <= set(inspect.signature(fn).parameters):
            found[n] = _first_line(inspect.getdoc(fn))
    return found


@cache
def _index() -> dict[str, tuple[str, str]]:
    """``{experiment: (module, description)}``, sorted by name."""
    index: dict[str, tuple[str, str]] = {}
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        spec = importlib.util.find_spec(info.name)
        origin = getattr(spec, "origin", None)
        found = None
        if origin and origin.endswith(".py"):
            found = _from_source(origin)
        if found is None:
            found = _from_import(info.name)
        for n, description in found.items():
            if n in index:
                raise ImportError(f"experiment {n!r} is defined in both {index[n][0]} and "
                                  f"{info.name}")
            index[n] = (info.name, description)
    return dict(sorted(index.items()))


def available() -> dict[str, str]:
    """Every experiment: ``{name: one-line description}``, sorted by name."""
    return {n: description for n, (_, description) in _index().items()}


__all__ = ["available", *_index()]


def __getattr__(name: str):
    entry = _index().get(name)
    if entry is None:
        if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}"):
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    fn = getattr(importlib.import_module(entry[0]), name)
    globals()[name] = fn
    return fn


def __dir__():
    return sorted(set(globals()) | set(_index()))


class _Package(types.ModuleType):
    """Keeps ``fl.experiments.NAME`` the experiment when a module has the same name as one of
    its experiments (``fedem_toy``): importing the module binds it on the package, and this puts
    the function there instead, as an eager ``from .fedem_toy import fedem_toy`` did."""

    def __setattr__(self, name, value):
        if (isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}"
                and _index().get(name, ("",))[0] == value.__name__):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
