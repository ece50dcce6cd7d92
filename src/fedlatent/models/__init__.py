"""Models: one module (or small package) per model, each registering itself.

The estimators are found through the engine's registry (:mod:`fedlatent.engine.contract.registry`),
so a process that needs one model (a Flower client process, started afresh for every message)
imports only that model's module, and adding a model adds a module without editing this one.
"""

from __future__ import annotations


def __getattr__(name: str):
    from ..engine.contract.registry import estimator_by_class_name

    cls = estimator_by_class_name(name)
    if cls is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return cls


def __dir__():
    from ..engine.contract.registry import estimator_entries

    return sorted(set(globals()) | {e.cls.__name__ for e in estimator_entries().values()})
