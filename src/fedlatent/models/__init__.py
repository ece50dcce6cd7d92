"""Models: one module per model (its statistics, client step, server step, prediction)."""

from .fedgmm import FedGMM, FedGMMModel, PersonalizedFedGMM
from .gmm import FederatedGaussianMixture, GMMModel
from .hlcr import HLCR, HLCRModel
from .sec import SEC, SECModel

__all__ = [
    "SEC",
    "FedGMM",
    "FedGMMModel",
    "FederatedGaussianMixture",
    "GMMModel",
    "HLCR",
    "HLCRModel",
    "PersonalizedFedGMM",
    "SECModel",
]
