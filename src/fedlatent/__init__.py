"""fedlatent: federated latent-variable models on one federated-EM engine.

>>> import fedlatent as fl
>>> fl.Federation(participation=0.5).participation
0.5
"""

from . import data as datasets  # noqa: F401  (fl.datasets.* generators, imported on first use)
from .data import FederatedDataset
from .engine import (
    ClientNode,
    DifferentialPrivacy,
    DisclosurePolicy,
    Federation,
    InProcessRuntime,
    Quantizer,
    Runtime,
    Spider,
    Squarem,
    StepSchedule,
    SubspaceNewton,
)

__version__ = "0.1.0"

# Estimators are listed by the registry (fl.FedGMM...), not here: see __getattr__ and __dir__.
__all__ = [
    "ClientNode",
    "ConvergenceWarning",
    "DifferentialPrivacy",
    "DisclosurePolicy",
    "NotFittedError",
    "FederatedDataset",
    "Federation",
    "InProcessRuntime",
    "Quantizer",
    "Runtime",
    "SitePolicy",
    "Spider",
    "Squarem",
    "StepSchedule",
    "SubspaceNewton",
    "__version__",
]


def _estimators() -> list[str]:
    from .engine.contract.registry import estimator_entries

    return sorted(e.cls.__name__ for e in estimator_entries().values())


def __getattr__(name: str):
    """Estimators (from the registry), ``fl.baselines`` and ``fl.experiments`` are imported on
    first use: a Flower client process (one per message) imports only what its model needs."""
    import importlib

    if name in ("experiments", "baselines"):
        return importlib.import_module(f".{name}", __name__)
    if name in ("ConvergenceWarning", "NotFittedError"):  # scikit-learn's, imported on first use
        return getattr(importlib.import_module(".engine.errors", __name__), name)
    if name == "SitePolicy":  # a site's own policy (engine/site), imported on first use
        return importlib.import_module(".engine.site.policy", __name__).SitePolicy
    if not name.startswith("_"):
        from .engine.contract.registry import estimator_by_class_name

        cls = estimator_by_class_name(name)
        if cls is not None:
            return cls
    raise AttributeError(f"module 'fedlatent' has no attribute {name!r}")


def __dir__():
    lazy = {"experiments", "baselines", "ConvergenceWarning", "NotFittedError", "SitePolicy"}
    return sorted(set(globals()) | set(_estimators()) | lazy)
