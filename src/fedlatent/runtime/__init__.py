"""Adapters to other engines (Flower's simulation and deployments). They import the engine,
never a named model. The transport interface and the in-process runtime are the engine's:
``fl.Runtime`` and ``fl.InProcessRuntime``."""

from ..engine.protocol.runtime import Runtime
from ..engine.transport.inprocess import InProcessRuntime

__all__ = ["InProcessRuntime", "Runtime"]
