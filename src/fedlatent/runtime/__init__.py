"""Adapters to other engines (Flower's simulation and deployments). They import the engine,
never a named model. The transport interface and the in-process runtime are the engine's:
``fl.Runtime`` and ``fl.InProcessRuntime``."""

from ..engine.inprocess import InProcessRuntime
from ..engine.runtime import Runtime

__all__ = ["InProcessRuntime", "Runtime"]
