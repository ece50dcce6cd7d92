"""Runtimes: in-process (default) and Flower adapters. Models never import a runtime."""

from .base import Runtime
from .inprocess import InProcessRuntime

__all__ = ["InProcessRuntime", "Runtime"]
