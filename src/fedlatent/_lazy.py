"""Package attributes imported on first use (PEP 562): a process imports only what it uses."""

from __future__ import annotations

import importlib


def lazy_attributes(package: str, where: dict[str, str]):
    """``(__getattr__, __dir__)`` for ``package``: ``name`` comes from ``package.<where[name]>``."""

    def __getattr__(name: str):
        if name in where:
            return getattr(importlib.import_module(f".{where[name]}", package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        mod = importlib.import_module(package)
        return sorted(set(vars(mod)) | set(where))

    return __getattr__, __dir__
