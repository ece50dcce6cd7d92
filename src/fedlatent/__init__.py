"""fedlatent: federated latent-variable models on one federated-EM engine.

>>> import fedlatent as fl
>>> fl.Federation(participation=0.5).participation
0.5
"""

from . import baselines  # noqa: F401  (fl.baselines.*)
from . import data as datasets  # noqa: F401  (fl.datasets.* generators)
from .data import FederatedDataset
from .engine import ConvergenceWarning, Federation, Quantizer, Spider, StepSchedule
from .models import HLCR, SEC, FederatedGaussianMixture, FedGMM

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
    """``fl.experiments`` is imported on first use (it pulls in plotting and the paper setups)."""
    if name == "experiments":
        import importlib

        return importlib.import_module(".experiments", __name__)
    raise AttributeError(f"module 'fedlatent' has no attribute {name!r}")
