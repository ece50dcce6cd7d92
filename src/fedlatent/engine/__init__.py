"""The model-agnostic federated-EM engine (DESIGN.md sections 1 and 3).

The engine owns the protocol: the transport interface (:class:`Runtime`) and the in-process
runtime, the client node, the round loop and its update, the one checked protocol for every other
exchange, the registry of models and the base estimator. It imports no model and no runtime
adapter.

The base estimator and scikit-learn's warning and error classes are imported on first use, so a
Flower client process (one per message) does not import scikit-learn.
"""

from .client import ClientNode
from .exchange import Replies, ask
from .federation import Federation, Quantizer, Spider, StepSchedule
from .history import History, RoundRecord
from .inprocess import InProcessRuntime
from .loop import FederatedFitError, FitResult, LoopOptions, run_federated_em
from .messages import ClientReplyError, check_reply
from .model import ClientStep, FederatedModel, client_rng
from .privacy.disclosure import DisclosurePolicy
from .privacy.dp import DifferentialPrivacy
from .registry import model_from_config, register_estimator, register_model
from .runtime import Runtime
from .stats import Stats

_LAZY = {
    "ConvergenceWarning": "errors",
    "NotFittedError": "errors",
    "FederatedEstimator": "estimator",
    "FitContext": "estimator",
}

__all__ = [
    "ClientNode",
    "ClientReplyError",
    "ClientStep",
    "DisclosurePolicy",
    "DifferentialPrivacy",
    "ConvergenceWarning",
    "FederatedEstimator",
    "FederatedFitError",
    "FederatedModel",
    "Federation",
    "FitContext",
    "FitResult",
    "History",
    "InProcessRuntime",
    "LoopOptions",
    "NotFittedError",
    "Quantizer",
    "Replies",
    "RoundRecord",
    "Runtime",
    "Spider",
    "Stats",
    "StepSchedule",
    "ask",
    "check_reply",
    "client_rng",
    "model_from_config",
    "register_estimator",
    "register_model",
    "run_federated_em",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
