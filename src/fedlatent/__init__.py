"""fedlatent: federated latent-variable models on one federated-EM engine.

>>> import fedlatent as fl
>>> fl.Federation(participation=0.5).participation
0.5
"""

from . import data as datasets  # noqa: F401  (fl.datasets.* generators, imported on first use)
from .data import FederatedDataset
from .engine import ConvergenceWarning, Federation, Quantizer, Spider, StepSchedule

# Estimators and submodules are imported on first use: a Flower client process (one per message)
# then imports only what its model needs.
_LAZY = {"HLCR": "models", "SEC": "models", "FederatedGaussianMixture": "models",
         "FedGMM": "models"}

__version__ = "0.1.0"

__all__ = [
    "SEC",
    "HLCR",
    "ConvergenceWarning",
    "FedGMM",
    "FederatedDataset",
    "FederatedGaussianMixture",
    "Federation",
    "Quantizer",
    "Spider",
    "StepSchedule",
    "__version__",
]


def __getattr__(name: str):
    """Estimators, ``fl.baselines`` and ``fl.experiments`` are imported on first use."""
    import importlib

    if name in ("experiments", "baselines"):
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'fedlatent' has no attribute {name!r}")
