"""Models: one module per model (its statistics, client step, server step, prediction).

The classes are imported on first use, so a process that needs one model (a Flower client
process, started afresh for every message) does not import the others.
"""

import importlib

_WHERE = {
    "FedGMM": "fedgmm", "FedGMMModel": "fedgmm", "PersonalizedFedGMM": "fedgmm",
    "FederatedGaussianMixture": "gmm", "GMMModel": "gmm",
    "HLCR": "hlcr", "HLCRModel": "hlcr",
    "SEC": "sec", "SECModel": "sec",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
