"""Models: one module per model (its statistics, client step, server step, prediction).

The classes are imported on first use, so a process that needs one model (a Flower client
process, started afresh for every message) does not import the others.
"""

from .._lazy import lazy_attributes

_WHERE = {
    "FedGMM": "fedgmm", "FedGMMModel": "fedgmm", "PersonalizedFedGMM": "fedgmm",
    "FederatedGaussianMixture": "gmm", "GMMModel": "gmm",
    "HLCR": "hlcr", "HLCRModel": "hlcr",
    "SEC": "sec", "SECModel": "sec",
}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE)
