"""The model-agnostic federated-EM engine (docs/architecture.md, sections 1-3).

The engine owns the protocol: the transport interface (:class:`Runtime`) and the in-process
runtime, the client node, the round loop and its update, the one checked protocol for every other
exchange, the registry of models and the base estimator. It imports no model and no runtime
adapter.

Only what a client answers a message with is imported with the package (the client node, the
messages, the model contract, the registry, the privacy settings); the server's side (the round
loop and its update, checkpoints, the history, the exchange, the in-process runtime, the
federation settings) and the base estimator with scikit-learn's warning and error classes are
imported on first use (``from fedlatent.engine import X`` works for every X in ``__all__``), so a
Flower client process (one per message) imports neither scikit-learn nor the server loop.
"""

from fedlatent.engine.contract.model import ClientStep, FederatedModel, client_rng
from fedlatent.engine.contract.registry import model_from_config, register_estimator, register_model
from fedlatent.engine.node.client import ClientNode
from fedlatent.engine.privacy.disclosure import DisclosurePolicy
from fedlatent.engine.privacy.dp import DifferentialPrivacy
from fedlatent.engine.protocol.messages import ClientReplyError, check_reply
from fedlatent.engine.protocol.runtime import Runtime
from fedlatent.engine.stats import Stats

#: name -> the module of this package that defines it (imported on first use)
_LAZY = {
    "ConvergenceWarning": "fedlatent.engine.errors",
    "NotFittedError": "fedlatent.engine.errors",
    "FederatedEstimator": "fedlatent.engine.estimation.estimator",
    "FitContext": "fedlatent.engine.estimation.estimator",
    "Replies": "fedlatent.engine.protocol.exchange",
    "ask": "fedlatent.engine.protocol.exchange",
    "Federation": "fedlatent.engine.fedem.federation",
    "Quantizer": "fedlatent.engine.fedem.federation",
    "Spider": "fedlatent.engine.fedem.federation",
    "Squarem": "fedlatent.engine.fedem.acceleration",
    "SubspaceNewton": "fedlatent.engine.fedem.acceleration",
    "StepSchedule": "fedlatent.engine.fedem.federation",
    "History": "fedlatent.engine.fedem.history",
    "RoundRecord": "fedlatent.engine.fedem.history",
    "InProcessRuntime": "fedlatent.engine.transport.inprocess",
    "FederatedFitError": "fedlatent.engine.faults",
    "FitResult": "fedlatent.engine.rounds.loop",
    "LoopOptions": "fedlatent.engine.rounds.loop",
    "run_federated_em": "fedlatent.engine.rounds.loop",
    "SitePolicy": "fedlatent.engine.site.policy",
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
    "SitePolicy",
    "Spider",
    "Squarem",
    "Stats",
    "StepSchedule",
    "SubspaceNewton",
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

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
