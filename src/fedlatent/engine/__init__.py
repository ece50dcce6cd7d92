"""The model-agnostic federated-EM engine (DESIGN.md section 1)."""

from .client import ClientNode
from .federation import Federation, Quantizer, Spider, StepSchedule
from .history import History, RoundRecord
from .inprocess import InProcessRuntime
from .loop import ConvergenceWarning, FederatedFitError, FitResult, run_federated_em
from .messages import ClientReplyError, check_reply
from .model import ClientStep, FederatedModel, client_rng
from .registry import model_from_config, register_estimator, register_model
from .runtime import Runtime
from .stats import Stats

__all__ = [
    "ClientNode",
    "ClientReplyError",
    "ClientStep",
    "ConvergenceWarning",
    "FederatedFitError",
    "FederatedModel",
    "Federation",
    "FitResult",
    "History",
    "InProcessRuntime",
    "Quantizer",
    "RoundRecord",
    "Runtime",
    "Spider",
    "Stats",
    "StepSchedule",
    "check_reply",
    "client_rng",
    "model_from_config",
    "register_estimator",
    "register_model",
    "run_federated_em",
]
